"""The job config: the one document the operator and the trainer share.

The operator renders it from the stored TrainingJob (docs/contracts.md §1);
``cohort run --local`` builds the same document from a manifest. Either way
the spec is checked here against the CRD's own structural schema (shipped as
package data, generated from the operator's models), which also supplies the
defaults, so there is one home for every default and bound.

:class:`Section` gives snake_case attribute access to a spec section
(``spec.workload.batch_size``) without re-declaring its fields.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "cohort.dev/v1alpha1"
CONFIG_KIND = "JobConfig"
DEFAULT_METRICS_PORT = 9400
DEFAULT_RDZV_PORT = 29400


class ConfigError(ValueError):
    """A config or manifest is invalid; the message names the field."""


@cache
def _crd_schema() -> dict[str, Any]:
    text = (Path(__file__).parent / "data" / "trainingjob-crd.yaml").read_text()
    crd = yaml.safe_load(text)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def apply_schema(value: Any, schema: dict[str, Any], path: str) -> Any:
    """Default and validate ``value`` like the API server does for a structural schema."""
    if value is None:
        if schema.get("nullable"):
            return None
        raise ConfigError(f"{path}: must not be null")
    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: must be an object, got {value!r}")
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return value
        props = schema.get("properties")
        if props is None:  # a map (additionalProperties)
            item = schema.get("additionalProperties", {})
            return {k: apply_schema(v, item, f"{path}.{k}") if item else v for k, v in value.items()}
        unknown = sorted(set(value) - set(props))
        if unknown:
            raise ConfigError(f"{path}.{unknown[0]}: unknown field")
        out = {}
        for key, sub in props.items():
            if key in value:
                out[key] = apply_schema(value[key], sub, f"{path}.{key}")
            elif "default" in sub:
                out[key] = apply_schema(json.loads(json.dumps(sub["default"])), sub, f"{path}.{key}")
            elif key in schema.get("required", []):
                raise ConfigError(f"{path}.{key}: required field is missing")
        return out
    if t == "array":
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be an array, got {value!r}")
        return [apply_schema(v, schema.get("items", {}), f"{path}[{i}]") for i, v in enumerate(value)]
    if schema.get("x-kubernetes-int-or-string"):  # a resource.Quantity: the pattern applies to strings only
        if isinstance(value, bool) or not isinstance(value, (int, str)) or (
                isinstance(value, str) and not re.fullmatch(schema["pattern"], value)):
            raise ConfigError(f"{path}: must be a quantity (an integer, or e.g. 500m, 2Gi, 1.5), got {value!r}")
        return value
    checks = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool)}
    if t in checks and not checks[t](value):
        raise ConfigError(f"{path}: must be of type {t}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        raise ConfigError(f"{path}: unsupported value {value!r}; supported values: {', '.join(schema['enum'])}")
    if "minimum" in schema:
        lo = schema["minimum"]
        if (schema.get("exclusiveMinimum") and not value > lo) or value < lo:
            raise ConfigError(f"{path}: must be {'>' if schema.get('exclusiveMinimum') else '>='} {lo}, got {value}")
    if "maximum" in schema and value > schema["maximum"]:
        raise ConfigError(f"{path}: must be <= {schema['maximum']}, got {value}")
    if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
        raise ConfigError(f"{path}: {value!r} is not valid; expected: {schema.get('description') or schema['pattern']}")
    return value


class Section:
    """Read-only snake_case view of a camelCase spec section."""

    def __init__(self, data: dict[str, Any], path: str):
        self._data = data
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        for key, value in self._data.items():
            if _snake(key).rstrip("_") == name.rstrip("_"):
                return Section(value, f"{self._path}.{key}") if isinstance(value, dict) and key not in _FREE_FORM else value
        raise AttributeError(f"{self._path} has no field {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._data))

    def __repr__(self) -> str:
        return f"Section({self._path}: {self._data!r})"


# Free-form objects stay plain dicts (their keys are the user's, not ours).
_FREE_FORM = {"modelArgs", "datasetArgs", "resources", "volume", "podTemplate", "affinity", "nodeSelector"}


@dataclass(frozen=True)
class JobConfig:
    """A parsed, defaulted and validated job config."""

    name: str
    namespace: str
    uid: str
    spec: Section
    raw_spec: dict[str, Any]
    metrics_port: int = DEFAULT_METRICS_PORT
    rendezvous_port: int = DEFAULT_RDZV_PORT

    def to_document(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": CONFIG_KIND,
                "job": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
                "spec": self.raw_spec,
                "runtime": {"metricsPort": self.metrics_port, "rendezvousPort": self.rendezvous_port}}


def parse_document(doc: Any, source: str = "config") -> JobConfig:
    """Parse a job config document (docs/contracts.md §1)."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: must be a JSON object")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != CONFIG_KIND:
        raise ConfigError(f"{source}: apiVersion/kind must be {API_VERSION}/{CONFIG_KIND}, "
                          f"got {doc.get('apiVersion')}/{doc.get('kind')}")
    job = doc.get("job") or {}
    if not isinstance(job.get("name"), str) or not job["name"]:
        raise ConfigError(f"{source}: job.name is required")
    spec = apply_schema(doc.get("spec") or {}, _crd_schema(), "spec")
    _check_rules(spec)
    runtime = doc.get("runtime") or {}
    return JobConfig(name=job["name"], namespace=job.get("namespace", "default"), uid=job.get("uid", ""),
                     spec=Section(spec, "spec"), raw_spec=spec,
                     metrics_port=int(runtime.get("metricsPort", DEFAULT_METRICS_PORT)),
                     rendezvous_port=int(runtime.get("rendezvousPort", DEFAULT_RDZV_PORT)))


