"""Survivors' reports (reports.py): parsing what a worker wrote, and the check of who is gone, on real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import threading

import pytest
from tests.support.healthz import serving

from cohort.api.progress import OVERDUE_GRACE_S, overdue
from cohort.operator.reports import Report, check, confirmed, in_old_worlds, parse_report, stuck
from cohort.operator.world import Member


@pytest.mark.parametrize("text,expect", [
    (json.dumps({"pod": "j-worker-1", "version": 3, "at": 1.5, "error": "Connection closed by peer"}),
     Report("j-worker-1", 3, 1.5, "Connection closed by peer")),
    (json.dumps({"pod": "j-worker-1", "version": "4"}), Report("j-worker-1", 4)),
    (None, None), ("", None), ("not json", None), ("[1, 2]", None), (json.dumps({"pod": "p"}), None),
    (json.dumps({"pod": "p", "version": "seven"}), None),
    (json.dumps({"pod": "j-worker-0", "version": 5, "absent": ["j-worker-1"]}), Report("j-worker-0", 5, absent=("j-worker-1",))),
    (json.dumps({"pod": "j-worker-0", "version": 5, "absent": "j-worker-1"}), Report("j-worker-0", 5)),
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


def test_a_member_absent_from_a_rendezvous_is_hung_only_if_its_trainer_is_stuck_in_an_older_world():
    """Six members reported absent from world 5's rendezvous: one whose trainer is still in a step of world 4,
    one still forming world 4's group (NCCL's init waits for a dead member for good), one that accepts
    connections and never answers (the whole process stopped): hung. One waiting for the next world (it arrived
    late), one forming world 5's group (it arrived late), one gone (the check of who is gone says so, not this):
    not hung."""
    docs = {"127.0.0.1": {"state": "training", "worldVersion": 4}, "127.0.0.2": {"state": "recovering",
                                                                             "worldVersion": 4},
            "127.0.0.5": {"state": "forming", "worldVersion": 4}, "127.0.0.6": {"state": "forming", "worldVersion": 5}}
    with progress_served(docs) as port, socket.socket() as silent:
        silent.bind(("127.0.0.3", port))
        silent.listen()
        members = [Member("stuck", ip="127.0.0.1"), Member("late", ip="127.0.0.2"), Member("stopped", ip="127.0.0.3"),
                   Member("gone", ip="127.0.0.4"), Member("forming-old", ip="127.0.0.5"),
                   Member("forming-new", ip="127.0.0.6")]
        found = asyncio.run(stuck(members, port, 5, timeout_s=0.3))
    assert found == {"stuck": "its trainer is still in a step of world v4",
                     "stopped": f"it accepts connections on 127.0.0.3:{port} and does not answer in 0.3s",
                     "forming-old": "its trainer is still forming world v4's process group"}


@pytest.mark.parametrize("doc, hung", [
    ({"state": "training", "worldVersion": 4, "overdueSeconds": OVERDUE_GRACE_S + 0.5}, True),
    ({"state": "training", "worldVersion": 4, "overdueSeconds": OVERDUE_GRACE_S - 0.5}, False),  # not yet
    ({"state": "training", "worldVersion": 4, "overdueSeconds": -3.0}, False),  # time left in its step
    ({"state": "training", "worldVersion": 5, "overdueSeconds": 60.0}, False),  # in the current world
    ({"state": "recovering", "worldVersion": 4, "overdueSeconds": 60.0}, False),  # left the step
    ({"state": "forming", "worldVersion": 4, "overdueSeconds": OVERDUE_GRACE_S + 0.5}, True),  # its group never formed
    ({"state": "forming", "worldVersion": 4, "overdueSeconds": -50.0}, False),  # within its forming bound
    ({"state": "forming", "worldVersion": 5, "overdueSeconds": 60.0}, False),  # forming the current world
    ({"state": "training", "worldVersion": 4}, False),  # a trainer that gives no deadline
    ({"state": "training", "worldVersion": 4, "overdueSeconds": "late"}, False),  # workers' input
])
def test_a_member_is_overdue_only_in_an_older_world_s_step_past_its_deadline(doc, hung):
    assert bool(overdue(doc, 5)) is hung


def test_members_in_an_older_world_are_listed_with_the_evidence_once_overdue():
    docs = {"127.0.0.1": {"state": "training", "worldVersion": 4, "overdueSeconds": 9.5},
            "127.0.0.2": {"state": "training", "worldVersion": 4, "overdueSeconds": 0.1},
            "127.0.0.3": {"state": "recovering", "worldVersion": 4}}
    with progress_served(docs) as port:
        members = [Member("hung", ip="127.0.0.1"), Member("leaving", ip="127.0.0.2"), Member("left", ip="127.0.0.3")]
        found = asyncio.run(in_old_worlds(members, port, 5, timeout_s=0.3))
    assert found == {"hung": "its trainer is still in a step of world v4, 10s past its own deadline",
                     "leaving": ""}


@contextlib.contextmanager
def progress_served(docs: dict[str, dict[str, object]]):
    """Trainers' /progress on one port, each address its own document (HTTP/1.0: closed after the answer)."""
    servers = []

    class Progress(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(docs[self.server.server_address[0]]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    port = 0
    for ip in docs:
        server = http.server.ThreadingHTTPServer((ip, port), Progress)
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        yield port
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
