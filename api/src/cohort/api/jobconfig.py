"""The job config document (docs/contracts.md §1): what the operator writes, what the trainer reads.

The operator renders it from the stored TrainingJob, whose spec the API server
has already defaulted and validated; ``cohort run --local`` builds the same
document from a manifest. Either way the trainer parses the spec with the
same models the CRD was generated from, so it gets a typed, defaulted and
validated :class:`~cohort.api.models.TrainingJobSpec` and every default and
bound has one home.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .models import GROUP, KIND, VERSION, TrainingJobSpec
from .schema import ValidationError, parse, to_dict

API_VERSION = f"{GROUP}/{VERSION}"
CONFIG_KIND = "JobConfig"
METRICS_PORT = 9400
RDZV_PORT = 29400
# A membership authority (the operator, the local launcher) re-forms the same members after a false alarm at
# most this often per job, so a collective timeout that is always too short cannot keep a job re-forming
# (docs/contracts.md §3, Reports).
REFORM_INTERVAL_S = 30.0


@dataclass(frozen=True)
class JobConfig:
    """A parsed, defaulted and validated job config."""

    name: str
    namespace: str
    uid: str
    spec: TrainingJobSpec
    metrics_port: int = METRICS_PORT
    rendezvous_port: int = RDZV_PORT

    @property
    def raw_spec(self) -> dict[str, Any]:
        """The spec as the API server stores it (camelCase, defaults applied, unset nullables absent)."""
        out: dict[str, Any] = to_dict(self.spec, omit_none=True)
        return out

    def to_document(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": CONFIG_KIND,
                "job": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
                "spec": self.raw_spec,
                "runtime": {"metricsPort": self.metrics_port, "rendezvousPort": self.rendezvous_port}}


def build_job_config(job: dict[str, Any]) -> dict[str, Any]:
    """The document for a stored TrainingJob: its spec exactly as the API server returns it,
    so workers see what ``kubectl get tj -o yaml`` shows."""
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": CONFIG_KIND,
        "job": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid", "")},
        "spec": job.get("spec") or {},
        "runtime": {"metricsPort": METRICS_PORT, "rendezvousPort": RDZV_PORT},
    }


def render_job_config(job: dict[str, Any]) -> str:
    """The ``job.json`` text. Sorted keys keep it stable, so an unchanged spec is never rewritten."""
    return json.dumps(build_job_config(job), indent=2, sort_keys=True) + "\n"


def parse_document(doc: Any, source: str = "config") -> JobConfig:
    """Parse a job config document; a :class:`ValidationError` names the field."""
    if not isinstance(doc, dict):
        raise ValidationError(f"{source}: must be a JSON object")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != CONFIG_KIND:
        raise ValidationError(f"{source}: apiVersion/kind must be {API_VERSION}/{CONFIG_KIND}, "
                              f"got {doc.get('apiVersion')}/{doc.get('kind')}")
    job = doc.get("job") or {}
    if not isinstance(job.get("name"), str) or not job["name"]:
        raise ValidationError(f"{source}: job.name is required")
    spec = parse(TrainingJobSpec, doc.get("spec") or {}, "spec")
    runtime = doc.get("runtime") or {}
    return JobConfig(name=job["name"], namespace=job.get("namespace", "default"), uid=job.get("uid", ""),
                     spec=spec, metrics_port=int(runtime.get("metricsPort", METRICS_PORT)),
                     rendezvous_port=int(runtime.get("rendezvousPort", RDZV_PORT)))


def load_config(path: str | os.PathLike[str]) -> JobConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValidationError(f"--config {p}: cannot read ({e.strerror})") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValidationError(f"--config {p}: not valid JSON (line {e.lineno}: {e.msg})") from e
    return parse_document(doc, str(p))


def from_manifest(manifest: Any, source: str = "manifest") -> JobConfig:
    """The job config for a TrainingJob manifest: what ``kubectl apply`` would store, defaulted and checked
    as admission would (``cohort run --local`` has no API server)."""
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise ValidationError(f"{source}: expected a TrainingJob manifest (kind: {KIND})")
    if manifest.get("apiVersion") != API_VERSION:
        raise ValidationError(f"{source}: apiVersion must be {API_VERSION}, got {manifest.get('apiVersion')}")
    meta = manifest.get("metadata") or {}
    doc = {"apiVersion": API_VERSION, "kind": CONFIG_KIND,
           "job": {"name": meta.get("name") or "local", "namespace": meta.get("namespace", "default"), "uid": ""},
           "spec": manifest.get("spec") or {}}
    return parse_document(doc, source)


def load_manifest(path: str | os.PathLike[str]) -> JobConfig:
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except OSError as e:
        raise ValidationError(f"{path}: cannot read ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise ValidationError(f"{path}: not valid YAML ({e})") from e
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(jobs) != 1:
        raise ValidationError(f"{path}: expected exactly one TrainingJob, found {len(jobs)}")
    return from_manifest(jobs[0], str(path))
