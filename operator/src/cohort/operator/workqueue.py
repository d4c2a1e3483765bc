"""A de-duplicating work queue of job keys, with delayed adds and a pool of workers.

Every trigger (a TrainingJob event, an event on one of its pods or owned
objects, a timer, the periodic resync) only marks the job dirty. A key is in
the queue at most once and is processed by one worker at a time, so a job is
never reconciled twice concurrently, and a burst of pod events costs one
reconcile, not one each. A key marked dirty while it is being processed is
processed once more afterwards, so no trigger is lost. Keys carry a priority
(:data:`URGENT` first).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger(__name__)


# Priorities, most urgent first. A job that needs workers (new, changed, or
# lost one) goes ahead of routine bookkeeping: at hundreds of jobs, pods exist
# sooner when status-only reconciles and resyncs wait their turn.
URGENT, NORMAL, BACKGROUND = 0, 1, 2


class WorkQueue:
    def __init__(self) -> None:
        self._heap: asyncio.PriorityQueue[tuple[int, int, Hashable]] = asyncio.PriorityQueue()
        self._seq = 0
        self._queued: dict[Hashable, int] = {}  # key -> priority of its live heap entry
        self._processing: set[Hashable] = set()
        self._dirty: dict[Hashable, int] = {}
        self._timers: dict[Hashable, tuple[float, asyncio.TimerHandle, int]] = {}

    def add(self, key: Hashable, priority: int = NORMAL) -> None:
        if key in self._processing:
            self._dirty[key] = min(priority, self._dirty.get(key, priority))
            return
        current = self._queued.get(key)
        if current is not None and current <= priority:
            return
        # A more urgent add supersedes the queued entry, which is skipped when popped.
        self._queued[key] = priority
        self._seq += 1
        self._heap.put_nowait((priority, self._seq, key))

    def add_after(self, key: Hashable, delay_s: float, priority: int = NORMAL) -> None:
        """Add ``key`` in ``delay_s`` seconds; an earlier pending timer for it wins."""
        if delay_s <= 0:
            self.add(key, priority)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        current = self._timers.get(key)
        if current and current[0] <= due:
            return
        if current:
            current[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key), priority)

    def _fire(self, key: Hashable) -> None:
        timer = self._timers.pop(key, None)
        self.add(key, timer[2] if timer else NORMAL)

    def forget(self, key: Hashable) -> None:
        """Drop pending timers for a key (its object is gone)."""
        timer = self._timers.pop(key, None)
        if timer:
            timer[1].cancel()

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def idle(self) -> bool:
        return not self._queued and not self._processing

    def start(self, process: Callable[[Hashable], Awaitable[None]], workers: int) -> list[asyncio.Task[None]]:
        """Start ``workers`` concurrent workers; cancel the returned tasks to stop them.

        The tasks are created right here, synchronously, so a caller can
        start them before kopf (which, on shutdown, cancels every task that
        did not exist when it started).
        """
        async def worker() -> None:
            while True:
                priority, _seq, key = await self._heap.get()
                if self._queued.get(key) != priority:
                    continue  # superseded by a more urgent entry, or already taken
                del self._queued[key]
                self._processing.add(key)
                try:
                    await process(key)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the processor reports its own errors; keep the worker alive
                    log.exception("processing %s failed", key)
                finally:
                    self._processing.discard(key)
                    if key in self._dirty:
                        self.add(key, self._dirty.pop(key))

        return [asyncio.create_task(worker(), name=f"reconcile-worker-{i}") for i in range(max(workers, 1))]

    async def run(self, process: Callable[[Hashable], Awaitable[None]], workers: int) -> None:
        """Process keys until cancelled."""
        tasks = self.start(process, workers)
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            for _due, handle, _priority in self._timers.values():
                handle.cancel()
