"""The kernel's count of what a network namespace sent: its loopback's tx_bytes.

The byte benchmarks and the wire test run their ranks in a network namespace of
their own, whose loopback carries nothing but their traffic, so this counter is
what they sent: payloads, gloo's headers, TCP/IP headers and ACKs. It is read
from /proc/net/dev, which shows the reader's network namespace (/sys/class/net
shows the namespace /sys was mounted in, which ``unshare --net`` does not remount).
"""

from __future__ import annotations

import time
from pathlib import Path


def lo_tx_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == "lo":
            return int(fields.split()[8])
    raise RuntimeError("no loopback in /proc/net/dev")


def quiet_tx_bytes(still_s: float = 0.05, limit_s: float = 10.0) -> int:
    """The counter once it has not moved for ``still_s`` (late ACKs included), so no message of what
    came before is still on its way; after ``limit_s`` the last value (the caller's numbers then show it)."""
    last, deadline = lo_tx_bytes(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(still_s)
        now = lo_tx_bytes()
        if now == last:
            return now
        last = now
    return last
