"""The pure builders: worker pod, owned objects, job config (docs/contracts.md §1-§2)."""

from __future__ import annotations

import json

import pytest
from tests.support.specs import with_workload

from cohort.api.jobconfig import build_job_config, render_job_config
from cohort.api.models import TrainingJobSpec
from cohort.api.schema import parse
from cohort.operator.manifests import (
    build_config_map,
    build_network_policy,
    build_pdb,
    build_service,
    build_worker_rbac,
    build_world_map,
    owned_objects,
)
from cohort.operator.pods import (
    CPU_ENV_DEFAULTS,
    GPU_ENV_DEFAULTS,
    PodDefaults,
    avoid_nodes,
    build_worker_pod,
    container_resources,
)
from cohort.operator.world import Member, World


def make_job(name: str = "digits", spec: dict | None = None) -> dict:
    """A stored TrainingJob: every default applied (as in conftest.make_job)."""
    from cohort.api.schema import to_dict

    return {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
            "spec": to_dict(parse(TrainingJobSpec, with_workload(spec)))}


DEFAULTS = PodDefaults(image="img:default", cuda_image="img:cuda", shm_size="8Gi")


def pod_for(spec: dict | None = None, **kwargs):
    job = make_job(spec=spec)
    return build_worker_pod(job, parse(TrainingJobSpec, job["spec"]), 3, defaults=DEFAULTS, **kwargs)


def env_of(pod) -> dict:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


def test_pod_has_deterministic_name_labels_and_controller_owner():
    pod = pod_for()
    meta = pod["metadata"]
    assert meta["name"] == "digits-worker-3"
    assert meta["labels"]["cohort.dev/job"] == "digits"
    assert meta["labels"]["cohort.dev/role"] == "worker"
    for key in ("name", "instance", "component", "managed-by", "part-of"):
        assert f"app.kubernetes.io/{key}" in meta["labels"]
    (owner,) = meta["ownerReferences"]
    assert owner == {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "name": "digits",
                     "uid": "uid-digits", "controller": True, "blockOwnerDeletion": True}


def test_pod_follows_the_contract_env_ports_probe_and_config_mount():
    pod = pod_for()
    c = pod["spec"]["containers"][0]
    assert c["name"] == "trainer" and c["command"] == ["cohort-train"]
    assert c["args"] == ["--config", "/etc/cohort/job.json"]
    env = env_of(pod)
    assert env["COHORT_CONFIG"]["value"] == "/etc/cohort/job.json"
    assert env["COHORT_JOB_NAME"]["value"] == "digits"
    assert env["COHORT_WORLD"]["value"] == "configmap:digits-world"
    assert env["COHORT_METRICS_PORT"]["value"] == "9400"
    # The rendezvous port travels in the job config (runtime.rendezvousPort), the pod's uid nowhere.
    assert "COHORT_RDZV_PORT" not in env and "COHORT_POD_UID" not in env
    for var, path in (("COHORT_NAMESPACE", "metadata.namespace"), ("COHORT_POD_NAME", "metadata.name"),
                      ("COHORT_POD_IP", "status.podIP")):
        assert env[var]["valueFrom"]["fieldRef"]["fieldPath"] == path
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9400, "rendezvous": 29400}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == c["startupProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/cohort"]["readOnly"] is True
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols[mounts["/etc/cohort"]["name"]]["configMap"]["name"] == "digits-config"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "digits-worker"
    assert c["image"] == "img:default"


def test_pod_is_restricted():
    pod = pod_for()
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    psc = pod["spec"]["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_checkpoint_volume_default_named_and_url():
    def ckpt(pod):
        mounts = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "cohort-checkpoints"]
        vols = [v for v in pod["spec"]["volumes"] if v["name"] == "cohort-checkpoints"]
        return mounts, vols

    mounts, vols = ckpt(pod_for())
    assert mounts[0]["mountPath"] == "/checkpoints" and "emptyDir" in vols[0]
    mounts, vols = ckpt(pod_for({"checkpoint": {"path": "/ckpt", "volume": {"persistentVolumeClaim": {"claimName": "c"}}}}))
    assert mounts[0]["mountPath"] == "/ckpt" and vols[0]["persistentVolumeClaim"] == {"claimName": "c"}
    assert ckpt(pod_for({"checkpoint": {"path": "s3://bucket/ckpt"}})) == ([], [])


