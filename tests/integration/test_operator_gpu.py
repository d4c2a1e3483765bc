"""GPU jobs on the real control plane: kwok nodes with fake nvidia.com/gpu capacity (hack/cluster.sh).

The real operator (tests/support/operator.py) creates the workers, the real
scheduler places them by their GPU request, and kwok runs them. What is
checked is what reaches the API server: the CUDA image, the memory-backed
/dev/shm with its sizeLimit, the NCCL defaults, the GPU limit and the node, and
the refusal of a worker asking for two GPUs (the CRD's CEL ``quantity()`` rule).
"""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from cohort.operator.settings import Settings
from tests.support.kube import wait_for
from tests.support.operator import (  # noqa: F401  (operator_fixture is the ``operator`` fixture)
    KWOK_TOLERATION,
    job_manifest,
    operator_fixture,
    pods,
    wait_phase,
)

pytestmark = pytest.mark.k8s

GPU = "nvidia.com/gpu"


def gpu_job(name: str, gpus: int | str, **sections):
    """A job for the shared kwok nodes (8 GPUs each) whose workers ask for ``gpus`` GPUs."""
    resources = {"limits": {GPU: gpus, "memory": "4Gi"}, **sections.pop("resources", {})}
    return job_manifest(name, resources=resources, **sections)


@pytest.fixture
def gpu_and_cpu_node(cluster, namespace):
    """Two kwok nodes of this test's own, alike but for nvidia.com/gpu (2 and none), tainted so that
    only this test's pods go there: (selector, tolerations, gpu node, cpu node)."""
    key = "cohort.dev/test-node"
    names = {"gpu": f"{namespace}-gpu"[:63], "cpu": f"{namespace}-cpu"[:63]}
    for kind, name in names.items():
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **({GPU: "2"} if kind == "gpu" else {})}
        cluster.core.create_node({
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, key: namespace}},
            "spec": {"taints": [{"key": key, "value": namespace, "effect": "NoSchedule"}]},
            "status": {"capacity": resources, "allocatable": resources}})
    tolerations = [KWOK_TOLERATION, {"key": key, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}]

    def schedulable(name: str) -> bool:  # kwok has made it Ready and the not-ready taint is gone
        node = cluster.core.read_node(name)
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        return ready and [t.key for t in node.spec.taints or []] == [key]

    wait_for(lambda: all(schedulable(n) for n in names.values()), 30, what="both test nodes schedulable")
    yield {key: namespace}, tolerations, names["gpu"], names["cpu"]
    for name in names.values():
        cluster.core.delete_node(name)


def env_of(pod) -> dict[str, str | None]:
    return {e.name: e.value for e in pod.spec.containers[0].env}


def test_gpu_workers_get_the_cuda_image_a_memory_shm_and_nccl_defaults_on_the_gpu_node(
        cluster, namespace, operator, gpu_and_cpu_node):
    selector, tolerations, gpu_node, cpu_node = gpu_and_cpu_node
    user_env = [{"name": "NCCL_DEBUG", "value": "INFO"}]
    cluster.create_job(namespace, gpu_job("gpu", 1, resources={"shmSize": "2Gi"},
                                          scheduling={"nodeSelector": selector, "tolerations": tolerations},
                                          podTemplate={"spec": {"containers": [{"env": user_env}]}}))
    wait_phase(cluster, namespace, "gpu", "Running", timeout_s=60)
    workers = pods(cluster, namespace, "gpu")
    assert len(workers) == 2
    for pod in workers:
        c = pod.spec.containers[0]
        assert c.image == Settings().default_cuda_image  # the operator's default for GPU workers
        assert c.resources.limits[GPU] == "1" and c.resources.requests[GPU] == "1"
        (mount,) = [m for m in c.volume_mounts if m.mount_path == "/dev/shm"]
        (vol,) = [v for v in pod.spec.volumes if v.name == mount.name]
        assert vol.empty_dir.medium == "Memory" and vol.empty_dir.size_limit == "2Gi"
        env = env_of(pod)
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_SOCKET_IFNAME"] == "eth0"  # the user's value wins
        assert [e.name for e in c.env].count("NCCL_DEBUG") == 1
        assert "NVIDIA_VISIBLE_DEVICES" not in env
        # The scheduler had two nodes to choose from; only one has a GPU.
        assert pod.spec.node_name == gpu_node != cpu_node


def test_a_gpu_job_without_shm_size_gets_the_operators_and_a_cpu_job_sees_no_gpu(cluster, namespace, operator):
    cluster.create_job(namespace, gpu_job("gpu", "1"))
    cluster.create_job(namespace, job_manifest("cpu"))
    gpu_pods = wait_for(lambda: pods(cluster, namespace, "gpu") or None, 30, what="GPU pods")
    cpu_pods = wait_for(lambda: pods(cluster, namespace, "cpu") or None, 30, what="CPU pods")
    (shm,) = [v for v in gpu_pods[0].spec.volumes if v.empty_dir and v.empty_dir.medium == "Memory"]
    assert shm.empty_dir.size_limit == Settings().gpu_shm_size == "8Gi"
    cpu = cpu_pods[0]
    assert cpu.spec.containers[0].image == Settings().default_image
    assert env_of(cpu)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not [m for m in cpu.spec.containers[0].volume_mounts if m.mount_path == "/dev/shm"]
    assert not {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME"} & set(env_of(cpu))


@pytest.mark.parametrize("section, gpus", [("limits", 2), ("requests", "2")])
def test_a_job_asking_for_two_gpus_per_worker_is_refused_naming_the_field(cluster, namespace, section, gpus):
    manifest = job_manifest("two", resources={section: {GPU: gpus}})
    with pytest.raises(ApiException) as err:
        cluster.create_job(namespace, manifest)
    assert err.value.status == 422, err.value.body
    assert f"spec.resources.{section}['{GPU}']" in err.value.body and "must be 0 or 1" in err.value.body
