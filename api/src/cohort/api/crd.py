"""Builds the TrainingJob CustomResourceDefinition from the models.

``make crds`` runs ``python -m cohort.api.generate``, which writes
the CRD to ``crds/`` and the Helm chart, and writes ``docs/api.md``. Never edit those files by hand.
"""

from __future__ import annotations

from typing import Any

from .models import (
    GROUP,
    JOB_NAME_MAX,
    JOB_NAME_PATTERN,
    KIND,
    PLURAL,
    VERSION,
    TrainingJobSpec,
    TrainingJobStatus,
)
from .schema import openapi_schema

SHORT_NAMES = ["tj"]
CATEGORIES = ["all", "cohort"]

# The root may read metadata.name in CEL; nothing else can check it at admission.
NAME_RULE = {
    "rule": f"self.metadata.name.matches('{JOB_NAME_PATTERN}') && size(self.metadata.name) <= {JOB_NAME_MAX}",
    "message": f"metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter) "
               f"of at most {JOB_NAME_MAX} characters: it names the job's Service and worker pods",
}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.replicas.summary",
     "description": "Ready/Desired workers"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Progress", "type": "number", "jsonPath": ".status.progress.percent",
     "description": "Percent of the optimizer steps done"},
    {"name": "ETA", "type": "integer", "jsonPath": ".status.progress.etaSeconds",
     "description": "Estimated seconds to the last step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.progress.tokensPerSecond",
     "description": "Global throughput in tokens (samples for models without sequences)"},
    {"name": "Goodput", "type": "number", "jsonPath": ".status.goodput.percent",
     "description": "Percent of the job's wall time that trained (status.goodput)"},
    {"name": "MFU", "type": "number", "jsonPath": ".status.progress.mfu", "priority": 1,
     "description": "Model FLOPs utilisation (GPU workers whose peak is known)"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    spec_schema = openapi_schema(TrainingJobSpec)  # no default: a job must say what it trains
    status_schema = openapi_schema(TrainingJobStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas.target",
                        "statusReplicasPath": ".status.replicas.active",
                        "labelSelectorPath": ".status.selector",
                    },
                },
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "TrainingJob runs elastic, fault-tolerant distributed PyTorch training.",
                    "x-kubernetes-validations": [NAME_RULE],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema,
                        "status": status_schema,
                    },
                    "required": ["spec"],
                }},
            }],
        },
    }