def test_resources_and_scheduling_pass_through():
    pod = pod_for({
        "image": "trainer:1",
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "scheduling": {"schedulerName": "sched", "priorityClassName": "high", "nodeSelector": {"type": "kwok"},
                       "tolerations": [{"key": "k", "operator": "Exists"}],
                       "affinity": {"podAntiAffinity": {"x": 1}}},
    })
    spec = pod["spec"]
    assert spec["containers"][0]["image"] == "trainer:1"
    assert spec["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert spec["schedulerName"] == "sched" and spec["priorityClassName"] == "high"
    assert spec["nodeSelector"] == {"type": "kwok"}
    assert spec["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert spec["affinity"] == {"podAntiAffinity": {"x": 1}}


GPU = {"resources": {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}}}


def shm_of(pod) -> tuple[list, list]:
    """The /dev/shm (volumes, mounts) of a pod."""
    mounts = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    names = {m["name"] for m in mounts}
    return [v for v in pod["spec"]["volumes"] if v["name"] in names], mounts


def test_gpu_worker_gets_the_cuda_image_a_memory_shm_and_nccl_defaults():
    pod = pod_for(GPU)
    c = pod["spec"]["containers"][0]
    assert c["image"] == "img:cuda"
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 1, "memory": "16Gi"}}
    (vol,), (mount,) = shm_of(pod)
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert mount == {"name": vol["name"], "mountPath": "/dev/shm"}
    env = env_of(pod)
    assert env["NCCL_DEBUG"] == {"name": "NCCL_DEBUG", "value": "WARN"}
    assert env["NCCL_SOCKET_IFNAME"] == {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}
    assert {name for name, _ in GPU_ENV_DEFAULTS} <= set(env)
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin sets it to the GPU it allocates
    assert env["COHORT_WORLD"]["value"] == "configmap:digits-world"  # the contract is unchanged


