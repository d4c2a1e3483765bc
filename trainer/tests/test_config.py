"""The trainer's side of the job-config contract: defaults, validation, errors that name the field."""

from __future__ import annotations

import json

import pytest
from tests.support.specs import with_workload

from cohort.api import ValidationError
from cohort.api.jobconfig import from_manifest, load_config, parse_document
from cohort.trainer.paths import map_path


def manifest(spec: dict, *, whole: bool = False) -> dict:
    """A manifest; a fragment gets the digits MLP as its workload (a job must say what it trains)."""
    if not whole:
        spec = with_workload(spec)
    return {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"}, "spec": spec}


def test_defaults_come_from_the_api_models():
    cfg = from_manifest(manifest({}))
    assert cfg.spec.workload.model == "mlp"
    assert cfg.spec.workload.batch_size == 64
    assert cfg.spec.checkpoint.async_ is True
    assert cfg.spec.replicas.target == 4
    assert cfg.spec.workload.model_args == {}  # free-form sections stay plain dicts


@pytest.mark.parametrize("spec, field", [
    ({"workload": {"modle": "mlp"}}, "spec.workload.modle"),
    ({"workload": {"batchSize": 0}}, "spec.workload.batchSize"),
    ({"workload": {"model": "no such model"}}, "spec.workload.model"),
    ({"compression": {"method": "zip"}}, "spec.compression.method"),
    ({"compression": {"ratio": 0}}, "spec.compression.ratio"),
    ({"resources": {"limits": {"cpu": "lots"}}}, "spec.resources.limits.cpu"),
    ({"resources": {"requests": {"memory": 1.5}}}, "spec.resources.requests.memory"),
    # a rule reads the GPU entry, and CEL cannot read a float there (the API server refuses 1.0 too)
    ({"resources": {"requests": {"nvidia.com/gpu": 1.0}}}, "spec.resources.requests: nvidia.com/gpu"),
    ({"replicas": {"min": 4, "target": 2, "max": 8}}, "spec.replicas"),
    ({"workload": {"epochs": 0, "maxSteps": 0}}, "spec.workload.epochs"),
    ({"stragglers": {"threshold": 1}}, "spec.stragglers.threshold"),
    ({"workload": {"optimizer": {"lr": "fast"}}}, "spec.workload.optimizer.lr"),
    ({"sync": {"outerOptimizer": {"name": "nesterov"}}}, "spec.sync.outerOptimizer.name"),  # needs localsgd
    ({"sync": {"algorithm": "localsgd", "outerOptimizer": {"name": "adam"}}}, "spec.sync.outerOptimizer.name"),
    ({"sync": {"algorithm": "localsgd", "outerOptimizer": {"lr": 0}}}, "spec.sync.outerOptimizer.lr"),
    ({"sync": {"algorithm": "localsgd", "outerOptimizer": {"momentum": 1}}}, "spec.sync.outerOptimizer.momentum"),
    ({"sync": {"algorithm": "localsgd", "warmupSteps": -1}}, "spec.sync.warmupSteps"),
    ({"sync": {"algorithm": "gossip", "period": 4, "fragments": 2}}, "spec.sync.fragments"),  # needs localsgd
    ({"sync": {"algorithm": "localsgd", "period": 4, "fragments": 5}}, "spec.sync.fragments"),  # > period
    ({"sync": {"algorithm": "localsgd", "period": 4, "fragments": 0}}, "spec.sync.fragments"),
    ({"sync": {"algorithm": "allreduce", "overlapSteps": 1}}, "spec.sync.overlapSteps"),  # needs localsgd
    # one round in flight at a time: overlapSteps < floor(period / fragments) = 2
    ({"sync": {"algorithm": "localsgd", "period": 9, "fragments": 4, "overlapSteps": 2}}, "spec.sync.overlapSteps"),
    ({"sync": {"algorithm": "localsgd", "overlapSteps": -1}}, "spec.sync.overlapSteps"),
    ({"sync": {"algorithm": "gossip", "period": 4, "mixing": 0.5}}, "spec.sync.mixing"),  # needs localsgd
    ({"sync": {"algorithm": "localsgd", "mixing": 1.5}}, "spec.sync.mixing"),
    ({"podTemplate": {"spec": {"containers": [{"name": "trainer", "imagePullPolicy": None}]}}},
     "spec.podTemplate.spec.containers[0].imagePullPolicy"),  # the API server refuses a null enum value
])
def test_invalid_specs_name_the_field(spec, field):
    with pytest.raises(ValidationError) as e:
        from_manifest(manifest(spec))
    assert str(e.value).startswith(field), str(e.value)


def test_every_problem_of_a_manifest_is_named_at_once():
    """As the API server names every unknown field in one refusal: a user fixes them in one go, not one per run
    (before, only the first was said)."""
    spec = {"workload": {"batchSize": 0, "modle": "mlp"}, "faultTolerance": {"processGroupTimeoutSecond": 30},
            "resources": {"limits": {"cpu": "lots", "memory": "lots"}}}
    with pytest.raises(ValidationError) as e:
        from_manifest(manifest(spec))
    fields = sorted(p.split(":", 1)[0] for p in e.value.problems)
    assert fields == ["spec.faultTolerance.processGroupTimeoutSecond", "spec.resources.limits.cpu",
                      "spec.resources.limits.memory", "spec.workload.batchSize", "spec.workload.modle"], fields
    assert str(e.value) == "; ".join(e.value.problems)


def test_cohort_validate_says_each_problem_on_a_line(tmp_path, capsys):
    import yaml

    from cohort.trainer.cli import main

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest({"replicas": {"min": 0}, "sync": {"algorithm": "telepathy"}})))
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":", 2)[1].strip() for line in lines] == ["spec.replicas.min", "spec.sync.algorithm"], lines


