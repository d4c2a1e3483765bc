"""Straggler detection: is one member's step compute time far above its peers'?

Every member exports ``cohort_step_compute_seconds`` (a histogram of compute
per step, communication excluded, so a slow peer does not make its fast
peers look slow). The operator samples each member's ``_sum`` and ``_count``
over time; over ``stragglers.windowSeconds`` the mean compute per step is
``Δsum / Δcount``. A member is a straggler when its mean exceeds
``threshold x reference``, where the reference is:

- the median of all members' means with three or more members;
- the faster member's mean with exactly two (a median of two would be their
  average, which a 2x-slow peer can never exceed by 1.5x).

A verdict needs a full window of samples from every member compared (a pod
that just joined has not shown its speed yet) and at least
:data:`MIN_STEPS` steps each, and there is a cooldown after each verdict so a
replacement can settle before it is judged. All of it is pure.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Iterable, Mapping

MIN_STEPS = 3
COMPUTE_METRIC = "cohort_step_compute_seconds"


@dataclasses.dataclass(frozen=True)
class Sample:
    """Cumulative compute seconds and steps one member had reported at time ``t``."""

    t: float
    sum_s: float
    count: float


@dataclasses.dataclass(frozen=True)
class Straggler:
    pod: str
    mean_s: float
    reference_s: float

    @property
    def ratio(self) -> float:
        return self.mean_s / self.reference_s if self.reference_s > 0 else float("inf")

    def describe(self) -> str:
        return (f"worker {self.pod} computes {self.mean_s * 1000:.1f} ms/step, {self.ratio:.2f}x the "
                f"reference {self.reference_s * 1000:.1f} ms/step")


class ComputeWindow:
    """Recent samples per pod. Mutable, but no I/O: the prober feeds it."""

    def __init__(self) -> None:
        self.samples: dict[str, deque[Sample]] = {}

    def add(self, pod: str, sample: Sample) -> None:
        series = self.samples.setdefault(pod, deque())
        if series and sample.count < series[-1].count:
            series.clear()  # the counters restarted: a new process, a new series
        series.append(sample)

    def retain(self, pods: Iterable[str], now: float, keep_s: float) -> None:
        """Forget pods that left and samples older than ``keep_s`` (one is kept as the window's start)."""
        keep = set(pods)
        for pod in list(self.samples):
            if pod not in keep:
                del self.samples[pod]
                continue
            series = self.samples[pod]
            while len(series) >= 2 and series[1].t <= now - keep_s:
                series.popleft()

    def clear(self) -> None:
        self.samples.clear()


def window_mean(series: Iterable[Sample], now: float, window_s: float) -> float | None:
    """Mean compute per step over the last ``window_s`` (None without a full window of data)."""
    items = list(series)
    if not items:
        return None
    start = now - window_s
    base = None
    for s in items:
        if s.t <= start:
            base = s  # the newest sample at or before the window's start
    if base is None:
        return None
    last = items[-1]
    steps = last.count - base.count
    if steps < MIN_STEPS:
        return None
    return (last.sum_s - base.sum_s) / steps


def find_straggler(means: Mapping[str, float], threshold: float) -> Straggler | None:
    """The slowest member if it exceeds ``threshold x reference`` (see the module doc)."""
    if len(means) < 2:
        return None
    values = sorted(means.values())
    reference = values[0] if len(values) == 2 else statistics.median(values)
    pod, mean = max(means.items(), key=lambda kv: (kv[1], kv[0]))
    if reference <= 0 or mean <= threshold * reference:
        return None
    return Straggler(pod=pod, mean_s=mean, reference_s=reference)


def detect_straggler(window: ComputeWindow, members: Iterable[str], *, now: float, window_s: float,
                     threshold: float, cooldown_until: float = 0.0) -> Straggler | None:
    """The verdict for the current members, or None (not enough data, cooling down, or no straggler)."""
    if now < cooldown_until:
        return None
    means: dict[str, float] = {}
    for pod in members:
        mean = window_mean(window.samples.get(pod, ()), now, window_s)
        if mean is None:
            return None  # every member needs a full window, or the comparison is unfair
        means[pod] = mean
    return find_straggler(means, threshold)


def parse_compute_sample(families: Iterable[object], t: float) -> Sample | None:
    """The ``_sum``/``_count`` of the compute histogram in parsed Prometheus families."""
    total = count = None
    for family in families:
        if getattr(family, "name", "") != COMPUTE_METRIC:
            continue
        for sample in getattr(family, "samples", ()):
            if sample.name == COMPUTE_METRIC + "_sum":
                total = float(sample.value)
            elif sample.name == COMPUTE_METRIC + "_count":
                count = float(sample.value)
    if total is None or count is None:
        return None
    return Sample(t=t, sum_s=total, count=count)
