"""One poll-until helper for the tests and the benchmarks.

Polling is the honest way to wait on a system that exposes no event for what
is awaited (a file appearing, a Prometheus query turning true, a job's phase).
Every wait names what it waited for, and its timeout says how long it gave,
so a failure reads as a sentence. No library in the design card's set offers
this (``kubernetes.watch`` serves only the API server, and only for events).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 30, interval_s: float = 0.2, what: str = "",
             retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Poll until ``predicate()`` is truthy and return its value; an exception in ``retry_on`` counts as
    "not yet". On timeout raise AssertionError saying what was awaited and the last value seen."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = predicate()
        except retry_on as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}; last value: {last!r}")
        time.sleep(interval_s)