def test_a_gpu_request_alone_makes_a_gpu_worker_and_zero_does_not():
    assert pod_for({"resources": {"requests": {"nvidia.com/gpu": "1"}}})["spec"]["containers"][0]["image"] == "img:cuda"
    zero = pod_for({"resources": {"limits": {"nvidia.com/gpu": 0}}})
    assert zero["spec"]["containers"][0]["image"] == "img:default"
    assert shm_of(zero) == ([], []) and env_of(zero)["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"


def test_shm_size_comes_from_the_spec_and_is_not_a_container_resource():
    pod = pod_for({"resources": {"limits": {"nvidia.com/gpu": 1}, "shmSize": "32Gi"}})
    (vol,), _ = shm_of(pod)
    assert vol["emptyDir"]["sizeLimit"] == "32Gi"
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_spec_image_wins_over_both_defaults():
    assert pod_for({**GPU, "image": "mine:1"})["spec"]["containers"][0]["image"] == "mine:1"
    assert pod_for({"image": "mine:1"})["spec"]["containers"][0]["image"] == "mine:1"


def test_the_users_env_overrides_every_device_default_once():
    user_env = [{"name": "NCCL_DEBUG", "value": "INFO"},
                {"name": "NCCL_SOCKET_IFNAME", "valueFrom": {"configMapKeyRef": {"name": "net", "key": "if"}}},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]
    template = {"podTemplate": {"spec": {"containers": [{"env": user_env}]}}}
    for spec in (GPU, {}):
        env = pod_for({**spec, **template})["spec"]["containers"][0]["env"]
        names = [e["name"] for e in env]
        assert len(names) == len(set(names)), names  # no name twice: the user's entry is the only one
        by_name = {e["name"]: e for e in env}
        for e in user_env:
            assert by_name[e["name"]] == e


def test_a_worker_without_gpu_sees_none_and_keeps_the_runtimes_shm():
    pod = pod_for()
    assert env_of(pod)["NVIDIA_VISIBLE_DEVICES"] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    assert {name for name, _ in CPU_ENV_DEFAULTS} <= set(env_of(pod))
    assert not {name for name, _ in GPU_ENV_DEFAULTS} & set(env_of(pod))
    assert shm_of(pod) == ([], [])
    assert pod["spec"]["containers"][0]["image"] == "img:default"


def test_a_shm_the_user_mounts_replaces_the_operators():
    pod = pod_for({**GPU, "podTemplate": {"spec": {
        "volumes": [{"name": "myshm", "emptyDir": {"medium": "Memory"}}],
        "containers": [{"volumeMounts": [{"name": "myshm", "mountPath": "/dev/shm"}]}]}}})
    vols, mounts = shm_of(pod)
    assert [v["name"] for v in vols] == ["myshm"] and len(mounts) == 1


def test_pod_template_is_merged_but_cannot_override_the_contract():
    pod = pod_for({"podTemplate": {
        "metadata": {"labels": {"team": "ml", "cohort.dev/job": "other"}, "annotations": {"a": "b"}},
        "spec": {
            "serviceAccountName": "custom", "imagePullSecrets": [{"name": "reg"}],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"env": [{"name": "COHORT_FAULT_KILL", "value": "rank=1,step=5"}],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        }}})
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["team"] == "ml" and meta["labels"]["cohort.dev/job"] == "digits"
    assert meta["annotations"]["a"] == "b"
    assert spec["serviceAccountName"] == "custom"
    assert spec["imagePullSecrets"] == [{"name": "reg"}]
    assert any(v["name"] == "data" for v in spec["volumes"])
    assert any(m["mountPath"] == "/data" for m in spec["containers"][0]["volumeMounts"])
    env = env_of(pod)
    assert env["COHORT_FAULT_KILL"]["value"] == "rank=1,step=5"
    assert env["COHORT_WORLD"]["value"] == "configmap:digits-world"


def test_no_template_volume_is_dropped_and_none_can_take_the_operators_names():
    """Issue 32: a template volume named like one of the operator's was dropped without a word. Admission
    now refuses those names (one list, cohort.api.models.RESERVED_VOLUMES, the one the pod uses), and every
    template volume and mount that passes reaches the pod."""

    from cohort.api.models import RESERVED_VOLUMES
    from cohort.api.schema import ValidationError

    template = {"volumes": [{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
                "containers": [{"volumeMounts": [{"name": "data", "mountPath": "/data"},
                                                 {"name": "data", "mountPath": "/data2", "subPath": "x"},
                                                 {"name": "cache", "mountPath": "/cache"}]}]}
    pod = pod_for({"podTemplate": {"spec": template}, "resources": {"limits": {"nvidia.com/gpu": 1}},
                   "checkpoint": {"path": "/ckpt"}})
    ours = {v["name"] for v in pod["spec"]["volumes"]} - {"data", "cache"}
    assert ours == set(RESERVED_VOLUMES), ours  # the pod's own volumes are exactly the reserved names
    assert [v for v in pod["spec"]["volumes"] if v["name"] in ("data", "cache")] == template["volumes"]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert [m for m in mounts if m["name"] in ("data", "cache")] == template["containers"][0]["volumeMounts"]
    for name in RESERVED_VOLUMES:
        with pytest.raises(ValidationError, match=r"^spec\.podTemplate\.spec\.volumes: .*operator's own"):
            parse(TrainingJobSpec, with_workload({"podTemplate": {"spec": {"volumes": [{"name": name}]}}}))
        with pytest.raises(ValidationError, match=r"^spec\.podTemplate\.spec\.containers\[0\]\.volumeMounts: "):
            parse(TrainingJobSpec, with_workload({"podTemplate": {"spec": {"containers": [
                {"volumeMounts": [{"name": name, "mountPath": "/elsewhere"}]}]}}}))


def test_a_template_may_not_set_the_contracts_env_or_mount_at_the_operators_paths():
    """Issue 32: a template's COHORT_WORLD (or any contract variable) was dropped without a word, and a mount
    at /tmp, /etc/cohort or the checkpoint path passed admission and then made every pod invalid. Admission
    refuses each, naming the field; what passes reaches the pod whole."""

    from cohort.api.models import CONTRACT_ENV, RESERVED_MOUNT_PATHS
    from cohort.api.schema import ValidationError

    assert [e["name"] for e in pod_for()["spec"]["containers"][0]["env"]][:len(CONTRACT_ENV)] == list(CONTRACT_ENV)

    def template(**container):
        return with_workload({"podTemplate": {"spec": {"volumes": [{"name": "data", "emptyDir": {}}],
                                                       "containers": [container]}}})

    for name in CONTRACT_ENV:
        with pytest.raises(ValidationError, match=rf"^spec\.podTemplate\.spec\.containers\[0\]\.env: .*{name}"):
            parse(TrainingJobSpec, template(env=[{"name": "MINE", "value": "1"}, {"name": name, "value": "x"}]))
    for path in RESERVED_MOUNT_PATHS:
        with pytest.raises(ValidationError, match=r"^spec\.podTemplate\.spec\.containers\[0\]\.volumeMounts: "):
            parse(TrainingJobSpec, template(volumeMounts=[{"name": "data", "mountPath": path}]))
    at_checkpoints = template(volumeMounts=[{"name": "data", "mountPath": "/ckpt"}])
    with pytest.raises(ValidationError, match=r"^spec\.podTemplate\.spec\.containers: a volumeMount at "
                                              r"spec\.checkpoint\.path"):
        parse(TrainingJobSpec, {**at_checkpoints, "checkpoint": {"path": "/ckpt"}})
    parse(TrainingJobSpec, {**at_checkpoints, "checkpoint": {"path": "s3://bucket/ckpt"}})  # no volume there
    with pytest.raises(ValidationError, match=r"^spec\.podTemplate\.spec\.containers\[0\]\.env\[0\]\.name: required"):
        parse(TrainingJobSpec, template(env=[{"value": "x"}]))

    user_env = [{"name": "COHORT_FAULT_KILL", "value": "rank=1,step=5"}, {"name": "COHORT_WORLDS", "value": "y"}]
    pod = pod_for(template(env=user_env, volumeMounts=[{"name": "data", "mountPath": "/tmp/data"}]))
    env = pod["spec"]["containers"][0]["env"]
    assert env[len(CONTRACT_ENV):len(CONTRACT_ENV) + 2] == user_env
    assert {"name": "data", "mountPath": "/tmp/data"} in pod["spec"]["containers"][0]["volumeMounts"]


def test_replacement_avoids_the_straggler_node_in_every_term():
    pod = pod_for(replaces="digits-worker-1", avoid=["node-a"])
    assert pod["metadata"]["annotations"]["cohort.dev/replaces"] == "digits-worker-1"
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-a"]}]}]
    user = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}
    merged = avoid_nodes(user, ["n1"])
    for term in merged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]:
        assert term["matchExpressions"][-1]["values"] == ["n1"]
    assert len(user["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
               ["matchExpressions"]) == 1  # the input is not mutated


def test_gang_fields_are_applied():
    pod = pod_for(gang={"labels": {"scheduling.x-k8s.io/pod-group": "digits"},
                        "spec": {"schedulingGroup": {"podGroupName": "digits"}}})
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "digits"
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "digits"}


def test_job_config_is_the_stored_spec_verbatim():
    job = make_job(spec={"replicas": {"min": 1, "max": 2, "target": 2}})
    doc = build_job_config(job)
    assert doc["apiVersion"] == "cohort.dev/v1alpha1" and doc["kind"] == "JobConfig"
    assert doc["job"] == {"name": "digits", "namespace": "ns", "uid": "uid-digits"}
    assert doc["spec"] == job["spec"]
    assert doc["runtime"] == {"metricsPort": 9400, "rendezvousPort": 29400}
    assert json.loads(render_job_config(job)) == doc
    assert json.loads(build_config_map(job)["data"]["job.json"]) == doc


def test_service_pdb_rbac_and_world_map():
    job = make_job(spec={"replicas": {"min": 3, "max": 8, "target": 4}})
    spec = parse(TrainingJobSpec, job["spec"])
    svc = build_service(job)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"cohort.dev/job": "digits", "cohort.dev/role": "worker"}
    pdb = build_pdb(job, spec)
    assert pdb["spec"]["minAvailable"] == 3
    sa, role, binding = build_worker_rbac(job, spec)
    assert sa["kind"] == "ServiceAccount"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["digits-world"],
                              "verbs": ["get", "watch", "list"]},
                             {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["digits-reports"],
                              "verbs": ["patch"]}]  # a survivor's report (reports.py), nothing else writable
    before, _after = owned_objects(job, spec)
    assert [o["metadata"]["name"] for o in before if o["kind"] == "ConfigMap"] == ["digits-config", "digits-reports"]
    assert binding["subjects"][0]["name"] == "digits-worker"
    for obj in (svc, pdb, sa, role, binding):
        assert obj["metadata"]["ownerReferences"][0]["controller"] is True
    world = World(version=2, members=(Member("a", "u1", "10.0.0.1"), Member("b", "u2", "10.0.0.2")),
                  spares=(Member("c", "u3", "10.0.0.3"),), reason="r")
    data = json.loads(build_world_map(job, world)["data"]["world.json"])
    assert data["version"] == 2 and data["master"] == {"addr": "10.0.0.1", "port": 29400}
    assert [m["rank"] for m in data["members"]] == [0, 1]
    assert data["spares"] == [{"pod": "c", "uid": "u3", "ip": "10.0.0.3"}] and data["plan"] is None


