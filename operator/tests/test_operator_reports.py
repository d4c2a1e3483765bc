"""Survivors' reports (reports.py): parsing what a worker wrote, and the check of who is gone, on real sockets."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from tests.support.healthz import serving

from cohort.operator.reports import Report, check, confirmed, parse_report
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


def test_only_a_member_whose_port_refuses_is_gone_and_only_one_that_answers_is_alive():
    """127.0.0.1 answers HTTP on the port, 127.0.0.3 accepts and says nothing (a hung process: its kernel
    still accepts), 127.0.0.2 has nothing listening (refused at once): only the last is gone, only the
    first answers; a member without an address is not tried."""
    with serving("127.0.0.1") as port, socket.socket() as hung:
        hung.bind(("127.0.0.3", port))
        hung.listen()
        members = [Member("alive", ip="127.0.0.1"), Member("dead", ip="127.0.0.2"), Member("hung", ip="127.0.0.3"),
                   Member("unknown")]
        found = asyncio.run(check(members, port, timeout_s=0.3))
    assert found.gone == {"dead": f"nothing listens on 127.0.0.2:{port}"}
    assert found.answering == {"alive"}
    assert not found.all_answer(members)
    with serving("127.0.0.1") as port, serving("127.0.0.2", port):
        both = [Member("a", ip="127.0.0.1"), Member("b", ip="127.0.0.2")]
        assert asyncio.run(check(both, port)).all_answer(both)


def test_a_check_that_finds_the_reporter_gone_proves_nothing():
    """The reporter wrote a moment ago: if its port refuses too, the operator is what cannot connect."""
    gone = {"j-worker-1": "nothing listens on 10.0.0.1:9400"}
    assert confirmed(gone, "j-worker-0") == gone
    assert confirmed({**gone, "j-worker-0": "nothing listens on 10.0.0.0:9400"}, "j-worker-0") == {}
