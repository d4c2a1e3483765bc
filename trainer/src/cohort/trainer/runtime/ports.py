"""A free TCP port for a server that starts later, chosen below the kernel's ephemeral range.

``bind(("127.0.0.1", 0))`` hands out a port from the ephemeral range
(``net.ipv4.ip_local_port_range``), the same range ``connect()`` takes its
source ports from. A client that retries ``connect()`` to such a port before
its server listens can be given that very port as its own source port: TCP's
simultaneous open then connects the socket to itself, the connect succeeds,
and the client waits for an answer that never comes. torch's TCPStore client
does exactly that (its constructor blocks in ``ping`` forever): a rank whose
store's port was picked that way hung the device-path tests for 10 minutes.
A port below the ephemeral range is never anyone's source port.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000  # above the well-known and most registered service ports


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default when it cannot be read)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port on ``host`` that no socket holds now and that the kernel never picks as a source port."""
    lo, _ = ephemeral_range()
    if lo <= LOWEST + 100:
        raise RuntimeError(f"the ephemeral port range starts at {lo}: no room below it for a server's port")
    for _ in range(attempts):
        port = random.randrange(LOWEST, lo)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in [{LOWEST}, {lo}) after {attempts} tries")
