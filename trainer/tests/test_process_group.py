"""The rendezvous barrier on a real TCPStore: every member of a world reaches the same outcome.

A member that leaves for a newer world while the last one arrives must not
leave the others blocked in init_process_group (seen once in the e2e tier:
a 60 s stall, then every member timing out).
"""

from __future__ import annotations

import datetime
import random
import threading

import pytest
import torch.distributed as dist

from cohort.trainer.runtime.process_group import Absent, Rendezvous, Superseded, gloo_options_bound_to
from cohort.trainer.runtime.world import Member, World


def world(size: int, version: int = 1) -> World:
    return World(version, tuple(Member(r, f"p{r}", "127.0.0.1") for r in range(size)), "127.0.0.1", 0)


def run_members(w: World, newer: list[threading.Event], delays: list[float], timeout_s: float = 5.0) -> list[str]:
    """Each member with a delay (a thread with its own store client) runs the barrier; returns each one's outcome.
    Members beyond ``len(delays)`` never arrive."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))
    outcomes: list[str] = [""] * len(delays)

    def member(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10))
        newer[rank].wait(delays[rank]) if delays[rank] else None
        try:
            Rendezvous("127.0.0.1", 0, timeout_s=timeout_s)._barrier(
                dist.PrefixStore(f"v{w.version}", client), w, rank, newer[rank].is_set)
            outcomes[rank] = "go"
        except Superseded:
            outcomes[rank] = "superseded"
        except Absent as e:
            outcomes[rank] = "timeout, absent: " + ",".join(e.pods)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(len(delays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    assert not any(t.is_alive() for t in threads), "a member is still blocked in the barrier"
    return outcomes


def test_everyone_arrives_and_goes():
    assert run_members(world(4), [threading.Event() for _ in range(4)], [0, 0.05, 0.1, 0.2]) == ["go"] * 4


def test_a_member_that_left_for_a_newer_world_takes_everyone_with_it():
    newer = [threading.Event() for _ in range(3)]
    newer[0].set()  # rank 0 already sees a newer world; the others arrive later and must not go on without it
    assert run_members(world(3), newer, [0, 0.2, 0.3]) == ["superseded"] * 3


@pytest.mark.parametrize("seed", range(20))
def test_members_agree_when_a_newer_world_races_the_last_arrival(seed):
    """The race itself: rank 0 learns of a newer world at about the moment the last member arrives."""
    rng = random.Random(seed)
    newer = [threading.Event() for _ in range(4)]
    last = rng.uniform(0.02, 0.06)
    threading.Timer(last + rng.uniform(-0.01, 0.01), newer[0].set).start()
    outcomes = run_members(world(4), newer, [0, 0.01, 0.02, last])
    assert len(set(outcomes)) == 1 and outcomes[0] in ("go", "superseded"), outcomes


def test_a_member_that_never_arrives_times_everyone_out_and_is_named_absent():
    outcomes = run_members(world(3), [threading.Event() for _ in range(3)], [0, 0.01], timeout_s=0.5)
    assert outcomes == ["timeout, absent: p2", "timeout, absent: p2"]


def test_a_rank_0_whose_store_never_answers_is_named_absent():
    """A stopped rank 0 (a frozen host): the kernel still accepts connections to its store's port, and nothing
    answers them. Joining fails within the rendezvous timeout naming rank 0, so the member reports it (its
    pod hung, if the authority finds it there) instead of ending its process with a bare TimeoutError."""
    import socket
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # never accept()ed: connections complete in the backlog, no store answers them
    try:
        w = World(4, tuple(Member(r, f"p{r}", "127.0.0.1") for r in range(3)), "127.0.0.1",
                  listener.getsockname()[1])
        t0 = time.monotonic()
        with pytest.raises(Absent) as e:
            Rendezvous("127.0.0.1", 0, timeout_s=1.0).join(w, 2, lambda: False)
        assert e.value.pods == ["p0"] and "rank 0's rendezvous store" in str(e.value), e.value
        assert time.monotonic() - t0 < 10
    finally:
        listener.close()


def test_a_rank_0_that_stops_while_the_members_arrive_is_named_absent():
    """Rank 0's store answered the connection, then its process stopped (SIGSTOP: a frozen host) while the
    members waited for each other. torch's store client reads each answer without a bound, so the barrier's
    next ``add`` would wait for good (it did: the test's own timeout); it names rank 0 within the rendezvous
    timeout instead."""
    import os
    import signal
    import subprocess
    import sys
    import time

    host = subprocess.Popen([sys.executable, "-c", (
        "import datetime, sys, time, torch.distributed as dist\n"
        "s = dist.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False,"
        " timeout=datetime.timedelta(seconds=30))\n"
        "print(s.port, flush=True)\n"
        "time.sleep(300)\n")], stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())  # type: ignore[union-attr]
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=2))
        client.add("up", 1)  # the store answers
        os.kill(host.pid, signal.SIGSTOP)
        w = World(3, tuple(Member(r, f"p{r}", "127.0.0.1") for r in range(2)), "127.0.0.1", port)
        t0 = time.monotonic()
        with pytest.raises(Absent) as e:
            Rendezvous("127.0.0.1", 0, timeout_s=1.0)._barrier(dist.PrefixStore("v3", client), w, 1, lambda: False)
        assert e.value.pods == ["p0"] and "rank 0's rendezvous store" in str(e.value), e.value
        assert time.monotonic() - t0 < 10
    finally:
        host.kill()  # SIGKILL ends a stopped process too
        host.wait()


# A member of a 3-member world in its own process: it joins through Rendezvous.join (barrier, then gloo's
# init_process_group through rank 0's store); after the barrier's "go", the member named in argv[4] stops or
# dies (argv[5]), before gloo connects. Prints its outcome and how long joining took.
_MEMBER = """
import json, os, signal, sys, time
from cohort.trainer.runtime import process_group as pg
from cohort.trainer.runtime.world import Member, World
rank, port, flag, victim, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
w = World(5, tuple(Member(r, f"p{r}", "127.0.0.1") for r in range(3)), "127.0.0.1", port)
barrier = pg.Rendezvous._barrier
def then_fault(self, *a):
    barrier(self, *a)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)
