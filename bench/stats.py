"""Small statistics for the benchmarks: a paired mean with its t interval, a median with its range,
Spearman's rho, a bootstrap.

No SciPy: the t quantiles are the standard two-sided 95 % table (df 1-30;
beyond that the normal 1.96 is within 2 %).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence

T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % confidence interval of the mean, Student's t."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, math.nan, math.nan
    t = T975[n - 2] if n - 1 <= len(T975) else 1.96
    half = t * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def spread(values: Sequence[float], spec: str = ".2f") -> str:
    """A table cell: the median, and [min-max] when there is more than one value ("-" for none)."""
    if not values:
        return "-"
    mid = format(statistics.median(values), spec)
    return mid if len(values) == 1 else f"{mid} [{format(min(values), spec)}-{format(max(values), spec)}]"


def ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (ties averaged)."""
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan


def bootstrap(stat: Callable[[list[int]], float], n: int, resamples: int = 2000,
              seed: int = 0) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of ``stat`` over ``resamples`` resamples (with replacement) of 0..n-1."""
    rng = random.Random(seed)
    values = sorted(v for v in (stat([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
                    if not math.isnan(v))
    return values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values) - 1))]


def host() -> str:
    """When, and the host's load average over 1, 5 and 15 minutes (os.getloadavg), for a table's caption."""
    one, five, fifteen = os.getloadavg()
    return f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {one:.2f} {five:.2f} {fifteen:.2f}"
