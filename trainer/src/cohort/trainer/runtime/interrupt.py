"""A newer world interrupts a collective stuck on a lost NCCL peer.

NCCL's kernels spin on a peer that died instead of failing, so a member can sit in a collective of a
world the operator has already replaced: it would stay there until the job's collective timeout
(collective_timeout.py). A watcher thread sees the newer world; if a step of the old one has been running
for longer than a grace since then (a healthy step finishes and the loop sees the change itself), it aborts
the groups' NCCL communicators (``ProcessGroupNCCL.abort``, the call NCCL's own watchdog makes from its
thread), so the step fails at once, the commit gate discards it, and the member joins the new world.

Only for NCCL: gloo's ``abort()`` does not interrupt an operation in flight (tried on torch 2.13), and
gloo raises on a dead peer anyway.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..log import get_logger
from .world import WorldSource

log = get_logger(__name__)
POLL_S = 0.05


class StepWatch:
    """The main thread marks its steps; :meth:`check` (the watcher thread's loop) aborts once per world."""

    def __init__(self, worlds: WorldSource, abort: Callable[[], None], grace_s: Callable[[], float]):
        self.worlds, self.abort, self.grace_s = worlds, abort, grace_s
        self._lock = threading.Lock()
        self._step: tuple[int, float] | None = None  # (world version, when the step began)
        self._newer_seen: float | None = None
        self._aborted: set[int] = set()
        self._thread: threading.Thread | None = None

    def begin(self, version: int) -> None:
        with self._lock:
            self._step = (version, time.monotonic())

    def end(self) -> None:
        with self._lock:
            self._step = None

    def start(self) -> StepWatch:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="step-watch", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.check()
            time.sleep(POLL_S)

    def check(self, now: float | None = None) -> bool:
        """Abort if a step of a replaced world has run ``grace_s`` since it began and since the newer world
        was seen; True if it did."""
        now = time.monotonic() if now is None else now
        latest = self.worlds.latest
        with self._lock:
            step = self._step
            if step is None or latest is None or latest.version <= step[0] or step[0] in self._aborted:
                self._newer_seen = None
                return False
            if self._newer_seen is None:
                self._newer_seen = now
            if now - max(step[1], self._newer_seen) < self.grace_s():
                return False
            self._aborted.add(step[0])
        log.warning("a step of a replaced world is stuck: aborting its NCCL communicators",
                    extra={"version": step[0], "newer": latest.version, "stuck_s": round(now - step[1], 3)})
        self.abort()
        return True