pg.Rendezvous._barrier = then_fault
t0 = time.monotonic()
try:
    pg.Rendezvous("127.0.0.1", port, timeout_s=float(sys.argv[6])).join(w, rank, lambda: os.path.exists(flag))
    out = {"outcome": "joined"}
except pg.Superseded:
    out = {"outcome": "superseded"}
except pg.Absent as e:
    out = {"outcome": "absent", "pods": e.pods, "error": str(e)}
except Exception as e:
    out = {"outcome": type(e).__name__, "error": str(e)[:300]}
out["seconds"] = time.monotonic() - t0
print(json.dumps(out), flush=True)
from cohort.trainer.runtime.exit import exit_process
exit_process(0)
"""


def join_with_a_fault(tmp_path, victim: int, how: str, timeout_s: float, newer_after_s: float | None = None,
                      limit_s: float = 60) -> dict[int, dict]:
    """Runs the three members; returns each survivor's outcome. ``newer_after_s``: a newer world appears that
    long after the victim's death."""
    import json
    import subprocess
    import sys
    import time

    from cohort.trainer.runtime.ports import free_port

    port, flag = free_port(), tmp_path / "newer"
    procs = {r: subprocess.Popen([sys.executable, "-c", _MEMBER, str(r), str(port), str(flag), str(victim), how,
                                  str(timeout_s)], stdout=subprocess.PIPE, text=True) for r in range(3)}
    try:
        if newer_after_s is not None:  # the authority publishes the next world that long after the death
            procs[victim].wait(limit_s)
            time.sleep(newer_after_s)
            flag.touch()
        outcomes = {}
        for r, p in procs.items():
            if r != victim:
                out, _ = p.communicate(timeout=limit_s)  # before the bound: blocked in gloo's connections
                outcomes[r] = json.loads(out.strip().splitlines()[-1])
        return outcomes
    finally:
        for p in procs.values():
            p.kill()  # SIGKILL ends a stopped process too
            p.wait()


