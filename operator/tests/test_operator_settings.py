"""Settings from flags, env and defaults."""

from __future__ import annotations

import pytest

from cohort.operator.settings import OPTIONS, Settings, field_doc, load_settings


def test_defaults():
    s = load_settings([], environ={})
    assert s.namespaces == () and s.clusterwide
    assert (s.metrics_port, s.health_port) == (8080, 8081)
    assert s.standalone is False and s.identity


def test_env_then_flags_win():
    env = {"COHORT_NAMESPACES": "a, b", "COHORT_RESYNC_SECONDS": "5", "COHORT_STANDALONE": "true",
           "COHORT_DEFAULT_IMAGE": "img:env", "POD_NAME": "op-0", "POD_NAMESPACE": "cohort-system"}
    s = load_settings([], environ=env)
    assert s.namespaces == ("a", "b") and s.resync_s == 5.0 and s.standalone
    assert s.identity == "op-0" and s.lease_namespace == "cohort-system" and s.default_image == "img:env"
    s = load_settings(["--namespace", "x", "--namespace", "y", "--resync-seconds", "7",
                       "--max-concurrent-reconciles", "3"], environ=env)
    assert s.namespaces == ("x", "y") and s.resync_s == 7.0 and s.max_concurrent_reconciles == 3


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="COHORT_METRICS_PORT"):
        load_settings([], environ={"COHORT_METRICS_PORT": "http"})
    with pytest.raises(ValueError, match="resync_s"):
        load_settings(["--resync-seconds", "0"], environ={})
    with pytest.raises(ValueError):
        load_settings([], environ={"COHORT_STANDALONE": "maybe"})


def test_every_setting_has_a_flag_an_env_var_and_a_doc():
    names = {o[0] for o in OPTIONS}
    assert names == set(Settings.__dataclass_fields__)
    assert all(field_doc(n) for n in names)


def test_an_instance_gets_its_own_lease():
    s = load_settings(["--instance", "canary"], environ={})
    assert s.instance == "canary" and s.lease_name == "cohort-operator-canary"
    assert load_settings(["--instance", "c", "--lease-name", "x"], environ={}).lease_name == "x"


def test_gpu_pod_defaults_come_from_flags_or_env_and_the_shm_size_must_be_a_quantity():
    s = load_settings([], environ={})
    assert s.pod_defaults.cuda_image == "cohort-trainer:0.1.0-cuda" and s.pod_defaults.shm_size == "8Gi"
    s = load_settings(["--gpu-shm-size", "16Gi"],
                      environ={"COHORT_DEFAULT_CUDA_IMAGE": "reg/t:1-cuda", "COHORT_GPU_SHM_SIZE": "1Gi"})
    assert s.pod_defaults.cuda_image == "reg/t:1-cuda" and s.pod_defaults.shm_size == "16Gi"
    for bad in ("8GB", "0", "-1Gi"):
        with pytest.raises(ValueError, match="gpu_shm_size"):
            load_settings([f"--gpu-shm-size={bad}"], environ={})
