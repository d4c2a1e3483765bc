"""Where a worker's time goes: every second since the process started, in exactly one category.

The ledger is a clock with one open interval: :meth:`TimeLedger.switch` closes
it under the current category and opens the next, so the categories always sum
to the process's age. The trainer switches at the points where its work
changes (docs/monitoring.md, "Goodput", defines each category):

- ``starting``: from the process's start to the end of its first step (imports,
  data and model, the first world's rendezvous, the first step's warm-up);
- ``recovery``: from a failed collective or a world change to the end of the
  first step in the next world (detection, re-forming, state transfer);
- ``training``: steps, up to the healthy pace;
- ``straggler``: the part of a step beyond the healthy pace, when the step took
  more than ``threshold`` times that pace (a slow member holds every rank back);
- ``checkpoint``: the step loop blocked by a save;
- ``evaluation``: evaluations, the final one included;
- ``finishing``: after the last step, what is neither of the two above.

The operator reads rank 0's :meth:`TimeLedger.snapshot` from ``/progress`` and
adds what only it sees (queued, starting pods, lost work): docs/contracts.md §4.
The ledger also keeps its totals as they were at past moments (:data:`HISTORY`
marks, at most one per :data:`MARK_EVERY_S`): a survivor become rank 0 was never
read before, and the operator asks for its ledger as of its last reading of the
old rank 0 (``base``), so the interval between is split by what this process did in it.
The healthy pace is :class:`HealthyPace`: per world size, the fastest median of
:data:`WINDOW` consecutive steps seen so far.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

CATEGORIES = ("starting", "training", "checkpoint", "recovery", "straggler", "evaluation", "finishing")
WINDOW = 8
HISTORY = 1024  # marks kept: at one a second at most, the last quarter of an hour or more
MARK_EVERY_S = 1.0


class TimeLedger:
    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()  # the HTTP thread reads while the training thread writes
        self.started_at = wall()  # with the pod's name, tells the operator which process it reads
        self.pod = ""
        self._mark = clock()
        self.current = "starting"
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.first_step: int | None = None  # the step its first step reached: its training counts from there
        self.steps_run = 0  # the steps whose time is training's (and straggling's): what lost work is split by
        self.reached: int | None = None  # the step its last step reached: served with steps_run, read together
        # (wall time, totals by category, steps_run, reached) at past moments when no interval was open.
        self._marks: deque[tuple[float, tuple[float, ...], int, int | None]] = deque(maxlen=HISTORY)
        self._take_mark()

    def switch(self, category: str) -> str:
        """Close the open interval under the current category; the next is ``category``'s. Returns the old one."""
        if category not in self.seconds:
            raise ValueError(f"unknown ledger category {category!r}")
        with self._lock:
            now = self._clock()
            self.seconds[self.current] += now - self._mark
            self._mark, previous, self.current = now, self.current, category
            self._take_mark()
        return previous

    @contextlib.contextmanager
    def during(self, category: str) -> Iterator[None]:
        """The block's time is ``category``'s; the category before it resumes after."""
        previous = self.switch(category)
        try:
            yield
        finally:
            self.switch(previous)

    def relabel(self, category: str) -> None:
        """The open interval turned out to be ``category``'s (a step whose collective failed is recovery)."""
        if category not in self.seconds:
            raise ValueError(f"unknown ledger category {category!r}")
        with self._lock:
            self.current = category

    def first_step_in_world(self, reached: int) -> None:
        """A world's first step ended (at step ``reached``): it closes starting or recovery, not training."""
        self.switch("training")
        with self._lock:
            self.reached = reached
            if self.first_step is None:
                self.first_step = reached

    def step(self, healthy_s: float | None, threshold: float, reached: int) -> float:
        """Close a step that reached step ``reached`` (the open interval, which must be training's). Returns its
        length."""
        with self._lock:
            now = self._clock()
            spent = now - self._mark
            self._mark = now
            self.steps_run += 1
            self.reached = reached
            if healthy_s is not None and spent > threshold * healthy_s:
                self.seconds["training"] += healthy_s
                self.seconds["straggler"] += spent - healthy_s
            else:
                self.seconds["training"] += spent
            self.current = "training"
            self._take_mark()
        return spent

    def _take_mark(self) -> None:
        """Keep the totals as they are now, the open interval just closed (under the lock, or in ``__init__``)."""
        wall = self._wall()
        if self._marks and wall - self._marks[-1][0] < MARK_EVERY_S:
            return
        self._marks.append((wall, tuple(self.seconds[c] for c in CATEGORIES), self.steps_run, self.reached))

    def _as_of(self, t: float) -> dict[str, Any] | None:
        """The newest mark at or before Unix time ``t`` (under the lock); None if none is kept."""
        for wall, seconds, ran, reached in reversed(self._marks):
            if wall <= t:
                doc: dict[str, Any] = {"at": round(wall, 3), "stepsRun": ran,
                                       "seconds": {c: round(v, 3) for c, v in zip(CATEGORIES, seconds, strict=True)}}
                if reached is not None:
                    doc["step"] = reached
                return doc
        return None

    def snapshot(self, base_at: float | None = None) -> dict[str, Any]:
        """The totals as of now, the open interval included (what ``/progress`` serves); with ``base_at`` (Unix
        seconds), also ``base``: the totals as they were at the newest mark at or before it, when one is kept."""
        with self._lock:
            open_s = self._clock() - self._mark
            seconds = {k: round(v + (open_s if k == self.current else 0.0), 3) for k, v in self.seconds.items()}
            doc: dict[str, Any] = {"pod": self.pod, "startedAt": round(self.started_at, 3), "at": round(self._wall(), 3),
                                   "current": self.current, "stepsRun": self.steps_run, "seconds": seconds}
            if self.reached is not None:
                doc["step"] = self.reached
            if self.first_step is not None:
                doc["firstStep"] = self.first_step
            base = None if base_at is None else self._as_of(base_at)
            if base is not None:
                doc["base"] = base
        return doc


class HealthyPace:
    """Per world size, the fastest median of :data:`WINDOW` consecutive steps: what a step costs without a
    straggler. A world change starts a new window (its first steps warm up); the best median is kept."""

    def __init__(self) -> None:
        self.best: dict[int, float] = {}
        self._window: deque[float] = deque(maxlen=WINDOW)
        self._size = 0

    def new_world(self, size: int) -> None:
        self._window.clear()
        self._size = size

    def add(self, seconds: float) -> None:
        self._window.append(seconds)
        if len(self._window) == WINDOW:
            median = statistics.median(self._window)
            self.best[self._size] = min(median, self.best.get(self._size, median))

    def healthy(self) -> float | None:
        return self.best.get(self._size)
