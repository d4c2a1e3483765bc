"""The job's time ledger: every second from its creation to its final phase, in exactly one category.

``status.goodput.accountedUntil`` is a cursor; each reconcile attributes the
time from the cursor on and moves it, so no second is counted twice or left
out. Who knows what the time was spent on depends on where the job is:

- while no trainer reports (queued, suspended, pods starting), the phase the
  job was in says it: ``Suspended`` is queued time; ``Pending`` is starting
  before the first step ever reported, recovery after it;
- while rank 0's trainer reports, the differences between two readings of its
  ledger (``/progress``'s ``ledger``, trainer/ledger.py) say it, scaled to the
  interval; the first reading of a new process (one that started after the
  reading before) says it from the process's start, its training counted from
  its ``firstStep``, and before that start its pod was starting (recovery once
  steps were reported: a replacement's pod creation, image, imports and set-up,
  as is the process's own starting then); a first reading without
  ``firstStep`` (taken before the first step, or from an older trainer) ends a
  starting (or recovery) interval;
- the first reading of a process that started before the reading before (a
  survivor become rank 0) says it from its ``base``: its ledger as it was at the
  cursor (the prober asks for it, ``/progress?ledgerAt=``), so the interval
  holds what it did then, its training before the loss, the recovery and its
  first steps as rank 0; without a ``base`` (its ledger keeps none that old, or
  an older trainer) the interval is recovery;
- training over steps the job had already reached (``highWaterStep``), after a
  fallback to a checkpoint, is lost work;
- when the job leaves the active phases, the time since the last reading is
  finishing (Succeeded, Failed) or recovery (suspended or evicted mid-run), or
  starting if no step was ever reported; the termination summary's ledger,
  when rank 0 wrote one, is the last reading.

A reconcile with nothing new (no new reading while a trainer runs, less than
:data:`MIN_INTERVAL_S` of a phase without one) leaves the cursor where it is;
the next one accounts for the whole interval. docs/monitoring.md, "Goodput",
gives the categories' definitions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from cohort.api.models import Goodput, GoodputSeconds, LedgerReading

from ..lifecycle import ACTIVE_PHASES, FINAL_PHASES, fmt_micro_time, parse_time
from .decision import Decision, Inputs

MIN_INTERVAL_S = 5.0
# The trainer's ledger categories and the status fields they add to (ledger.CATEGORIES).
TRAINER_FIELDS = {"starting": "starting", "training": "training", "checkpoint": "checkpoint",
                  "recovery": "recovery", "straggler": "straggler", "evaluation": "evaluation",
                  "finishing": "finishing"}


def account(observed: Inputs, decision: Decision) -> None:
    """Move ``status.goodput`` on to this reconcile (see the module doc)."""
    g = decision.status.goodput
    before, after = observed.status.phase, decision.status.phase
    created = parse_time(str(observed.job.get("metadata", {}).get("creationTimestamp") or ""))
    first = not g.accounted_until
    cursor = parse_time(g.accounted_until) or created
    if cursor is None or (before in FINAL_PHASES and g.accounted_until):
        return  # nothing to count from, or the ledger is closed
    now = observed.now
    reading, base = _reading(observed, decision)
    if reading is not None and _same_process(reading, g.last_reading):
        until = min(_utc(reading.at), now)
        if until > cursor:
            _add_reading(g, g.last_reading, reading, (until - cursor).total_seconds())
            cursor = until
        g.last_reading = reading
    elif reading is not None and (g.last_reading.started_at == 0.0 or reading.at > g.last_reading.at):
        until = min(_utc(reading.at), now)
        if until > cursor:
            new_process = g.last_reading.started_at == 0.0 or reading.started_at >= g.last_reading.at
            if reading.first_step is not None and new_process:
                _first_reading(g, reading, cursor, until)
            elif base is not None and not new_process and reading.started_at <= base.at < until.timestamp():
                _add_reading(g, _caught_up(g, base), reading, (until - cursor).total_seconds())  # a survivor
            else:  # nothing of its life is known but the reading: up to it, it was starting (or recovery)
                _add(g, _waiting(g), (until - cursor).total_seconds())
            cursor = until
        g.last_reading = reading
        g.high_water_step = max(g.high_water_step, reading.step)
    left_active = before in ACTIVE_PHASES and after not in ACTIVE_PHASES
    idle = before not in ACTIVE_PHASES and (after != before or (now - cursor).total_seconds() >= MIN_INTERVAL_S)
    if (left_active or idle) and now > cursor:
        _add(g, _without_trainer(before, after, g.high_water_step, first), (now - cursor).total_seconds())
        cursor = now
    if cursor != parse_time(g.accounted_until):
        g.accounted_until = fmt_micro_time(cursor)
        if created is not None:
            g.wall_seconds = round((cursor - created).total_seconds(), 3)
        g.percent = round(100.0 * g.seconds.training / g.wall_seconds, 1) if g.wall_seconds > 0 else None


def _without_trainer(before: str, after: str, high_water: int, first: bool) -> str:
    """The category of an interval no trainer reading covers, by the phase the job was in."""
    if before in ACTIVE_PHASES:
        if not high_water:
            return "starting"  # no step was ever reported (rank 0 never answered): it never got further
        return "finishing" if after in FINAL_PHASES else "recovery"
    if before == "Suspended":
        return "queued"
    if first and after == "Suspended":
        return "queued"  # the first reconcile of a job that waits in a queue (its status says Pending)
    return "recovery" if high_water else "starting"


def _reading(observed: Inputs, decision: Decision) -> tuple[LedgerReading | None, LedgerReading | None]:
    """Rank 0's ledger: its termination summary's when it just finished, else its newest /progress; with it its
    ``base``, the same ledger as of the cursor, when the document has one."""
    docs: list[dict[str, Any] | None] = [observed.progress]
    if decision.status.phase in FINAL_PHASES and observed.world.members:
        rank0 = next((v for v in observed.pods if v.name == observed.world.members[0].pod), None)
        if rank0 is not None:
            docs.insert(0, rank0.termination_summary())
    for doc in docs:
        ledger = (doc or {}).get("ledger")
        if isinstance(ledger, dict):
            reading = parse_reading(ledger, (doc or {}).get("step"))
            if reading is not None:
                return reading, _base(ledger, reading)
    return None, None


def _base(ledger: dict[str, Any], reading: LedgerReading) -> LedgerReading | None:
    """The ledger's ``base`` (its totals at an earlier moment) as a reading of the same process, or None."""
    base = ledger.get("base")
    if not isinstance(base, dict):
        return None
    return parse_reading({**base, "pod": reading.pod, "startedAt": reading.started_at}, None)


