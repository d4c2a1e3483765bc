"""What to train: built-in models and datasets, user entry points, the Workload type.

Import the modules themselves (``workloads.workload``, ``workloads.models``):
this package imports nothing, so ``workloads.defaults`` needs no torch.
"""
