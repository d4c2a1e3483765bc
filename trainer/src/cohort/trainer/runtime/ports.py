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
    return free_ports(1, host, attempts)[0]


def free_ports(n: int, host: str = "127.0.0.1", attempts: int = 200) -> list[int]:
    """``n`` distinct ports as :func:`free_port` picks them.

    Two calls to ``free_port`` can return the same port (each only checks that
    nothing holds it now): an operator given it as both its metrics and its
    health port fails to start.
    """
    lo, _ = ephemeral_range()
    if lo <= LOWEST + 100:
        raise RuntimeError(f"the ephemeral port range starts at {lo}: no room below it for a server's port")
    ports: list[int] = []
    for _ in range(attempts * n):
        if len(ports) == n:
            break
        port = random.randrange(LOWEST, lo)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        ports.append(port)
    if len(ports) < n:
        raise RuntimeError(f"{len(ports)} of {n} free ports on {host} in [{LOWEST}, {lo}) after {attempts * n} tries")
    return ports
