"""The TrainingJob API: typed models, CRD generation, defaulting and validation.

The dataclasses in :mod:`.models` are the single source of truth. The CRD
(:mod:`.crd`), the API reference (``docs/api.md``) and the Python-side
validation used by ``cohort run --local`` are all derived from them.
This package is pure: it imports neither kopf nor the Kubernetes client.
"""

from .models import TrainingJobSpec, TrainingJobStatus
from .schema import ValidationError, parse, to_dict

__all__ = ["TrainingJobSpec", "TrainingJobStatus", "ValidationError", "parse", "to_dict"]
