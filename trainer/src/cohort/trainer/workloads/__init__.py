"""What to train: built-in models and datasets, user entry points, the Workload type."""

from .workload import Workload, build_workload

__all__ = ["Workload", "build_workload"]