@cache
def supported_compression() -> dict[str, tuple[str, ...]]:
    """Compressors each sync algorithm can use: the API models' SUPPORTED_COMPRESSION, as
    `make crds` wrote it into data/compatibility.json (`make check-generated` keeps it current)."""
    doc = json.loads((Path(__file__).parent / "data" / "compatibility.json").read_text())
    return {sync: tuple(methods) for sync, methods in doc["supportedCompression"].items()}


def _check_rules(spec: dict[str, Any]) -> None:
    """The CRD's cross-field rules that matter to the trainer (the API server checks them all;
    `cohort run --local` has no API server, so the trainer must refuse what it would)."""
    r = spec["replicas"]
    if not r["min"] <= r["target"] <= r["max"]:
        raise ConfigError("spec.replicas: need min <= target <= max")
    w = spec["workload"]
    if w["epochs"] <= 0 and w["maxSteps"] <= 0:
        raise ConfigError("spec.workload.epochs: one of epochs or maxSteps must be > 0")
    sync, method, strategy = spec["sync"]["algorithm"], spec["compression"]["method"], spec["parallelism"]["strategy"]
    allowed = supported_compression()[sync]
    if method not in allowed:
        raise ConfigError(f"spec.compression.method: {method} is not supported with spec.sync.algorithm {sync} "
                          f"(supported: {', '.join(allowed)})")
    if method != "none" and strategy not in ("data", "auto"):
        raise ConfigError(f"spec.compression.method: {method} needs spec.parallelism.strategy data or auto, "
                          f"got {strategy}")
    if sync != "allreduce" and strategy != "data":
        raise ConfigError(f"spec.sync.algorithm: {sync} needs spec.parallelism.strategy data, got {strategy}")


def load_config(path: str | os.PathLike[str]) -> JobConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"--config {p}: cannot read ({e.strerror})") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--config {p}: not valid JSON (line {e.lineno}: {e.msg})") from e
    return parse_document(doc, str(p))


def from_manifest(manifest: Any, source: str = "manifest") -> JobConfig:
    """Build the job config for a TrainingJob manifest (what `kubectl apply` would store)."""
    if not isinstance(manifest, dict) or manifest.get("kind") != "TrainingJob":
        raise ConfigError(f"{source}: expected a TrainingJob manifest (kind: TrainingJob)")
    if manifest.get("apiVersion") != API_VERSION:
        raise ConfigError(f"{source}: apiVersion must be {API_VERSION}, got {manifest.get('apiVersion')}")
    meta = manifest.get("metadata") or {}
    doc = {"apiVersion": API_VERSION, "kind": CONFIG_KIND,
           "job": {"name": meta.get("name") or "local", "namespace": meta.get("namespace", "default"), "uid": ""},
           "spec": manifest.get("spec") or {}}
    return parse_document(doc, source)


def load_manifest(path: str | os.PathLike[str]) -> JobConfig:
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from e
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "TrainingJob"]
    if len(jobs) != 1:
        raise ConfigError(f"{path}: expected exactly one TrainingJob, found {len(jobs)}")
    return from_manifest(jobs[0], str(path))


def map_path(path: str) -> str:
    """Apply COHORT_PATH_MAP (set by the local launcher, `cohort run --local`; docs/contracts.md §2)."""
    mapping = json.loads(os.environ.get("COHORT_PATH_MAP", "{}") or "{}")
    for src in sorted(mapping, key=len, reverse=True):
        if path == src or path.startswith(src.rstrip("/") + "/"):
            return mapping[src] + path[len(src):]
    return path
