"""SIGTERM is obeyed while a worker waits for the next world, and `cohort run --local` stops its workers on it."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from tests.support.local import manifest, wait_for_file, write_manifest
from tests.support.wait import wait_for

from cohort.trainer import trainer as trainer_mod
from cohort.trainer.runtime.world import Member, World, WorldSource
from cohort.trainer.trainer import Terminated, Trainer


def test_a_worker_waiting_for_the_next_world_leaves_at_sigterm(monkeypatch):
    """After a failed collective a worker waits up to COHORT_RECOVERY_WAIT_S for the operator's next world;
    a SIGTERM meanwhile (its pod is being deleted) ends the wait, instead of the grace period's SIGKILL."""
    monkeypatch.setenv("COHORT_RECOVERY_WAIT_S", "2")
    t = Trainer.__new__(Trainer)  # only the waiting: no model, no plan (so nothing to checkpoint)
    t.plan, t.worlds = None, WorldSource()
    world = World(1, (Member(0, "w-0", "127.0.0.1"),), "127.0.0.1", 29400)
    assert t._newer_world_arrives(world, RuntimeError("peer gone")) is False  # no SIGTERM: the wait runs out
    monkeypatch.setattr(trainer_mod, "STOP_REQUESTED", type(trainer_mod.STOP_REQUESTED)())
    trainer_mod.STOP_REQUESTED.set()
    with pytest.raises(Terminated):
        t._newer_world_arrives(world, RuntimeError("peer gone"))


@pytest.mark.dist
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stopped_local_launcher_stops_its_workers_and_says_so(tmp_path, sig):
    """SIGTERM (a job runner, ``kill``) or Ctrl-C to ``cohort run --local``: each worker gets SIGTERM alone, as
    from the kubelet, and leaves with its loader's processes; nothing of theirs is left running or in $TMPDIR,
    and the launcher says what it did and exits 128 + the signal, with no traceback."""
    import sys

    import numpy as np

    from cohort.trainer.workloads.tokens import write_shards

    # Token shards: their loader's processes (unlike digits') hold sockets and semaphores, which a SIGTERM to
    # the whole process group left behind in $TMPDIR and as resource_tracker's "leaked semaphore" warning.
    ids = np.random.default_rng(0).integers(0, 50, 240 * 8 + 1)
    shards = write_shards(tmp_path / "shards", {"train": ids, "eval": ids[:200]}, vocab_size=50)
    m = manifest("term", workload={"model": "transformer", "modelArgs": {"dim": 16, "n_layers": 1, "n_heads": 2},
                                   "dataset": "tokens", "datasetArgs": {"path": str(shards), "seq_len": 8},
                                   "epochs": 1000, "batchSize": 2, "dataLoaderWorkers": 1,
                                   "optimizer": {"name": "adamw", "lr": 0.001}},
                 checkpoint={"everySteps": 50})
    mf = write_manifest(tmp_path / "term.yaml", m)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "cohort.trainer.cli", "run", str(mf), "--local", "--workers", "2",
                             "--run-dir", str(tmp_path / "run"), "--checkpoint-dir", str(tmp_path / "ck")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)},
                            # as from a terminal: a shell without job control starts background jobs with
                            # SIGINT ignored, and Python then never raises KeyboardInterrupt
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for_file(tmp_path / "ck/term/step-00000050/COMMITTED")
        workers = [int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                                  text=True).stdout.split()]
        assert len(workers) == 2, workers
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "stopping 2 workers: SIGTERM" in err and f"cohort: stopped by {sig.name}" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]

    def group_gone(pgid: int) -> bool:  # each worker leads its own process group: its loader's processes too
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    # before: the launcher died at once on SIGTERM and its workers trained on, orphaned
    wait_for(lambda: all(group_gone(p) for p in workers), 10, 0.1, what="the workers' processes to exit")
    assert not list(tmp.glob("pymp-*")), [sorted(os.listdir(d)) for d in tmp.glob("pymp-*")]
    logs = sorted((tmp_path / "run").glob("*.log"))
    assert len(logs) == 2, logs
    for log in logs:
        text = log.read_text()
        assert "stopped by SIGTERM" in text and "Warning" not in text, (log.name, text[-2000:])
