"""End to end on real nodes: the operator runs a TrainingJob whose workers are
containers from the trainer image built here, under the restricted Pod
Security Standard, and one worker is OOM-killed by the kernel for exceeding
its memory limit.

Checked from where a user would see it: the worker's uid and read-only root
from inside the running container, the kubelet's OOMKilled verdict in the
operator's Event, the failure counted and replaced, and the job succeeding
with the accuracy target. Then the GPT on real text (examples/gpt-text.yaml)
loses a worker and trains on exactly the samples of its data order, on the
token shards the image prepared at build time.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from cohort.trainer.sampler import ElasticSampler
from tests.support.kube import wait_for
from tests.support.operator import TEST_INSTANCE, kubectl
from tests.support.realnodes import real_nodes, restrict  # noqa: F401
from tests.support.training import REPO, follow_logs, worker_records

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ACCURACY = 0.96


def real_job(name: str, **env: str) -> dict:
    job = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    job["metadata"] = {"name": name, "labels": {"cohort.dev/operator": TEST_INSTANCE}}
    spec = job["spec"]
    spec["replicas"] = {"min": 2, "max": 3, "target": 3}
    spec["scheduling"] = {"nodeSelector": {"cohort.dev/node-kind": "real"}}
    spec["faultTolerance"] = {"backoffSeconds": 1, "maxBackoffSeconds": 4, "belowMinTimeoutSeconds": 120}
    spec["resources"] = {"limits": {"memory": "1536Mi", "cpu": "2"}, "requests": {"memory": "256Mi", "cpu": "100m"}}
    if env:
        spec["podTemplate"] = {"spec": {"containers": [
            {"name": "trainer", "env": [{"name": k, "value": v} for k, v in env.items()]}]}}
    return job


def test_job_in_containers_survives_an_oom_killed_worker(cluster, namespace, real_nodes, operator):  # noqa: F811
    restrict(cluster, namespace)
    cluster.create_job(namespace, real_job("oom", COHORT_FAULT_OOM="rank=1,step=150,mb=4096"))

    # From inside a running worker: the image's user and a read-only root file system.
    def running_worker() -> str | None:
        for p in cluster.job_pods(namespace, "oom"):
            if p.status.phase == "Running" and all(c.ready for c in p.status.container_statuses or []):
                return p.metadata.name
        return None
    worker = wait_for(running_worker, 180, 1, what="a Ready worker container")
    out = kubectl(cluster, "exec", "-n", namespace, worker, "--", "python", "-c",
                  "import json, os\ntry:\n    open('/probe', 'w'); ro = False\n"
                  "except OSError as e:\n    ro = e.errno == 30\n"
                  "print(json.dumps({'uid': os.getuid(), 'read_only_root': ro}))")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"uid": 65532, "read_only_root": True}

    def finished() -> dict | None:
        job = cluster.get_job(namespace, "oom")
        return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None
    job = wait_for(finished, 420, 1, what="the job finished")
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["progress"]["accuracy"] >= ACCURACY, status["progress"]
    assert status["replacements"]["failure"] >= 1, status
    failed = [e.message for e in cluster.events(namespace, "oom") if e.reason == "WorkerFailed"]
    assert any("OOMKilled" in m and "exit code 137" in m for m in failed), failed
    nodes = {p.spec.node_name for p in cluster.job_pods(namespace, "oom")}
    assert nodes <= set(real_nodes)


STEPS, GLOBAL_BATCH = 40, 64


def test_gpt_text_in_containers_survives_a_killed_worker_with_exact_data_resume(
        cluster, namespace, real_nodes, operator):  # noqa: F811
    """examples/gpt-text.yaml, shortened to 40 steps, on the real nodes: rank 1 is killed at step 20, and the
    indices every step trained on (COHORT_SAMPLE_LOG, on a hostPath) are exactly the job's data order."""
    samples = Path(tempfile.mkdtemp(prefix="cohort-samples-"))
    samples.chmod(0o777)  # the workers run as uid 65532
    job = yaml.safe_load((REPO / "examples/gpt-text.yaml").read_text())
    job["metadata"] = {"name": "gpt", "labels": {"cohort.dev/operator": TEST_INSTANCE}}
    spec = job["spec"]
    spec["workload"].update(maxSteps=STEPS)
    spec["checkpoint"] = {"everySteps": 10, "keep": 2}
    spec["scheduling"] = {"nodeSelector": {"cohort.dev/node-kind": "real"}}
    spec["faultTolerance"] = {"backoffSeconds": 1, "maxBackoffSeconds": 4}
    spec["resources"] = {"limits": {"memory": "2Gi"}, "requests": {"memory": "256Mi", "cpu": "100m"}}
    spec["podTemplate"] = {"spec": {
        "volumes": [{"name": "samples", "hostPath": {"path": str(samples), "type": "Directory"}}],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "samples", "mountPath": "/samples"}],
                        "env": [{"name": "COHORT_SAMPLE_LOG", "value": "/samples"},
                                {"name": "COHORT_FAULT_KILL", "value": "rank=1,step=20"}]}]}}
    try:
        follow_logs(cluster, namespace, "gpt")
        cluster.create_job(namespace, job)

        def finished() -> dict | None:
            j = cluster.get_job(namespace, "gpt")
            return j if j.get("status", {}).get("phase") in ("Succeeded", "Failed") else None
        status = wait_for(finished, 600, 2, what="the gpt job finished")["status"]
        assert status["phase"] == "Succeeded", status
        assert status["replacements"]["failure"] >= 1, status
        assert status["progress"]["perplexity"] < 2000, status["progress"]  # 4096 tokens: a uniform guess is 4096
        assert status["progress"]["evalLoss"] < 7.6, status["progress"]  # ln 4096 = 8.3

        recs = [json.loads(line) for f in sorted(samples.glob("*.jsonl")) for line in f.read_text().splitlines()]
        last = {}  # step -> the world whose state went on (the last to run it)
        for r in recs:
            last[r["step"]] = max(last.get(r["step"], 0), r["world_version"])
        assert sorted(last) == list(range(STEPS)), sorted(last)
        kept = [r for r in recs if r["world_version"] == last[r["step"]]]
        perm = ElasticSampler(kept[0]["samples"], 16, seed=0, global_batch_size=GLOBAL_BATCH)._permutation()
        for step in range(STEPS):
            got = sorted(i for r in kept if r["step"] == step for i in r["indices"])
            want = sorted(perm[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH].tolist())
            assert got == want, f"step {step}: trained on other samples than the data order's"
        assert len({r["world_version"] for r in kept}) >= 2, "no world change was seen"
        # Every worker (a replacement too) found the shards the trainer image prepared at build time.
        records = worker_records(namespace, "gpt")
        assert len({r["_pod"] for r in records if r.get("msg") == "joined world"}) >= 4, "the workers' logs"
        prepared = [r for r in records if str(r.get("msg")).startswith("python-source:")]
        assert not prepared, f"workers prepared python-source themselves: {prepared[:2]}"
    finally:
        shutil.rmtree(samples, ignore_errors=True)
