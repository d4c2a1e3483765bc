"""Invalid TrainingJobs are refused at admission, with a message naming the field.

One table, two judges: the real API server (the generated CRD's schema and
CEL rules) and ``cohort.api.schema.parse`` (the same rules in Python,
used where no API server is, e.g. ``cohort run --local``). Both must refuse
every entry and name the same field.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from cohort.api.models import TrainingJobSpec
from cohort.api.schema import ValidationError, parse
from tests.support.specs import with_workload

# (id, spec fragment, the field the refusal must name)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("min-zero", {"replicas": {"min": 0, "target": 1}}, "spec.replicas.min"),
    ("target-above-max", {"replicas": {"min": 1, "target": 9, "max": 8}}, "spec.replicas.target"),
    ("target-below-min", {"replicas": {"min": 4, "target": 2, "max": 8}}, "spec.replicas.target"),
    ("max-below-min", {"replicas": {"min": 3, "target": 3, "max": 2}}, "spec.replicas.max"),
    ("negative-spares", {"replicas": {"spares": -1}}, "spec.replicas.spares"),
    ("min-not-multiple-of-model-parallel", {"parallelism": {"strategy": "tensor", "tensor": 3}}, "spec.replicas"),
    ("tensor-without-strategy", {"parallelism": {"strategy": "data", "tensor": 2}}, "spec.parallelism.tensor"),
    ("pipeline-without-strategy", {"parallelism": {"strategy": "fsdp", "pipeline": 2}}, "spec.parallelism.pipeline"),
    ("unknown-strategy", {"parallelism": {"strategy": "magic"}}, "spec.parallelism.strategy"),
    ("ratio-zero", {"compression": {"method": "topk", "ratio": 0}}, "spec.compression.ratio"),
    ("ratio-above-one", {"compression": {"method": "randomk", "ratio": 1.5}}, "spec.compression.ratio"),
    ("levels-one", {"compression": {"method": "qsgd", "levels": 1}}, "spec.compression.levels"),
    ("rank-zero", {"compression": {"method": "powersgd", "rank": 0}}, "spec.compression.rank"),
    ("sparse-with-qsgd", {"compression": {"method": "qsgd", "collective": "sparse"}}, "spec.compression.collective"),
    ("sparse-with-gossip", {"sync": {"algorithm": "gossip"}, "compression": {"method": "topk", "collective": "sparse"}},
     "spec.compression.collective"),
    ("cyclic-with-randomk", {"compression": {"method": "randomk", "collective": "cyclic"}}, "spec.compression.collective"),
    ("global-with-qsgd", {"compression": {"method": "qsgd", "collective": "global"}}, "spec.compression.collective"),
    ("cyclic-with-gossip", {"sync": {"algorithm": "gossip"}, "compression": {"method": "topk", "collective": "cyclic"}},
     "spec.compression.collective"),
    ("unknown-collective", {"compression": {"method": "topk", "collective": "ring"}}, "spec.compression.collective"),
    ("gossip-powersgd", {"sync": {"algorithm": "gossip"}, "compression": {"method": "powersgd"}},
     "spec.compression.method"),
    ("fsdp-topk", {"parallelism": {"strategy": "fsdp"}, "compression": {"method": "topk"}},
     "spec.compression.method"),
    ("gossip-with-fsdp", {"sync": {"algorithm": "gossip"}, "parallelism": {"strategy": "fsdp"}},
     "spec.sync.algorithm"),
    ("keep-zero", {"checkpoint": {"keep": 0}}, "spec.checkpoint.keep"),
    ("threshold-one", {"stragglers": {"threshold": 1}}, "spec.stragglers.threshold"),
    ("unknown-straggler-policy", {"stragglers": {"policy": "kill"}}, "spec.stragglers.policy"),
    ("no-length", {"workload": {"epochs": 0, "maxSteps": 0}}, "spec.workload.epochs"),
    ("unknown-model", {"workload": {"model": "resnet"}}, "spec.workload.model"),
    ("bad-dataset-entry-point", {"workload": {"dataset": "my.module:"}}, "spec.workload.dataset"),
    # A pattern is anchored: a valid name with text around it is no name (issue 32).
    ("model-with-a-suffix", {"workload": {"model": "mlp-v2"}}, "spec.workload.model"),
    ("dataset-with-a-shell-command", {"workload": {"dataset": "x.y:z; rm -rf /"}}, "spec.workload.dataset"),
    ("dataset-with-a-newline", {"workload": {"dataset": "digits\n"}}, "spec.workload.dataset"),
    ("zero-lr", {"workload": {"optimizer": {"lr": 0}}}, "spec.workload.optimizer.lr"),
    ("zero-batch", {"workload": {"batchSize": 0}}, "spec.workload.batchSize"),
    ("typo-in-replicas", {"replicas": {"minimum": 2}}, "spec.replicas.minimum"),
    ("typo-in-spec", {"replica": {"min": 2}}, "spec.replica"),
    ("string-for-int", {"replicas": {"min": "two"}}, "spec.replicas.min"),
    ("unknown-success-policy", {"runPolicy": {"successPolicy": "majority"}}, "spec.runPolicy.successPolicy"),
    ("zero-deadline", {"runPolicy": {"activeDeadlineSeconds": 0}}, "spec.runPolicy.activeDeadlineSeconds"),
    ("negative-backoff", {"faultTolerance": {"backoffSeconds": -1}}, "spec.faultTolerance.backoffSeconds"),
    ("zero-below-min-timeout", {"faultTolerance": {"belowMinTimeoutSeconds": 0}},
     "spec.faultTolerance.belowMinTimeoutSeconds"),
    ("zero-process-group-timeout", {"faultTolerance": {"processGroupTimeoutSeconds": 0}},
     "spec.faultTolerance.processGroupTimeoutSeconds"),
    ("cpu-lots", {"resources": {"limits": {"cpu": "lots"}}}, "spec.resources.limits.cpu"),
    ("memory-a-float", {"resources": {"requests": {"memory": 1.5}}}, "spec.resources.requests.memory"),
    ("typo-in-resources", {"resources": {"limit": {"cpu": 1}}}, "spec.resources.limit"),
    ("two-gpus", {"resources": {"limits": {"nvidia.com/gpu": 2}}}, "spec.resources.limits['nvidia.com/gpu']"),
    ("two-gpus-requested", {"resources": {"requests": {"nvidia.com/gpu": "2"}}},
     "spec.resources.requests['nvidia.com/gpu']"),
    ("half-a-gpu", {"resources": {"limits": {"nvidia.com/gpu": "500m"}}}, "spec.resources.limits['nvidia.com/gpu']"),
    ("fp16-with-fsdp", {"workload": {"precision": "fp16"}, "parallelism": {"strategy": "fsdp"}},
     "spec.workload.precision"),
    ("unknown-precision", {"workload": {"precision": "fp8"}}, "spec.workload.precision"),
    ("shm-not-a-quantity", {"resources": {"shmSize": "big"}}, "spec.resources.shmSize"),
    ("claim-without-name", {"resources": {"claims": [{"request": "gpu"}]}}, "spec.resources.claims[0].name"),
    ("global-batch-with-fsdp", {"workload": {"globalBatchSize": 64}, "parallelism": {"strategy": "fsdp"}},
     "spec.workload.globalBatchSize"),
    ("global-batch-below-max", {"workload": {"globalBatchSize": 4}, "replicas": {"max": 8}},
     "spec.workload.globalBatchSize"),
    # podTemplate: a field the operator would not merge is refused, not silently dropped.
    ("template-container-resources", {"podTemplate": {"spec": {"containers": [{"resources": {"limits": {"cpu": 1}}}]}}},
     "spec.podTemplate.spec.containers[0].resources"),
    ("template-node-selector", {"podTemplate": {"spec": {"nodeSelector": {"disk": "ssd"}}}},
     "spec.podTemplate.spec.nodeSelector"),
    ("template-sidecar", {"podTemplate": {"spec": {"containers": [{"name": "sidecar"}]}}},
     "spec.podTemplate.spec.containers[0].name"),
    ("template-two-containers", {"podTemplate": {"spec": {"containers": [{}, {}]}}},
     "spec.podTemplate.spec.containers"),
    ("template-root", {"podTemplate": {"spec": {"securityContext": {"runAsUser": 0}}}},
     "spec.podTemplate.spec.securityContext.runAsUser"),
    ("template-label-not-a-string", {"podTemplate": {"metadata": {"labels": {"team": 7}}}},
     "spec.podTemplate.metadata.labels.team"),
    # The operator's own volumes' names are taken: a template volume or mount by one of them was dropped.
    ("template-volume-named-like-the-config", {"podTemplate": {"spec": {"volumes": [{"name": "cohort-config",
                                                                                    "emptyDir": {}}]}}},
     "spec.podTemplate.spec.volumes"),
    ("template-volume-named-scratch", {"podTemplate": {"spec": {"volumes": [{"name": "data", "emptyDir": {}},
                                                                            {"name": "scratch", "emptyDir": {}}]}}},
     "spec.podTemplate.spec.volumes"),
    ("template-mount-of-the-checkpoints", {"podTemplate": {"spec": {"containers": [{"volumeMounts": [
        {"name": "cohort-checkpoints", "mountPath": "/elsewhere"}]}]}}},
     "spec.podTemplate.spec.containers[0].volumeMounts"),
    ("template-volume-without-a-name", {"podTemplate": {"spec": {"volumes": [{"emptyDir": {}}]}}},
     "spec.podTemplate.spec.volumes[0].name"),
    # The contract's env was dropped; a mount at the operator's paths made every pod invalid at creation.
    ("template-env-sets-the-world", {"podTemplate": {"spec": {"containers": [{"env": [
        {"name": "COHORT_WORLD", "value": "configmap:other-world"}]}]}}},
     "spec.podTemplate.spec.containers[0].env"),
    ("template-env-without-a-name", {"podTemplate": {"spec": {"containers": [{"env": [{"value": "x"}]}]}}},
     "spec.podTemplate.spec.containers[0].env[0].name"),
    ("template-mount-at-tmp", {"podTemplate": {"spec": {"volumes": [{"name": "data", "emptyDir": {}}], "containers": [
        {"volumeMounts": [{"name": "data", "mountPath": "/tmp"}]}]}}},
     "spec.podTemplate.spec.containers[0].volumeMounts"),
    ("template-mount-of-no-volume", {"podTemplate": {"spec": {"containers": [{"volumeMounts": [
        {"name": "data", "mountPath": "/data"}]}]}}},
     "spec.podTemplate.spec.containers"),
    ("template-two-volumes-by-one-name", {"podTemplate": {"spec": {"volumes": [{"name": "d", "emptyDir": {}},
                                                                               {"name": "d", "emptyDir": {}}]}}},
     "spec.podTemplate.spec.volumes"),
    ("template-two-mounts-at-one-path", {"podTemplate": {"spec": {"volumes": [{"name": "d", "emptyDir": {}}],
                                                                  "containers": [{"volumeMounts": [
        {"name": "d", "mountPath": "/d"}, {"name": "d", "mountPath": "/d", "subPath": "x"}]}]}}},
     "spec.podTemplate.spec.containers[0].volumeMounts"),
    ("template-mount-at-the-checkpoint-path", {"podTemplate": {"spec": {"volumes": [{"name": "d", "emptyDir": {}}],
                                                                        "containers": [{"volumeMounts": [
        {"name": "d", "mountPath": "/checkpoints"}]}]}}},
     "spec.podTemplate.spec.containers"),
]


def manifest(name: str, spec: dict[str, Any], *, whole: bool = False) -> dict[str, Any]:
    return {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": copy.deepcopy(spec) if whole else with_workload(spec)}


def test_the_table_is_big_enough():
    assert len(INVALID) >= 20 and len({case[0] for case in INVALID}) == len(INVALID)


@pytest.mark.parametrize("spec,field", [(c[1], c[2]) for c in INVALID], ids=[c[0] for c in INVALID])
def test_python_validation_refuses_and_names_the_field(spec, field):
    with pytest.raises(ValidationError) as err:
        parse(TrainingJobSpec, with_workload(spec))
    assert field in str(err.value), str(err.value)


def test_a_max_below_min_is_named_as_the_mistake():
    """min 3, max 2 breaks target's two bounds as well; the refusal says max is below min, naming max."""
    with pytest.raises(ValidationError) as err:
        parse(TrainingJobSpec, with_workload({"replicas": {"min": 3, "target": 3, "max": 2}}))
    assert "spec.replicas.max: spec.replicas.max must be >= spec.replicas.min" in str(err.value), str(err.value)