def _caught_up(g: Goodput, base: LedgerReading) -> LedgerReading:
    """A survivor's ``base`` as of the job's high-water step: its mark is up to a second before the cursor, and the
    steps it ran from there to that step ran before the cursor, in step with the old rank 0 whose reading counted
    them; they are not computed again (lost work)."""
    behind = g.high_water_step - base.step
    if behind <= 0 or base.steps_run is None:
        return base
    return dataclasses.replace(base, step=g.high_water_step, steps_run=base.steps_run + behind)


def parse_reading(ledger: dict[str, Any], step: Any) -> LedgerReading | None:
    """A ``ledger`` document (docs/contracts.md §4) as a reading; None if it is not one. Its step is the
    ledger's own where it serves one (taken with ``stepsRun``), else ``step`` (the document's)."""
    try:
        seconds = {k: float(v) for k, v in (ledger.get("seconds") or {}).items() if k in TRAINER_FIELDS}
        first, ran = ledger.get("firstStep"), ledger.get("stepsRun")
        reading = LedgerReading(pod=str(ledger.get("pod") or ""), started_at=float(ledger["startedAt"]),
                                at=float(ledger["at"]), step=int(ledger.get("step", step) or 0),
                                first_step=None if first is None else int(first),
                                steps_run=None if ran is None else int(ran))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    for key, value in seconds.items():
        setattr(reading.seconds, TRAINER_FIELDS[key], max(0.0, value))
    return reading


