"""Survivors' reports (reports.py): parsing what a worker wrote, and the check of who is gone, on real sockets."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from cohort.operator.reports import Report, confirmed, parse_report, unreachable
from cohort.operator.world import Member


@pytest.mark.parametrize("text,expect", [
    (json.dumps({"pod": "j-worker-1", "version": 3, "at": 1.5, "error": "Connection closed by peer"}),
     Report("j-worker-1", 3, 1.5, "Connection closed by peer")),
    (json.dumps({"pod": "j-worker-1", "version": "4"}), Report("j-worker-1", 4)),
    (None, None), ("", None), ("not json", None), ("[1, 2]", None), (json.dumps({"pod": "p"}), None),
    (json.dumps({"pod": "p", "version": "seven"}), None),
])
def test_a_report_is_parsed_or_ignored(text, expect):
    assert parse_report(text) == expect


def test_only_a_member_whose_port_refuses_is_gone():
    """127.0.0.1 listens on the port, 127.0.0.2 does not (refused at once): only the second is gone;
    a member without an address is not tried."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        members = [Member("alive", ip="127.0.0.1"), Member("dead", ip="127.0.0.2"), Member("unknown")]
        gone = asyncio.run(unreachable(members, port))
    assert gone == {"dead": f"nothing listens on 127.0.0.2:{port}"}


def test_a_check_that_finds_the_reporter_gone_proves_nothing():
    """The reporter wrote a moment ago: if its port refuses too, the operator is what cannot connect."""
    gone = {"j-worker-1": "nothing listens on 10.0.0.1:9400"}
    assert confirmed(gone, "j-worker-0") == gone
    assert confirmed({**gone, "j-worker-0": "nothing listens on 10.0.0.0:9400"}, "j-worker-0") == {}
