"""Worker metrics and the worker's HTTP endpoints: /metrics, /healthz, /livez, /progress.

The catalogue is fixed by docs/contracts.md §4 (the Grafana dashboard, the
alerts and the operator's straggler detector read these names).

/healthz is the readiness probe: 503 while the worker is still starting
(importing, building its data and model), 200 once it can join a world, so
neither the operator nor the local launcher admits a worker the world would
then wait for. /livez is the liveness probe: 200 whenever this process answers at
all (a frozen process, or one stuck holding the GIL, does not).

Why not ``prometheus_client.start_http_server``: a worker serves three more
paths on the same port (/healthz and /livez for the kubelet, /progress for the operator's
prober), and that server serves only /metrics. So one standard-library
ThreadingHTTPServer serves them all, with prometheus_client's own
``generate_latest`` for /metrics.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SLOW_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class WorkerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.step = Gauge("cohort_step", "Last completed optimizer step", registry=r)
        self.epoch = Gauge("cohort_epoch", "Current epoch", registry=r)
        self.steps = Counter("cohort_steps", "Steps completed by this process", registry=r)
        self.step_seconds = Histogram("cohort_step_seconds", "Wall time per step", buckets=STEP_BUCKETS, registry=r)
        self.compute_seconds = Histogram("cohort_step_compute_seconds",
                                         "Per-step compute without exposed communication",
                                         buckets=STEP_BUCKETS, registry=r)
        self.comm_seconds = Histogram("cohort_step_comm_seconds", "Per-step communication not hidden by compute",
                                      buckets=STEP_BUCKETS, registry=r)
        self.samples_per_second = Gauge("cohort_samples_per_second", "Global training throughput over the last ~30 s", registry=r)
        self.tokens_per_second = Gauge("cohort_tokens_per_second", "Global training throughput in tokens "
                                       "(language models: samples x sequence length; other models: samples)",
                                       registry=r)
        self.mfu = Gauge("cohort_mfu", "Model FLOPs utilisation: training FLOP/s over the devices' peak "
                         "(set only when the peak is known)", registry=r)
        self.device_memory_peak = Gauge("cohort_device_memory_peak_bytes", "Most device memory the allocator "
                                        "held (GPU workers)", registry=r)
        self.loss = Gauge("cohort_loss", "Latest training loss", registry=r)
        self.accuracy = Gauge("cohort_eval_accuracy", "Latest evaluation accuracy", registry=r)
        self.perplexity = Gauge("cohort_eval_perplexity", "Latest evaluation perplexity", registry=r)
        self.bytes_sent = Counter("cohort_bytes_sent", "Payload bytes this worker handed to its collectives for sync (TCP/IP and gloo framing not included)", registry=r)
        self.compression_ratio = Gauge("cohort_compression_ratio", "Dense fp32 bytes / payload bytes", registry=r)
        self.replica_drift = Gauge("cohort_replica_drift", "||this replica - the replicas' average|| / ||average||, "
                                   "measured at the last evaluation or periodic checkpoint of gossip or local SGD; "
                                   "0 while the replicas are one model", registry=r)
        self.checkpoint_seconds = Histogram("cohort_checkpoint_seconds", "Checkpoint stall / write time",
                                            ["phase"], buckets=SLOW_BUCKETS, registry=r)
        self.checkpoints = Counter("cohort_checkpoints", "Checkpoints committed", registry=r)
        self.world_size = Gauge("cohort_world_size", "Ranks in the current world", registry=r)
        self.world_version = Gauge("cohort_world_version", "Version of the current world", registry=r)
        self.collective_timeout = Gauge("cohort_collective_timeout_seconds", "How long the collectives now queued "
                                        "may wait for a peer before they fail", registry=r)
        self.rank = Gauge("cohort_rank", "This process's rank (-1: not a member)", registry=r)
        self.recoveries = Counter("cohort_recoveries", "World changes survived", ["source"], registry=r)
        self.recovery_seconds = Histogram("cohort_recovery_seconds", "Leaving the old world to first new step",
                                          buckets=SLOW_BUCKETS, registry=r)
        self.info = Gauge("cohort_trainer_info", "What is running",
                          ["job", "strategy", "sync", "compression", "plan"], registry=r)
        self.rank.set(-1)
        for src in ("peer", "checkpoint"):
            self.recoveries.labels(src)
        for phase in ("stall", "write"):
            self.checkpoint_seconds.labels(phase)
        self.progress: dict[str, Any] = {"state": "starting", "step": 0, "epoch": 0}
        # Read live with each /progress: TimeLedger.snapshot, given the query's ledgerAt (ledger.py).
        self.ledger: Callable[[float | None], dict[str, Any]] | None = None
        self.deadline: float | None = None  # monotonic: when what the trainer does now should be over
        self._lock = threading.Lock()

    def update_progress(self, **fields: Any) -> None:
        with self._lock:
            self.progress.update(fields)

    def due_in(self, seconds: float) -> None:
        """What the trainer starts now should be over in ``seconds`` (``overdueSeconds`` in /progress)."""
        self.deadline = time.monotonic() + seconds

    def starting(self) -> bool:
        """Still building the workload (the trainer sets another state when it can join a world)."""
        with self._lock:
            return self.progress.get("state") == "starting"

    def progress_json(self, ledger_at: float | None = None) -> bytes:
        """``/progress``; ``ledger_at`` (Unix seconds) asks for the ledger's ``base`` as of then as well."""
        with self._lock:
            doc = dict(self.progress)
        if self.deadline is not None:  # by this process's own clock: no skew between hosts
            doc["overdueSeconds"] = round(time.monotonic() - self.deadline, 3)
        if self.ledger is not None:
            doc["ledger"] = self.ledger(ledger_at)
        return json.dumps(doc).encode()

    def serve(self, host: str, port: int) -> ThreadingHTTPServer:
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                if path == "/metrics":
                    body, ctype = generate_latest(metrics.registry), CONTENT_TYPE_LATEST
                elif path == "/healthz":
                    if metrics.starting():  # Ready means able to join a world: not while the workload builds
                        self.send_error(503, "starting")
                        return
                    body, ctype = b"ok\n", "text/plain"
                elif path == "/livez":  # answering is the evidence, in any state
                    body, ctype = b"ok\n", "text/plain"
                elif path == "/progress":
                    body, ctype = metrics.progress_json(_ledger_at(query)), "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        return server


def _ledger_at(query: str) -> float | None:
    """``ledgerAt`` from a ``/progress`` query string (Unix seconds), None when absent or not a number."""
    values = urllib.parse.parse_qs(query).get("ledgerAt")
    try:
        return float(values[0]) if values else None
    except ValueError:
        return None
