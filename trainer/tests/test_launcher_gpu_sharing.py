"""``cohort run --local`` on a GPU machine: what NCCL is told when several workers share one GPU.

The decision is a pure function of the worker count, the GPUs, NCCL's version and the
environment, so it is checked here without a GPU.
"""

from __future__ import annotations

from cohort.trainer.launcher import nccl_sharing_env, nccl_version_tuple


def test_below_2_30_each_worker_gets_its_own_host_id_and_loopback():
    a = nccl_sharing_env(2, 1, (2, 28, 9), "job-worker-0", {})
    b = nccl_sharing_env(2, 1, (2, 28, 9), "job-worker-1", {})
    assert a == {"NCCL_HOSTID": "job-worker-0", "NCCL_SOCKET_IFNAME": "lo"}
    assert b["NCCL_HOSTID"] != a["NCCL_HOSTID"]
    # an interface the user chose stays theirs
    assert nccl_sharing_env(3, 1, (2, 29, 0), "w", {"NCCL_SOCKET_IFNAME": "eth0"}) == {"NCCL_HOSTID": "w"}


def test_from_2_30_the_multi_rank_opt_in():
    assert nccl_sharing_env(2, 1, (2, 30, 0), "w", {}) == {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    assert nccl_sharing_env(3, 1, (3, 0, 1), "w", {}) == {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}


def test_nothing_when_no_gpu_is_shared_or_nccl_is_not_used():
    assert nccl_sharing_env(1, 1, (2, 28, 9), "w", {}) == {}        # one worker, one GPU
    assert nccl_sharing_env(2, 2, (2, 28, 9), "w", {}) == {}        # a GPU each
    assert nccl_sharing_env(4, 0, None, "w", {}) == {}              # a CPU machine
    assert nccl_sharing_env(4, 1, None, "w", {}) == {}              # torch without NCCL
    assert nccl_sharing_env(4, 1, (2, 28, 9), "w", {"COHORT_DEVICE": "cpu"}) == {}
    assert nccl_sharing_env(4, 1, (2, 28, 9), "w", {"COHORT_PG_BACKEND": "cpu:gloo,cuda:gloo"}) == {}
    assert nccl_sharing_env(4, 1, (2, 28, 9), "w", {"COHORT_DEVICE": ""}) != {}   # empty: the default, cuda


def test_a_user_choice_is_kept():
    assert nccl_sharing_env(2, 1, (2, 28, 9), "w", {"NCCL_HOSTID": "mine"}) == {}
    assert nccl_sharing_env(2, 1, (2, 28, 9), "w", {"NCCL_MULTI_RANK_GPU_ENABLE": "0"}) == {}
    assert nccl_sharing_env(2, 1, (2, 30, 0), "w", {"NCCL_HOSTID": "mine"}) == {}


def test_nccl_version_forms():
    assert nccl_version_tuple((2, 28, 9)) == (2, 28, 9)
    assert nccl_version_tuple(22809) == (2, 28, 9)
    assert nccl_version_tuple(23001) == (2, 30, 1)
    assert nccl_version_tuple(2708) == (2, 7, 8)
    assert nccl_version_tuple(0) is None and nccl_version_tuple(None) is None
