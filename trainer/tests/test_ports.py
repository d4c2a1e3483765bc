"""Ports for servers that start later are never ones the kernel hands out as source ports."""

from __future__ import annotations

import socket

from cohort.trainer.runtime.ports import ephemeral_range, free_port, free_ports


def test_a_socket_connecting_from_the_port_it_connects_to_reaches_itself():
    """The hazard free_port avoids: with no listener on P, a connect() whose source port is P succeeds
    (TCP simultaneous open) and the client then waits for its own silence."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.connect(("127.0.0.1", port))
        assert s.getpeername() == s.getsockname()


def test_free_ports_lie_below_the_ephemeral_range_and_are_free():
    lo, hi = ephemeral_range()
    assert 1024 < lo < hi
    for _ in range(50):
        port = free_port()
        assert port < lo
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_ports_are_distinct(monkeypatch):
    """Two free_port() calls can agree (an operator once got one port for metrics and health);
    free_ports(n) never does, even when the random draw repeats itself."""
    first = free_port()
    second = next(p for p in iter(free_port, None) if p != first)
    draws = iter([first, first, first, second])
    monkeypatch.setattr("cohort.trainer.runtime.ports.random.randrange", lambda lo, hi: next(draws))
    assert free_ports(2) == [first, second]
