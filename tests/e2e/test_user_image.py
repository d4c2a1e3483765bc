"""End to end: a user's own image on the real nodes, submitted with ``cohort submit --watch``.

docs/workloads.md's user-image Dockerfile (read from the docs, so the two
cannot drift) is built around examples/user-package/cohort_user_example,
copied outside the repository, by ``hack/user-image.sh build`` (``make
user-image``), which loads it into every real node: only its own layer, the
trainer's being unpacked there already. The package's own job
(text-files.yaml: its dataset of text files, its GRU) trains on that image in
a restricted namespace, the text on a ConfigMap volume mounted through
``spec.podTemplate``, submitted as a user would: ``cohort submit --watch``
prints progress and exits 0 when the job Succeeds. A job of the same image
whose data is missing makes the command exit 1 with the failure's reason.
``cohort logs`` then reads the real containers' logs (kwok's pods, in the
integration tier, have none).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest
import yaml

from tests.support.operator import TEST_INSTANCE
from tests.support.realnodes import real_nodes, restrict  # noqa: F401
from tests.support.training import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
USER_IMAGE = REPO / "hack/user-image.sh"


def docs_dockerfile() -> str:
    """The Dockerfile of docs/workloads.md's "A user image" section."""
    text = (REPO / "docs/workloads.md").read_text()
    section = text[text.index("### A user image"):]
    return re.search(r"```dockerfile\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def user_image(tmp_path):
    """The docs' image, built from a context outside the repository and loaded into every real node."""
    ctx = tmp_path / "context"
    shutil.copytree(REPO / "examples/user-package/cohort_user_example", ctx / "cohort_user_example")
    (ctx / "Dockerfile").write_text(docs_dockerfile())
    name = f"cohort-e2e-user:{uuid.uuid4().hex[:8]}"  # new each run: a stale image cannot pass the test
    out = subprocess.run([str(USER_IMAGE), "build", name, str(ctx / "Dockerfile")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(rf"loaded .*{re.escape(name)}.* into 2 node\(s\)", out.stderr), out.stderr[-2000:]
    # The trainer's layers, already unpacked on both nodes, were not exported; the job below needs the layer that was.
    assert re.search(r"exporting .*: \d+ layer\(s\), [\d.]+ GB, already on every node, left out", out.stderr), out.stderr[-2000:]
    yield name
    subprocess.run([str(USER_IMAGE), "remove", name], capture_output=True, timeout=120)


def text_job(name: str, image: str, root: str) -> dict:
    job = yaml.safe_load((REPO / "examples/user-package/text-files.yaml").read_text())
    job["metadata"] = {"name": name, "labels": {"cohort.dev/operator": TEST_INSTANCE}}
    spec = job["spec"]
    spec["image"] = image
    spec["workload"].update(epochs=0, maxSteps=60, dataLoaderWorkers=0)
    spec["workload"]["datasetArgs"]["root"] = root
    spec["replicas"] = {"min": 1, "max": 2, "target": 2}
    spec["scheduling"] = {"nodeSelector": {"cohort.dev/node-kind": "real"}}
    spec["faultTolerance"] = {"maxRestarts": 0}
    spec["resources"] = {"limits": {"memory": "1536Mi", "cpu": "1"}, "requests": {"memory": "256Mi", "cpu": "100m"}}
    spec["podTemplate"] = {"spec": {
        "volumes": [{"name": "text", "configMap": {"name": "text"}}],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "text", "mountPath": "/data", "readOnly": True}]}]}}
    return job


def cohort(cluster, namespace: str, *args: str) -> subprocess.Popen[str]:
    """The ``cohort`` CLI, as a user runs it against this cluster."""
    return subprocess.Popen([sys.executable, "-m", "cohort.client.cli", *args, "-n", namespace],
                            env={**os.environ, "KUBECONFIG": cluster.kubeconfig},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_users_image_trains_on_the_real_nodes_submitted_with_cohort_submit_watch(
        cluster, namespace, real_nodes, operator, user_image, tmp_path):  # noqa: F811
    restrict(cluster, namespace)
    # Real text (the docs) on a ConfigMap volume, 00.txt ... NN.txt.
    docs = sorted((REPO / "docs").glob("*.md"))
    cluster.core.create_namespaced_config_map(namespace, {
        "metadata": {"name": "text"}, "data": {f"{i:02d}.txt": f.read_text() for i, f in enumerate(docs)}})
    manifests = {}
    for name, root in (("text", "/data"), ("nodata", "/data/missing")):
        manifests[name] = tmp_path / f"{name}.yaml"
        manifests[name].write_text(yaml.safe_dump(text_job(name, user_image, root)))
    watches = {name: cohort(cluster, namespace, "submit", str(path), "--watch", "--timeout", "420")
               for name, path in manifests.items()}
    out = {name: (*w.communicate(timeout=480), w.returncode) for name, w in watches.items()}

    stdout, stderr, rc = out["text"]
    assert rc == 0, (stdout[-2000:], stderr[-2000:])
    lines = stdout.splitlines()
    assert lines[0] == f"trainingjob.cohort.dev/text created (namespace {namespace})"
    # A line per change while it ran: phase, bar, percent, step, ETA, loss, rate, world, recoveries.
    steps = [int(m.group(1)) for m in (re.match(r"text +Running .* step (\d+) .* world [12] ", ln) for ln in lines) if m]
    assert any(0 < s < 60 for s in steps), stdout
    assert re.search(r"TrainingJob text succeeded: 60 steps, loss [\d.]+, perplexity ([\d.]+)", lines[-1]), lines[-1]
    perplexity = float(re.search(r"perplexity ([\d.]+)", lines[-1]).group(1))
    assert perplexity < 40, lines[-1]  # bytes: a model that learned nothing stays near 256
    job = cluster.get_job(namespace, "text")
    assert job["status"]["phase"] == "Succeeded"
    pods = cluster.job_pods(namespace, "text")
    assert {p.spec.containers[0].image for p in pods} == {user_image}
    assert {p.spec.node_name for p in pods} <= set(real_nodes)

    # `cohort logs`: the real container logs, rank 0's alone and every worker's prefixed by its pod.
    stdout, stderr = (logs := cohort(cluster, namespace, "logs", "text", "--rank", "0")).communicate(timeout=60)
    assert logs.returncode == 0, stderr
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert any(r["msg"] == "training complete" and r["step"] == 60 and r["rank"] == 0 for r in records), stdout[-2000:]
    stdout, stderr = (logs := cohort(cluster, namespace, "logs", "text")).communicate(timeout=60)
    assert logs.returncode == 0, stderr
    assert {line.split("]")[0] + "]" for line in stdout.splitlines()} == {f"[{p.metadata.name}]" for p in pods}

    stdout, stderr, rc = out["nodata"]
    assert rc == 1, (stdout[-2000:], stderr[-2000:])
    assert "error: TrainingJob nodata failed: " in stderr, stderr
    assert "no files match '*.txt' under /data/missing" in stderr, stderr  # the worker's own error, as the reason