def test_network_policy_admits_only_the_jobs_own_workers_and_precedes_the_pods():
    job = make_job()
    spec = parse(TrainingJobSpec, job["spec"])
    policy = build_network_policy(job)
    workers = {"matchLabels": {"cohort.dev/job": "digits", "cohort.dev/role": "worker"}}
    assert policy["spec"] == {"podSelector": workers, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": workers}]}]}
    assert policy["metadata"]["ownerReferences"][0]["controller"] is True
    before, after = owned_objects(job, spec, network_policy=True)
    assert "NetworkPolicy" in [o["kind"] for o in before]  # ensured before any pod is created
    assert "NetworkPolicy" not in [o["kind"] for o in after]
    assert all(o["kind"] != "NetworkPolicy" for o in sum(owned_objects(job, spec), []))


def test_rbac_binds_a_user_service_account():
    job = make_job(spec={"podTemplate": {"spec": {"serviceAccountName": "mine"}}})
    objs = build_worker_rbac(job, parse(TrainingJobSpec, job["spec"]))
    assert [o["kind"] for o in objs] == ["Role", "RoleBinding"]
    assert objs[1]["subjects"][0]["name"] == "mine"


def test_a_gpu_in_requests_only_becomes_the_limit_too():
    """Kubernetes refuses an extended resource without a limit; the user's other requests stay requests."""
    spec = parse(TrainingJobSpec, with_workload({"resources": {"requests": {"nvidia.com/gpu": 1, "cpu": "2"}}}))
    resources = container_resources(spec.resources)
    assert resources == {"requests": {"nvidia.com/gpu": 1, "cpu": "2"}, "limits": {"nvidia.com/gpu": 1}}
    spec = parse(TrainingJobSpec, with_workload({"resources": {"limits": {"cpu": "1"}}}))
    assert container_resources(spec.resources) == {"limits": {"cpu": "1"}}


@pytest.mark.parametrize(("group_timeout", "threshold"), [(60, 12), (61, 13), (600, 120), (1, 3)])
def test_a_worker_that_answers_nothing_for_the_group_timeout_fails_its_liveness_probe(group_timeout, threshold):
    """Liveness (pods.probes): a frozen worker left the world once not Ready but kept its pod, so nothing took
    its place; its kubelet now kills it after processGroupTimeoutSeconds of silence (no fewer than 3 probes)."""
    c = pod_for({"faultTolerance": {"processGroupTimeoutSeconds": group_timeout}})["spec"]["containers"][0]
    live = c["livenessProbe"]
    assert live["failureThreshold"] == threshold and live["periodSeconds"] == live["timeoutSeconds"] == 5
    assert live["failureThreshold"] * live["periodSeconds"] >= group_timeout
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] == 300