# A job must say what it trains: no workload, or one without a model or a dataset, is refused.
UNSAID = [("no-workload", {}, "spec.workload"),
          ("no-model", {"workload": {"dataset": "digits"}}, "spec.workload.model"),
          ("no-dataset", {"workload": {"model": "mlp"}}, "spec.workload.dataset")]


@pytest.mark.parametrize("spec,field", [(c[1], c[2]) for c in UNSAID], ids=[c[0] for c in UNSAID])
def test_a_job_must_say_what_it_trains(spec, field):
    with pytest.raises(ValidationError) as err:
        parse(TrainingJobSpec, copy.deepcopy(spec))
    assert str(err.value).startswith(f"{field}: required field is missing"), str(err.value)


def test_resources_take_kubernetes_quantities():
    spec = parse(TrainingJobSpec, with_workload(
        {"resources": {"limits": {"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": 1},
                       "requests": {"cpu": "0.5", "memory": "1.5e9"}}}))
    assert spec.resources.limits == {"cpu": "500m", "memory": "2Gi", "nvidia.com/gpu": 1}
    assert spec.resources.requests == {"cpu": "0.5", "memory": "1.5e9"} and spec.resources.claims == []


@pytest.mark.k8s
def test_api_server_refuses_every_invalid_manifest_naming_the_field(cluster, namespace):
    misses = []
    for case_id, spec, field in INVALID:
        try:
            cluster.create_job(namespace, manifest(case_id, spec))
        except ApiException as e:
            # 422: schema or CEL; 400: strict decoding (unknown fields)
            if e.status not in (400, 422) or field not in (e.body or ""):
                misses.append(f"{case_id}: HTTP {e.status}, field {field} not named in {e.body}")
            continue
        misses.append(f"{case_id}: accepted")
    for case_id, spec, field in UNSAID:
        try:
            cluster.create_job(namespace, manifest(case_id, spec, whole=True))
        except ApiException as e:
            if e.status != 422 or field not in (e.body or "") or "Required value" not in (e.body or ""):
                misses.append(f"{case_id}: HTTP {e.status}, {field} not named as required in {e.body}")
            continue
        misses.append(f"{case_id}: accepted")
    assert not misses, "\n".join(misses)
    # And a valid one, built from the same defaults, is accepted, quantities as written.
    valid = {"replicas": {"min": 1, "target": 2, "max": 4},
             "resources": {"limits": {"cpu": "500m", "memory": "2Gi"}, "requests": {"cpu": 1}}}
    created = cluster.create_job(namespace, manifest("valid", valid))
    assert created["spec"]["resources"] == {"limits": {"cpu": "500m", "memory": "2Gi"}, "requests": {"cpu": 1},
                                            "claims": []}


@pytest.mark.k8s
@pytest.mark.parametrize("name", ["9lives", "Upper", "a" * 41, "dots.in.name"])
def test_api_server_refuses_job_names_that_cannot_name_pods(cluster, namespace, name):
    with pytest.raises(ApiException) as err:
        cluster.create_job(namespace, manifest(name, {}))
    assert err.value.status == 422 and "metadata.name" in err.value.body


@pytest.mark.k8s
def test_a_jobs_seed_is_immutable(cluster, namespace):
    """Workers of one world share workload.seed (data order, shared random draws); a changed seed would
    reach only the pods started after the change, so the API server refuses it (issue 32)."""
    cluster.create_job(namespace, manifest("seeded", {"workload": {"seed": 3}}))
    with pytest.raises(ApiException) as err:
        cluster.patch_job(namespace, "seeded", {"spec": {"workload": {"seed": 4}}})
    assert err.value.status == 422 and "spec.workload.seed" in err.value.body and "immutable" in err.value.body
    patched = cluster.patch_job(namespace, "seeded", {"spec": {"replicas": {"target": 3}}})  # the rest still moves
    assert patched["spec"]["replicas"]["target"] == 3 and patched["spec"]["workload"]["seed"] == 3
