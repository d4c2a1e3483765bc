"""The TrainingJob API (``cohort.dev/v1alpha1``), shared by the operator and the trainer.

The dataclasses in :mod:`.models` are the single source of truth. From them
come the CRD (:mod:`.crd`, written by ``make crds``), the API reference
(``docs/api.md``), the admission rules' Python twins, and the trainer's typed,
validated config (:mod:`.jobconfig`). This package imports only the standard
library and PyYAML: neither torch, kopf nor the Kubernetes client.
"""

from .models import TrainingJobSpec, TrainingJobStatus
from .schema import ValidationError, parse, to_dict

__all__ = ["TrainingJobSpec", "TrainingJobStatus", "ValidationError", "parse", "to_dict"]
