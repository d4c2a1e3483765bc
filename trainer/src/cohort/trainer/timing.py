"""The loop's own clock: what one training step costs, from the end of one step to the end of the next.

``Trainer._step`` times forward, backward and the update (``cohort_step_seconds``).
A user pays for the whole loop: the stop and membership checks, the sampler,
metrics and progress, the checkpoint decision. ``StepClock`` times that, step
to step, for the summary's ``stepSecondsMedian`` (the step alone) and
``loopSecondsMean`` (the whole loop), which bench/trainer_overhead.py compares
with a bare DDP loop timed the same way, and for the job's throughput
(``samplesPerSecond``, the ETA) over its last :data:`RATE_HORIZON_S` seconds.
Memory is bounded: only the newest ``keep`` values are held.
"""

from __future__ import annotations

import bisect
import math
import statistics
import time
from collections import deque
from typing import Any

import torch

RATE_HORIZON_S = 30.0


class StepClock:
    def __init__(self, warmup: int = 10, keep: int = 4096, rate_horizon_s: float = RATE_HORIZON_S):
        self.warmup = warmup
        self.seen = 0
        self.walls: deque[float] = deque(maxlen=keep)
        self._sorted: list[float] = []  # the same walls in order: the median every step costs no sort
        self.loops: deque[float] = deque(maxlen=keep)
        self._last_end: float | None = None
        # The samples and seconds of every loop (warm-up too), summed with weights decaying by age.
        self.rate_horizon_s = rate_horizon_s
        self._samples = 0.0
        self._seconds = 0.0

    def restart(self) -> None:
        """A new world: the gap since the last step is recovery, not a step."""
        self._last_end = None

    def record(self, wall: float, end: float | None = None, samples: int = 0) -> None:
        """One step done: ``wall`` its own time; ``end`` when its loop iteration ended (now if None);
        ``samples`` the global batch it trained on."""
        end = time.perf_counter() if end is None else end
        self.seen += 1
        if self._last_end is not None:
            seconds = max(end - self._last_end, 1e-9)
            keep = math.exp(-seconds / self.rate_horizon_s)
            self._samples = self._samples * keep + samples
            self._seconds = self._seconds * keep + seconds
        if self.seen > self.warmup:
            if len(self.walls) == self.walls.maxlen:
                del self._sorted[bisect.bisect_left(self._sorted, self.walls[0])]
            self.walls.append(wall)
            bisect.insort(self._sorted, wall)
            if self._last_end is not None:
                self.loops.append(end - self._last_end)
        self._last_end = end

    def step_median(self) -> float | None:
        n = len(self._sorted)
        if not n:
            return None
        mid = n // 2
        return self._sorted[mid] if n % 2 else (self._sorted[mid - 1] + self._sorted[mid]) / 2

    def loop_mean(self) -> float | None:
        return statistics.fmean(self.loops) if self.loops else None

    def samples_per_second(self) -> float | None:
        """Samples per second as the job makes progress, over about the last ``rate_horizon_s`` seconds:
        the samples of each loop iteration (step to step, evaluations and checkpoints included) over their
        seconds. What ``samplesPerSecond`` and the ETA report. An average of per-step rates (samples /
        wall) would read high whenever step times vary, since the mean of 1/x exceeds 1/(mean of x); and
        a horizon of a few steps follows every swing of a shared machine's speed, which a time left must
        not."""
        return self._samples / self._seconds if self._seconds > 0 else None


class DeviceClock:
    """Marks in time that hold on a GPU, where the host runs ahead of the kernels it queues.

    On the CPU a mark is ``perf_counter()``. On a device it is an event recorded on the current
    stream, so it completes when the work queued before it does; ``seconds`` reads two marks
    after the step's one synchronisation (``device.synchronize``). A DDP comm hook may mark from
    autograd's device thread: events record on that thread's current stream, the backward's.
    """

    def __init__(self, device: torch.device):
        self.events = device.type != "cpu"
        self._module = torch.get_device_module(device.type) if self.events else None

    def mark(self) -> Any:
        if self._module is None:
            return time.perf_counter()
        event = self._module.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        if isinstance(start, float):
            return end - start
        return start.elapsed_time(end) / 1e3