def test_a_rank_0_that_stops_as_gloo_connects_is_named_absent(tmp_path):
    """Rank 0 stopped just after the barrier's "go", while gloo's connections go through its store: the others
    name it absent within the rendezvous timeout (before: blocked in init_process_group for good)."""
    outcomes = join_with_a_fault(tmp_path, victim=0, how="stop", timeout_s=2.0)
    for r, out in outcomes.items():
        assert out["outcome"] == "absent" and out["pods"] == ["p0"], (r, out)
        assert "rank 0's rendezvous store" in out["error"] and out["seconds"] < 10, (r, out)


def test_a_newer_world_interrupts_gloo_connecting_to_a_dead_member(tmp_path):
    """A member died just after the barrier's "go": the others wait for it in gloo's connections, and the next
    world (the authority saw the death) takes them at once, not after the rendezvous timeout (20 s here)."""
    outcomes = join_with_a_fault(tmp_path, victim=2, how="kill", timeout_s=20.0, newer_after_s=0.5)
    for r, out in outcomes.items():
        assert out["outcome"] == "superseded" and out["seconds"] < 8, (r, out)


def test_gloo_options_bind_the_given_address():
    """The private torch API that binds gloo to the pod IP (local workers share one network namespace)."""
    opts = gloo_options_bound_to("127.0.0.1")
    assert len(opts._devices) == 1


_STUCK = """
import sys, time
from cohort.trainer.runtime.exit import exit_if_stuck
t0 = time.monotonic()
superseded = (lambda: time.monotonic() - t0 > float(sys.argv[2])) if len(sys.argv) > 2 else None
with exit_if_stuck(float(sys.argv[3]) if len(sys.argv) > 3 else 1.0, "the test's call", superseded, 1.0):
    time.sleep(float(sys.argv[1]))
print("after the block", flush=True)
"""


def test_a_block_still_running_past_its_bound_ends_the_process_with_its_reason(tmp_path):
    """``exit_if_stuck``: a block that outlasts its bound ends the process (exit 1, the reason as its termination
    message); one that ends in time leaves the process alone."""
    import json
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "COHORT_TERMINATION_LOG": str(tmp_path / "term")}
    t0 = time.monotonic()
    stuck = subprocess.run([sys.executable, "-c", _STUCK, "60"], env=env, capture_output=True, text=True, timeout=30)
    assert stuck.returncode == 1 and "after the block" not in stuck.stdout, stuck
    assert time.monotonic() - t0 < 15
    assert json.loads((tmp_path / "term").read_text()) == {
        "error": "the test's call did not finish within 1s: this worker leaves, to be replaced"}
    (tmp_path / "term").unlink()
    quick = subprocess.run([sys.executable, "-c", _STUCK, "0.1"], env=env, capture_output=True, text=True, timeout=30)
    assert quick.returncode == 0 and "after the block" in quick.stdout, quick
    assert not (tmp_path / "term").exists()