def test_document_round_trip_and_kind_check(tmp_path):
    doc = from_manifest(manifest({"workload": {"epochs": 3}})).to_document()
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    assert load_config(path).spec.workload.epochs == 3
    with pytest.raises(ValidationError, match="apiVersion/kind"):
        parse_document({**doc, "kind": "Other"})


def test_malformed_config_file_is_reported(tmp_path):
    bad = tmp_path / "job.json"
    bad.write_text("{not json")
    with pytest.raises(ValidationError, match="not valid JSON"):
        load_config(bad)
    with pytest.raises(ValidationError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_path_map(monkeypatch):
    monkeypatch.setenv("COHORT_PATH_MAP", json.dumps({"/checkpoints": "/tmp/x", "/checkpoints/deep": "/tmp/y"}))
    assert map_path("/checkpoints/job") == "/tmp/x/job"
    assert map_path("/checkpoints/deep/a") == "/tmp/y/a"
    assert map_path("/checkpointsX") == "/checkpointsX"


def test_cohort_train_reads_the_config_path_from_cohort_config(monkeypatch):
    from cohort.trainer import cli

    monkeypatch.setenv("COHORT_CONFIG", "/etc/cohort/job.json")
    assert cli.build_parser().parse_args(["train"]).config == "/etc/cohort/job.json"
    assert cli.build_parser().parse_args(["train", "--config", "x.json"]).config == "x.json"
    monkeypatch.delenv("COHORT_CONFIG")
    with pytest.raises(SystemExit):  # neither: argparse names --config
        cli.build_parser().parse_args(["train"])


@pytest.mark.parametrize("spec, field", [({}, "spec.workload"),
                                         ({"workload": {"dataset": "digits"}}, "spec.workload.model"),
                                         ({"workload": {"model": "mlp"}}, "spec.workload.dataset")])
def test_a_job_must_say_what_it_trains(spec, field):
    with pytest.raises(ValidationError, match=f"^{field}: required field is missing"):
        from_manifest(manifest(spec, whole=True))


def test_to_dict_leaves_an_unset_enum_field_out_so_parse_takes_it_back():
    """to_dict writes an unset nullable field as null, except an enum field (imagePullPolicy): the API server
    and parse refuse a null there, and a spec round-tripped through to_dict would no longer parse."""
    from cohort.api.models import TrainingJobSpec
    from cohort.api.schema import parse, to_dict

    spec = parse(TrainingJobSpec, with_workload({"podTemplate": {"spec": {"containers": [{"name": "trainer"}]}}}))
    stored = to_dict(spec)
    assert "imagePullPolicy" not in stored["podTemplate"]["spec"]["containers"][0]
    assert stored["podTemplate"]["spec"]["securityContext"]["fsGroup"] is None  # other nullable fields: null
    assert parse(TrainingJobSpec, stored) == spec
