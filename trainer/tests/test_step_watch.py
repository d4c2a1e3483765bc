"""A newer world interrupts a stuck NCCL step (runtime/interrupt.py): when the watcher aborts.

The abort itself is NCCL's (``ProcessGroupNCCL.abort``) and runs only on a GPU; here a recorder stands
in for it, and the decision is checked: only a step of a replaced world, only after the grace counted
from both the step's start and the newer world's arrival, once per world, never between steps.
"""

from __future__ import annotations

import threading
import time

from cohort.trainer.runtime.interrupt import StepWatch
from cohort.trainer.runtime.world import Member, World, WorldSource


def world(version: int) -> World:
    return World(version, (Member(0, "p0", "127.0.0.1"),), "127.0.0.1", 29500)


def watch(grace: float = 1.0) -> tuple[WorldSource, StepWatch, list[int]]:
    source, aborted = WorldSource(), []
    return source, StepWatch(source, lambda: aborted.append(1), lambda: grace), aborted


def test_a_step_of_a_replaced_world_is_aborted_after_the_grace_once():
    source, w, aborted = watch()
    source._publish(world(1))
    w.begin(1)
    assert not w.check(now=time.monotonic() + 5)  # no newer world: a long step is only long
    source._publish(world(2))
    seen = time.monotonic() + 10  # the step had run 10 s when the newer world came
    assert not w.check(now=seen)  # the grace counts from when the newer world was seen, too
    assert not w.check(now=seen + 0.9)
    assert w.check(now=seen + 1.1) and aborted == [1]
    assert not w.check(now=seen + 5) and aborted == [1]  # once per world


def test_a_step_that_ends_in_time_or_a_loop_between_steps_is_left_alone():
    source, w, aborted = watch()
    source._publish(world(1))
    w.begin(1)
    source._publish(world(2))
    t = time.monotonic()
    w.check(now=t)
    w.end()  # the step finished; the loop sees the new world itself
    assert not w.check(now=t + 10)
    w.begin(2)  # a step of the newest world
    assert not w.check(now=t + 20) and aborted == []


def test_the_watcher_thread_aborts_a_stuck_step():
    source, w, aborted = watch(grace=0.3)
    source._publish(world(1))
    w.start().begin(1)
    time.sleep(0.2)
    source._publish(world(2))
    deadline = time.monotonic() + 5
    while not aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert aborted == [1]
    assert any(t.name == "step-watch" for t in threading.enumerate())