def test_a_block_superseded_ends_the_process_after_its_grace_not_its_bound(tmp_path):
    """``exit_if_stuck`` with ``superseded``: a block still running its grace (1 s) after ``superseded()`` turned
    true (at 0.5 s) ends the process then, not at its bound (60 s); one that ends within the grace does not."""
    import json
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "COHORT_TERMINATION_LOG": str(tmp_path / "term")}
    t0 = time.monotonic()
    stuck = subprocess.run([sys.executable, "-c", _STUCK, "120", "0.5", "60"], env=env, capture_output=True,
                           text=True, timeout=50)
    assert stuck.returncode == 1 and "after the block" not in stuck.stdout, stuck
    assert time.monotonic() - t0 < 30
    assert json.loads((tmp_path / "term").read_text()) == {
        "error": "the test's call was still running 1s after a newer world was published: this worker leaves, "
                 "to be replaced"}
    (tmp_path / "term").unlink()
    quick = subprocess.run([sys.executable, "-c", _STUCK, "0.8", "0.5", "60"], env=env, capture_output=True,
                           text=True, timeout=50)
    assert quick.returncode == 0 and "after the block" in quick.stdout, quick
    assert not (tmp_path / "term").exists()


# A one-member world's rank 0 joins through Rendezvous.join; after the barrier's "go", init_process_group never
# returns, as NCCL's eager communicator init does when a member died between the barrier and NCCL's bootstrap
# (its wait looks at no store and no newer world, and no abort reaches a communicator still forming).
_FORMING_HANGS = """
import sys, time
from cohort.trainer.runtime import process_group as pg
from cohort.trainer.runtime.world import Member, World
pg.dist.init_process_group = lambda *a, **k: time.sleep(600)
w = World(5, (Member(0, "p0", "127.0.0.1"),), "127.0.0.1", int(sys.argv[1]))
newer_at = float(sys.argv[3]) if len(sys.argv) > 3 else None  # when a newer world appears, after the forming
formed: list[float] = []
is_newer = lambda: newer_at is not None and bool(formed) and time.monotonic() - formed[0] > newer_at
forming = lambda: (formed.append(time.monotonic()), print("forming", flush=True))
pg.Rendezvous("127.0.0.1", int(sys.argv[1]), timeout_s=float(sys.argv[2])).join(w, 0, is_newer, forming)
print("joined", flush=True)
"""


def test_a_member_stuck_forming_the_group_exits_within_its_bound_and_says_why(tmp_path):
    """A member whose group never forms after the barrier leaves within ``form_bound_s`` (2 x 1 s + 2 s here)
    with exit 1 and the reason as its termination message, so that its authority replaces it; before, the
    process stayed in init_process_group for good (the test's 60 s limit)."""
    import json
    import os
    import subprocess
    import sys
    import time

    from cohort.trainer.runtime.ports import free_port

    env = {**os.environ, "COHORT_TERMINATION_LOG": str(tmp_path / "term")}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _FORMING_HANGS, str(free_port()), "1"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "joined" not in p.stdout and "forming" in p.stdout, p
    assert 4 <= time.monotonic() - t0 < 20, time.monotonic() - t0
    error = json.loads((tmp_path / "term").read_text())["error"]
    assert error.startswith("forming world 5's process group (") and "did not finish within 4s" in error, error


def test_a_member_stuck_forming_leaves_one_group_timeout_after_a_newer_world_not_at_its_bound(tmp_path):
    """The same stuck member, with a group timeout of 5 s (its bound 12 s), sees a newer world 1 s into the
    forming (its authority saw the death): it leaves one timeout later (about 6 s in), with the reason; its peers
    stop waiting for it in the newer world's rendezvous then too, and the operator, asking its /progress, finds
    it still forming the older world (cohort.api.progress)."""
    import json
    import os
    import subprocess
    import sys
    import time

    from cohort.trainer.runtime.ports import free_port

    env = {**os.environ, "COHORT_TERMINATION_LOG": str(tmp_path / "term")}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _FORMING_HANGS, str(free_port()), "5", "1"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "joined" not in p.stdout and "forming" in p.stdout, p
    assert time.monotonic() - t0 < 11, time.monotonic() - t0
    error = json.loads((tmp_path / "term").read_text())["error"]
    assert error == ("forming world 5's process group (gloo) was still running 5s after a newer world was "
                     "published: this worker leaves, to be replaced"), error
