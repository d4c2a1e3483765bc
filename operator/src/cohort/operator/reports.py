"""Survivors' reports: a member whose collective failed says so, and the operator checks who is gone.

Without them, a member that dies leaves the world only when its kubelet notices the dead container
(it relists about once a second), reports the pod Failed and the operator sees that: most of a
recovery on real nodes. Its peers know sooner, because their collective failed. Each writes
``{"pod", "version", "at", "error"}`` under ``report.json`` in the job's ``<job>-reports`` ConfigMap
(the one object workers may patch; docs/contracts.md §3), and the watch brings it here.

A report is a reason to look, not evidence: a worker could be wrong or lying. The operator asks every
member of the reported world for ``/healthz`` on its metrics port. A refused connection (the pod's network
is there and nothing listens: the trainer process is gone) or an unreachable address is evidence, and that
member leaves the world at once (decide.departures). A timeout is not: a busy or hung process may answer
late, and the kubelet or the trainer's own timeouts settle that case; so does a check that finds the
reporter itself gone (then the operator is what cannot connect). The pod itself is left for its kubelet to
report, so its failure is counted (faultTolerance.maxRestarts) when it is seen.

When every member answers, nobody is lost: the collective failed on a timeout too short for a slow step,
or on the network. Its ranks have left that world and wait for the next, so the operator publishes the same
members under a new version and they re-form in place (at most once per ``REFORM_INTERVAL_S``, so a timeout
that is always too short cannot keep a job re-forming; after that they wait, and exit when their wait ends).
So does a report while the reporter answers and another member accepts the connection but does not: it may
be hung, and the re-formed world's rendezvous tells (below).

A report may name members ``absent``: its writer waited out the rendezvous timeout of that world and they
never arrived. The operator asks each for ``/progress``: one still in a step of an older world or forming
that world's process group (cohort.api.progress), or one that accepts the connection and does not answer at
all, is hung (:func:`stuck`): its process is alive, so its kubelet will never report it, and it is counted
as a failed worker, deleted and replaced. One that answers from the new world (it arrived late) or while
waiting for one is not.

A hung member whose metrics thread answers is found before that: after a re-form, the members still in an
older world are asked once a second (:func:`in_old_worlds`), and one past its own deadline for what it does
there (cohort.api.progress) is hung the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
from collections.abc import Iterable
from typing import Any

from cohort.api import progress
from cohort.api.jobconfig import REFORM_INTERVAL_S as REFORM_INTERVAL_S
from cohort.api.progress import in_old_world

from .world import Member

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 0.5
NO_ROUTE = (errno.EHOSTUNREACH, errno.ENETUNREACH)


MAX_ABSENT = 64  # pods one report may name absent (it is workers' input)


@dataclasses.dataclass(frozen=True)
class Report:
    pod: str
    version: int
    at: float = 0.0
    error: str = ""
    absent: tuple[str, ...] = ()  # members that never arrived at the world's rendezvous


def parse_report(text: str | None) -> Report | None:
    """The report in the ConfigMap's ``report.json``; None if absent or not one (it is workers' input)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        absent = raw.get("absent") or []
        return Report(pod=str(raw["pod"]), version=int(raw["version"]), at=float(raw.get("at") or 0.0),
                      error=str(raw.get("error") or "")[:300],
                      absent=tuple(str(p) for p in absent[:MAX_ABSENT]) if isinstance(absent, list) else ())
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def confirmed(gone: dict[str, str], reporter: str) -> dict[str, str]:
    """What a check found, unless it found the reporter gone: it wrote a moment ago, so then it is this
    operator that cannot reach the workers' port (a policy that rejects rather than drops), and nothing
    it found is evidence."""
    return {} if reporter in gone else gone


@dataclasses.dataclass(frozen=True)
class Check:
    gone: dict[str, str]      # pod -> the evidence that its trainer is gone
    answering: frozenset[str]  # pods whose trainer answered over HTTP

    def all_answer(self, members: Iterable[Member]) -> bool:
        return not self.gone and all(m.pod in self.answering for m in members)


async def check(members: Iterable[Member], port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> Check:
    """Ask every member at once: who is certainly gone, and who answers."""
    members = [m for m in members if m.ip]
    found = await asyncio.gather(*(_probe(m.ip, port, timeout_s) for m in members))
    return Check(gone={m.pod: why for m, (why, _) in zip(members, found, strict=True) if why},
                 answering=frozenset(m.pod for m, (_, ok) in zip(members, found, strict=True) if ok))


async def _probe(ip: str, port: int, timeout_s: float) -> tuple[str, bool]:
    """(evidence it is gone, whether it answered): a GET /healthz; any HTTP status line is an answer
    (503 while starting too: the process is there)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout_s)
    except ConnectionRefusedError:
        return f"nothing listens on {ip}:{port}", False
    except OSError as e:
        return (f"{ip} is unreachable ({e.strerror})" if e.errno in NO_ROUTE else ""), False
    except asyncio.TimeoutError:
        return "", False
    try:
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        return "", line.startswith(b"HTTP/")
    except (OSError, asyncio.TimeoutError):
        return "", False
    finally:
        writer.close()


# How long an absent member has to answer /progress before its silence counts as a hang: generous, because a
# busy trainer answers from a thread that competes for the GIL (the kubelet's readiness probe allows 5 s).
STUCK_ANSWER_S = 3.0


async def stuck(members: Iterable[Member], port: int, version: int,
                timeout_s: float = STUCK_ANSWER_S) -> dict[str, str]:
    """Of ``members`` (reported absent from world ``version``'s rendezvous), the hung ones: pod -> evidence."""
    out = {}
    for pod, (doc, silent) in (await _ask(members, port, timeout_s)).items():
        held = in_old_world(doc, version) if doc is not None else ""
        if silent or held:
            out[pod] = silent or held
    return out


async def in_old_worlds(members: Iterable[Member], port: int, version: int,
                        timeout_s: float = STUCK_ANSWER_S) -> dict[str, str]:
    """Of the members of world ``version``, those whose trainer is still in an older world: pod ->
    evidence that it is hung there, past its own deadline (cohort.api.progress), or '' while it is not yet."""
    found = await _ask(members, port, timeout_s)
    return progress.in_old_worlds({pod: doc for pod, (doc, _) in found.items()}, version)


async def _ask(members: Iterable[Member], port: int,
               timeout_s: float) -> dict[str, tuple[dict[str, Any] | None, str]]:
    """Every member's answer to ``GET /progress`` at once (:func:`_progress`), by pod; members without an IP
    are left out."""
    members = [m for m in members if m.ip]
    found = await asyncio.gather(*(_progress(m.ip, port, timeout_s) for m in members))
    return {m.pod: answer for m, answer in zip(members, found, strict=True)}


async def _progress(ip: str, port: int, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
    """(the trainer's ``/progress``, evidence that it accepts connections and does not answer): (None, '')
    when neither is known (gone: the check above says so; unreachable: no evidence)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout_s)
    except (OSError, asyncio.TimeoutError):
        return None, ""
    try:
        writer.write(b"GET /progress HTTP/1.0\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(-1), timeout_s)  # HTTP/1.0: the trainer closes after it
    except asyncio.TimeoutError:
        return None, f"it accepts connections on {ip}:{port} and does not answer in {timeout_s:g}s"
    except OSError:
        return None, ""
    finally:
        writer.close()
    try:
        doc = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    except (IndexError, ValueError):
        return None, ""
    return (doc, "") if isinstance(doc, dict) else (None, "")
