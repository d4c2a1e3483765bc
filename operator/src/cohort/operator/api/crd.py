"""Builds the TrainingJob CustomResourceDefinition from the models.

``make crds`` runs ``python -m cohort.operator.api.generate``, which writes
the CRD to ``crds/``, the Helm chart and the trainer's package data, and
writes ``docs/api.md``. Never edit those files by hand.
"""

from __future__ import annotations

from typing import Any

from .models import GROUP, KIND, PLURAL, VERSION, TrainingJobSpec, TrainingJobStatus
from .schema import openapi_schema, to_dict

SHORT_NAMES = ["tj"]
CATEGORIES = ["all", "cohort"]

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.replicas.summary",
     "description": "Ready/Desired workers"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    spec_schema = openapi_schema(TrainingJobSpec)
    spec_schema["default"] = to_dict(TrainingJobSpec())
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
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema,
                        "status": status_schema,
                    },
                }},
            }],
        },
    }
