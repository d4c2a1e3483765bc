"""The job config contract: what the operator renders, the trainer parses (docs/contracts.md §1).

Every example manifest is defaulted the way the API server does it, rendered
with the operator's renderer and parsed by the trainer. Both use the one
API package (cohort.api), so the trainer's defaulting (what `cohort run --local`
runs) must agree exactly with what the API server stores from the generated CRD.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cohort.api.jobconfig import from_manifest, parse_document, render_job_config
from cohort.api.models import OWN_MOMENTUM, TrainingJobSpec
from cohort.api.schema import parse, to_dict

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml")
                  if any(d and d.get("kind") == "TrainingJob" for d in yaml.safe_load_all(p.read_text())))


def jobs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "TrainingJob"]


def test_there_are_examples():
    assert len(EXAMPLES) >= 1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_operator_render_parses_in_the_trainer(path):
    for job in jobs(path):
        stored = {"metadata": {"name": job["metadata"]["name"], "namespace": "ns", "uid": "u-1"},
                  "spec": to_dict(parse(TrainingJobSpec, job.get("spec") or {}), omit_none=True)}
        cfg = parse_document(json.loads(render_job_config(stored)))
        assert cfg.name == job["metadata"]["name"] and cfg.namespace == "ns"
        # one home for defaults: what the trainer parsed is what the operator stored
        assert from_manifest(job).raw_spec == stored["spec"]


@pytest.mark.k8s
def test_api_server_defaulting_matches_and_parses(cluster, namespace):
    for path in EXAMPLES:
        for job in jobs(path):
            job = {**job, "metadata": {**job["metadata"], "namespace": namespace}}
            stored = cluster.custom.create_namespaced_custom_object(
                "cohort.dev", "v1alpha1", namespace, "trainingjobs", job, dry_run="All", field_validation="Strict")
            cfg = parse_document(json.loads(render_job_config(stored)))
            assert cfg.raw_spec == from_manifest(job).raw_spec, path.name


def _refused(fn) -> str | None:
    try:
        fn()
    except ValueError as e:  # both sides raise a ValueError subclass naming the field
        return str(e)
    return None


# What admission refuses, the API server and Python alike, is tests/contract/test_admission_parity.py's
# differential test (the parity test that compared parse with from_manifest, which calls parse, is gone).


@pytest.mark.parametrize("method", OWN_MOMENTUM)
def test_methods_that_keep_their_own_momentum_need_the_optimizers_at_zero(method):
    """dgc and signum apply a momentum before compressing; SGD's momentum on top would apply it
    twice, so both sides refuse the pair with the default momentum 0.9, naming the field."""
    base = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    spec = {**base["spec"], "compression": {"method": method}}
    for refuse in (lambda: parse(TrainingJobSpec, spec), lambda: from_manifest({**base, "spec": spec})):
        message = _refused(refuse)
        assert message is not None and "spec.workload.optimizer.momentum" in message, message
    workload = {**spec["workload"], "optimizer": {**spec["workload"]["optimizer"], "momentum": 0.0}}
    ok = {**spec, "workload": workload}
    assert _refused(lambda: parse(TrainingJobSpec, ok)) is None
    assert _refused(lambda: from_manifest({**base, "spec": ok})) is None


@pytest.mark.parametrize("method", OWN_MOMENTUM)
def test_methods_that_keep_their_own_momentum_refuse_adamw_naming_the_optimizer(method):
    """adamw ignores optimizer.momentum but keeps a first moment of its own, a second momentum on top
    of dgc's or signum's: both sides refuse it by the optimizer's name, whatever momentum says, and
    do not blame the momentum field adamw ignores."""
    base = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    for momentum in (0.9, 0.0):
        workload = {**base["spec"]["workload"], "optimizer": {"name": "adamw", "lr": 0.001, "momentum": momentum}}
        spec = {**base["spec"], "compression": {"method": method}, "workload": workload}
        for refuse in (lambda spec=spec: parse(TrainingJobSpec, spec),
                       lambda spec=spec: from_manifest({**base, "spec": spec})):
            message = _refused(refuse)
            assert message is not None and "spec.workload.optimizer.name sgd" in message, message
            assert "spec.workload.optimizer.momentum" not in message, message
