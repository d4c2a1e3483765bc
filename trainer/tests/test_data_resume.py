"""Exact data resume from files: every sample once per epoch across a restart and world-size changes (marker dist).

Real trainer processes read token shards from disk through the prefetching
loader (one DataLoader worker each) and log the indices of every step they
complete (COHORT_SAMPLE_LOG). The job runs at 2 workers until a checkpoint,
is SIGKILLed whole, resumes at 3 workers, and one of those dies: the world
goes on at 2. A step that ran in more than one world (after the restart, the
steps past the checkpoint ran again) counts once, from the world whose state
went on: the last one to run it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.support.local import kill_tree, run_local, start_local

from cohort.trainer.workloads.tokens import write_shards

pytestmark = [pytest.mark.dist]

WINDOWS, SEQ, GLOBAL, EPOCHS = 240, 8, 6, 2
STEPS_PER_EPOCH = WINDOWS // GLOBAL  # 40


def job(shards: Path) -> dict:
    return {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "resume"},
            "spec": {"workload": {"model": "transformer", "modelArgs": {"dim": 16, "n_layers": 1, "n_heads": 2},
                                  "dataset": "tokens", "datasetArgs": {"path": str(shards), "seq_len": SEQ},
                                  "epochs": EPOCHS, "batchSize": 2, "globalBatchSize": GLOBAL,
                                  "dataLoaderWorkers": 1, "optimizer": {"name": "adamw", "lr": 0.001}},
                     "replicas": {"min": 1, "max": 4, "target": 2},
                     "checkpoint": {"everySteps": 10, "keep": 5}}}


def records(log_dir: Path, phase: int) -> list[dict]:
    return [{**json.loads(line), "phase": phase} for f in sorted(log_dir.glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def test_every_sample_once_per_epoch_across_a_restart_and_2_3_2_workers(tmp_path):
    ids = np.random.default_rng(0).integers(0, 50, WINDOWS * SEQ + 1)
    shards = write_shards(tmp_path / "shards", {"train": ids, "eval": ids[:200]}, vocab_size=50)
    m, ck = job(shards), tmp_path / "ck"

    (tmp_path / "a").mkdir()
    # The killed trainers cannot remove their loader's temp dirs (pymp-*): they go under tmp_path, not /tmp.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # Both workers SIGKILL themselves at step 35 (a kill at a known step: waiting for a checkpoint's marker
    # and then killing raced the asynchronous commit); without replacements the launcher gives up.
    proc = start_local(tmp_path / "a", m, workers=2, ckpt=ck, extra=["--no-replace"],
                       env={"COHORT_SAMPLE_LOG": str(tmp_path / "log-a"), "COHORT_FAULT_KILL": "rank=all,step=35",
                            "TMPDIR": str(tmp)})
    assert proc.wait(timeout=240) != 0
    kill_tree(proc)
    assert (ck / "resume/step-00000020/COMMITTED").exists()

    s = run_local(tmp_path / "b", m, workers=3, ckpt=ck, extra=["--no-replace"],
                  env={"COHORT_SAMPLE_LOG": str(tmp_path / "log-b"), "COHORT_FAULT_KILL": "rank=1,step=55",
                       "TMPDIR": str(tmp)})
    assert s["step"] == EPOCHS * STEPS_PER_EPOCH, s

    recs = records(tmp_path / "log-a", 0) + records(tmp_path / "log-b", 1)
    last = {}  # step -> the (phase, world version) whose state went on
    for r in recs:
        last[r["step"]] = max(last.get(r["step"], (0, 0)), (r["phase"], r["world_version"]))
    kept = [r for r in recs if (r["phase"], r["world_version"]) == last[r["step"]]]
    assert sorted(last) == list(range(EPOCHS * STEPS_PER_EPOCH))
    for epoch in range(EPOCHS):
        seen = sorted(i for r in kept if r["epoch"] == epoch for i in r["indices"])
        assert seen == list(range(WINDOWS)), f"epoch {epoch}: not every sample exactly once"
    sizes = [size for _, size in sorted({(r["phase"], r["world_version"]): r["size"] for r in kept}.items())]
    assert sizes[:3] == [2, 3, 2], sizes


def test_a_finished_run_leaves_no_loader_process_temp_dir_or_warning_behind(tmp_path):
    """The loader's workers come from a fork server, whose lifetime is theirs: they must exit with the trainer,
    leave no ``pymp-*`` directory in $TMPDIR, and end before it, so that its log ends with no warning of leaked
    semaphores (before: every run's did) or a worker's traceback. The run checkpoints (rank 0 alone, DCP's
    ``no_dist``): DCP's warning that it assumes a single process is not in the log either."""
    import os
    import time
    import uuid

    ids = np.random.default_rng(0).integers(0, 50, WINDOWS * SEQ + 1)
    shards = write_shards(tmp_path / "shards", {"train": ids, "eval": ids[:200]}, vocab_size=50)
    m = job(shards)
    m["spec"]["workload"].update(epochs=0, maxSteps=5)
    mark = f"COHORT_TEST_MARK={uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run_local(tmp_path / "run", m, workers=2, env={"COHORT_TEST_MARK": mark.split("=", 1)[1], "TMPDIR": str(tmp)})

    def marked() -> list[int]:
        pids = []
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit() and mark.encode() in (p / "environ").read_bytes().split(b"\0"):
                    pids.append(int(p.name))
            except OSError:
                pass
        return pids

    deadline = time.monotonic() + 10
    while marked() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert marked() == [], "processes of the finished run are still alive"
    assert not list(tmp.glob("pymp-*")), [sorted(os.listdir(d)) for d in tmp.glob("pymp-*")]
    logs = sorted((tmp_path / "run" / "run").glob("*.log"))
    assert len(logs) == 2
    for log in logs:
        text = log.read_text()
        assert "Warning" not in text and "Traceback" not in text, (log.name, text[-2000:])
