"""Reads training progress and step times from the workers (HTTP, docs/contracts.md §4).

Every ``progress`` interval, for each training job:

- rank 0's ``GET /progress`` becomes ``status.progress`` and ``status.lastCheckpoint``, and its
  ``ledger`` the job's goodput (decide/goodput.py);
- once rank 0 has answered (a job is training), every member's ``GET /metrics``
  feeds the straggler window, and the pure
  :func:`.stragglers.detect_straggler` may hand a verdict to the reconciler.

A worker that does not answer (not started yet, or a simulated kwok pod with
no process behind its IP) is asked less and less often, up to every
:data:`MAX_BACKOFF_S`, so unreachable pods cost next to nothing. The prober
never changes anything itself: it stores what it read in the job's memory
and enqueues a reconcile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .jobstate import JobMemory
from .lifecycle import ACTIVE_PHASES, parse_time
from .naming import METRICS_PORT
from .reconciler import Reconciler
from .stragglers import detect_straggler, parse_compute_sample

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 300.0
CONCURRENCY = 32


class Prober:
    def __init__(self, reconciler: Reconciler):
        self.rec = reconciler
        self.settings = reconciler.settings
        self._session: aiohttp.ClientSession | None = None
        self._sem = asyncio.Semaphore(CONCURRENCY)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.settings.http_timeout_s,
                                            sock_connect=min(1.0, self.settings.http_timeout_s))
            self._session = aiohttp.ClientSession(timeout=timeout,
                                                  connector=aiohttp.TCPConnector(limit=CONCURRENCY))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            jobs = [m for m in list(self.rec.jobs.values())
                    if m.body is not None and m.status.phase in ACTIVE_PHASES and m.world.members]
            if jobs:
                await asyncio.gather(*(self.probe_job(m) for m in jobs), return_exceptions=True)
            await asyncio.sleep(max(self.settings.progress_s - (time.monotonic() - started), 0.1))

    async def _get(self, mem: JobMemory, pod: str, ip: str, path: str) -> str | None:
        """GET a worker endpoint; None (and a longer wait before the next try) if it does not answer."""
        now = time.monotonic()
        if not ip or mem.probe_after.get(pod, 0.0) > now:
            return None
        try:
            async with self._sem, self.session.get(f"http://{ip}:{METRICS_PORT}{path}") as resp:
                if resp.status != 200:
                    raise aiohttp.ClientError(f"HTTP {resp.status}")
                text = await resp.text()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
            failures = mem.probe_failures.get(pod, 0) + 1
            mem.probe_failures[pod] = failures
            mem.probe_after[pod] = now + min(self.settings.progress_s * 2 ** (failures - 1), MAX_BACKOFF_S)
            return None
        mem.probe_failures.pop(pod, None)
        mem.probe_after.pop(pod, None)
        return text

    async def probe_job(self, mem: JobMemory) -> None:
        members = list(mem.world.members)
        if not members:
            return
        rank0 = members[0]
        spec = (mem.body or {}).get("spec") or {}
        stragglers = spec.get("stragglers") or {}
        progress_text = await self._get(mem, rank0.pod, rank0.ip, _progress_path(mem))
        if progress_text is None and mem.progress is None:
            return  # rank 0 has never answered: nothing trains yet (or a kwok pod, with no process at all)
        texts = [progress_text, *await asyncio.gather(*(self._get(mem, m.pod, m.ip, "/metrics") for m in members))]
        changed = False
        progress = _parse_json(texts[0])
        if progress is not None and progress != mem.progress:
            mem.progress = progress
            changed = True
        now = time.monotonic()
        for m, text in zip(members, texts[1:], strict=True):
            if text is None:
                continue
            try:
                sample = parse_compute_sample(text_string_to_metric_families(text), now)
            except (ValueError, TypeError) as e:
                log.debug("unreadable /metrics from %s: %s", m.pod, e)
                continue
            if sample is not None:
                mem.window.add(m.pod, sample)
        window_s = float(stragglers.get("windowSeconds") or 60)
        mem.window.retain([m.pod for m in members], now, keep_s=window_s * 2)
        # Always the latest verdict (or None): one about a pod that has left
        # the world meanwhile must not linger.
        verdict = detect_straggler(mem.window, [m.pod for m in members], now=now, window_s=window_s,
                                   threshold=float(stragglers.get("threshold") or 1.5),
                                   cooldown_until=mem.cooldown_until)
        if verdict is not None and verdict != mem.verdict:
            log.info("%s/%s: straggler: %s", mem.key[0], mem.key[1], verdict.describe())
            changed = True
        mem.verdict = verdict
        if changed:
            self.rec.queue.add(mem.key)


def _progress_path(mem: JobMemory) -> str:
    """``/progress``, asking for the ledger as of the end of the accounted time too (``base``): what a survivor
    become rank 0 had done by then, so the goodput of the interval since is split by its ledger
    (decide/goodput.py)."""
    until = parse_time(mem.status.goodput.accounted_until)
    return "/progress" if until is None else f"/progress?ledgerAt={until.timestamp():.3f}"


def _parse_json(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
