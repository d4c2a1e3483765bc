"""SIGTERM is obeyed while a worker waits for the next world, and `cohort run --local` stops its workers on it."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from tests.support.local import manifest, start_local, wait_for_file
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
def test_sigterm_to_the_local_launcher_stops_its_workers(tmp_path):
    m = manifest("term", workload={"epochs": 1000}, checkpoint={"everySteps": 50})
    (tmp_path / "a").mkdir()
    proc = start_local(tmp_path / "a", m, workers=2, ckpt=tmp_path / "ck")
    wait_for_file(tmp_path / "ck/term/step-00000050/COMMITTED")
    workers = [int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True,
                                              text=True).stdout.split()]
    assert len(workers) == 2, workers
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    # before: the launcher died at once and its workers trained on, orphaned
    wait_for(lambda: all(gone(p) for p in workers), 5, 0.1, what="the workers to exit with the launcher")
