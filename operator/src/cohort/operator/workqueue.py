"""A de-duplicating work queue of job keys, with delayed adds and a pool of workers.

Every trigger (a TrainingJob event, an event on one of its pods or owned
objects, a timer, the periodic resync) only marks the job dirty. A key is in
the queue at most once and is processed by one worker at a time, so a job is
never reconciled twice concurrently, and a burst of pod events costs one
reconcile, not one each. A key marked dirty while it is being processed is
processed once more afterwards, so no trigger is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger(__name__)


class WorkQueue:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[Hashable] = asyncio.Queue()
        self._queued: set[Hashable] = set()
        self._processing: set[Hashable] = set()
        self._dirty: set[Hashable] = set()
        self._timers: dict[Hashable, tuple[float, asyncio.TimerHandle]] = {}

    def add(self, key: Hashable) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: Hashable, delay_s: float) -> None:
        """Add ``key`` in ``delay_s`` seconds; an earlier pending timer for it wins."""
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        current = self._timers.get(key)
        if current and current[0] <= due:
            return
        if current:
            current[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

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
                key = await self._queue.get()
                self._queued.discard(key)
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
                        self._dirty.discard(key)
                        self.add(key)

        return [asyncio.create_task(worker(), name=f"reconcile-worker-{i}") for i in range(max(workers, 1))]

    async def run(self, process: Callable[[Hashable], Awaitable[None]], workers: int) -> None:
        """Process keys until cancelled."""
        tasks = self.start(process, workers)
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            for _due, handle in self._timers.values():
                handle.cancel()