def _same_process(a: LedgerReading, b: LedgerReading) -> bool:
    return b.started_at != 0.0 and a.started_at == b.started_at and a.pod == b.pod and a.at > b.at


def _first_reading(g: Goodput, reading: LedgerReading, cursor: dt.datetime, until: dt.datetime) -> None:
    """The first reading of a process that started after the reading before, accounting from ``cursor`` to
    ``until``. Up to the process's start its pod was starting (or recovery). Where the cursor is past that
    start, a phase without a reading (Pending, while the trainer set up) was accounted as starting (or
    recovery) over part of the process's life: that much is taken back, and the process's whole life up to
    the reading is what its ledger says, the difference from an empty ledger at its start whose step is the
    one its first step reached (the lost-work split counts its training from there)."""
    start = min(_utc(reading.started_at), until)
    taken = 0.0
    if start > cursor:
        _add(g, _waiting(g), (start - cursor).total_seconds())
        cursor = start
    else:
        taken = min((cursor - start).total_seconds(), getattr(g.seconds, _waiting(g)))
        _add(g, _waiting(g), -taken)
    empty = LedgerReading(pod=reading.pod, started_at=reading.started_at, at=reading.started_at,
                          step=reading.first_step or 0, steps_run=0)
    _add_reading(g, empty, reading, (until - cursor).total_seconds() + taken)


def _waiting(g: Goodput) -> str:
    """What a process's pod start, image, imports and set-up are: recovery once the job has reported a step."""
    return "recovery" if g.high_water_step else "starting"


def _add_reading(g: Goodput, last: LedgerReading, reading: LedgerReading, interval_s: float) -> None:
    """The difference between two readings of one process, scaled to the interval it accounts for. A
    process's own starting is the job's recovery once steps were reported (a replacement's imports)."""
    deltas = {f.name: max(0.0, getattr(reading.seconds, f.name) - getattr(last.seconds, f.name))
              for f in dataclasses.fields(GoodputSeconds)}
    total = sum(deltas.values())
    if total <= 0:
        _add(g, _waiting(g), interval_s)
        return
    if g.high_water_step:
        deltas["recovery"] += deltas.pop("starting")
    scale = interval_s / total
    training = deltas.pop("training")
    # Steps up to the high-water mark were computed before: their training is lost work.
    lost = training * _redone_share(g, last, reading)
    if lost:
        _add(g, "lost_work", lost * scale)
        training -= lost
    _add(g, "training", training * scale)
    for name, value in deltas.items():
        if value:
            _add(g, name, value * scale)
    g.high_water_step = max(g.high_water_step, reading.step)


def _redone_share(g: Goodput, last: LedgerReading, reading: LedgerReading) -> float:
    """The share of the steps run between two readings that computed again what the job had reached: of the
    steps run (``stepsRun``), those that took the job past its high-water step are new, the rest redone (a
    replacement restored from a checkpoint, or a process that went back to one in place, its step going down).
    Without ``stepsRun`` (older trainers), the steps between the two readings' step counts."""
    if reading.steps_run is not None and last.steps_run is not None:
        ran = reading.steps_run - last.steps_run
        if ran <= 0:
            return 0.0
        new = min(ran, max(0, reading.step - g.high_water_step))
        return (ran - new) / ran
    if reading.step > last.step and last.step < g.high_water_step:
        return (min(reading.step, g.high_water_step) - last.step) / (reading.step - last.step)
    return 0.0


def _add(g: Goodput, name: str, seconds: float) -> None:
    setattr(g.seconds, name, round(getattr(g.seconds, name) + seconds, 3))


def _utc(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc)
