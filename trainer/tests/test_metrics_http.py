"""The worker's HTTP endpoints: /healthz is readiness (a starting worker is not ready), /livez liveness."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from cohort.trainer.metrics import WorkerMetrics
from cohort.trainer.runtime.ports import free_port


def get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def served():
    port = free_port()
    metrics = WorkerMetrics()
    server = metrics.serve("127.0.0.1", port)
    yield metrics, port
    server.shutdown()
    server.server_close()


def test_healthz_is_503_while_starting_and_200_once_the_worker_can_join(served):
    metrics, port = served
    assert get(port, "/healthz") == 503       # importing, building data and model: not Ready
    assert get(port, "/livez") == 200         # but alive: the kubelet must not kill a worker building its data
    assert get(port, "/progress") == 200      # progress and metrics answer all along
    assert get(port, "/metrics") == 200
    metrics.update_progress(state="waiting")  # what Trainer.run sets first
    assert get(port, "/healthz") == 200
    metrics.update_progress(state="training")
    assert get(port, "/healthz") == 200


def test_progress_says_how_far_past_its_deadline_the_trainer_is_by_its_own_clock(served):
    """``overdueSeconds`` (docs/contracts.md §4): what a membership authority reads to find a member hung in
    an older world's step (cohort.api.progress), counted when the document is served."""
    import json
    import time

    metrics, port = served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=5) as r:
        assert "overdueSeconds" not in json.load(r)  # no step begun: no deadline
    metrics.due_in(0.2)
    time.sleep(0.5)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=5) as r:
        late = json.load(r)["overdueSeconds"]
    assert 0.25 <= late < 5, late


def test_progress_serves_the_ledgers_base_for_the_time_in_its_query(served):
    """The operator asks rank 0 for ``/progress?ledgerAt=<Unix seconds>``: the ledger's totals as of then
    come as ``ledger.base`` (decide/goodput.py splits a survivor become rank 0's first interval with it)."""
    import json
    import time

    from cohort.trainer.ledger import TimeLedger

    metrics, port = served
    ledger = TimeLedger()
    metrics.ledger = ledger.snapshot

    def progress(path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return json.load(r)["ledger"]

    assert "base" not in progress("/progress")
    assert "base" not in progress("/progress?ledgerAt=not-a-time")
    assert "base" not in progress(f"/progress?ledgerAt={ledger.started_at - 10:.3f}")
    base = progress(f"/progress?ledgerAt={time.time():.3f}")["base"]
    assert base["at"] == pytest.approx(ledger.started_at, abs=0.01) and base["stepsRun"] == 0
