"""Lifecycle rules of a TrainingJob: phases, conditions, timers and backoff.

Pure functions used by :mod:`.decide`. The phases (``models.PHASES``):

- ``Pending``: started (or resumed), fewer than ``replicas.min`` workers Ready;
- ``Running``: a world of at least ``replicas.min`` workers trains;
- ``Recovering``: a member was lost (failed, deleted, not Ready); lasts until the
  world is back at its target size, or fails the job if it stays below min for
  ``belowMinTimeoutSeconds``;
- ``Suspended``: ``runPolicy.suspend`` is true; no pods, status kept;
- ``Succeeded`` / ``Failed``: final.

Conditions follow the Kubernetes conventions: one entry per type, a
``lastTransitionTime`` that moves only when the status flips, and the
``observedGeneration`` they were computed from.
"""

from __future__ import annotations

import datetime as dt

from cohort.api.models import Condition

FINAL_PHASES = ("Succeeded", "Failed")
ACTIVE_PHASES = ("Running", "Recovering")
CONDITION_TYPES = ("Ready", "Running", "Suspended", "Succeeded", "Failed")


# --- time -----------------------------------------------------------------

def fmt_time(t: dt.datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes it."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_micro_time(t: dt.datetime) -> str:
    """RFC 3339 in UTC to the microsecond, as Kubernetes writes a MicroTime (a Lease's times, an Event's eventTime)."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fmt_time_ceil(t: dt.datetime) -> str:
    """Like :func:`fmt_time`, rounded up: a deadline written this way is never early."""
    whole = t.replace(microsecond=0)
    return fmt_time(whole if whole == t else whole + dt.timedelta(seconds=1))


def parse_time(s: str | None) -> dt.datetime | None:
    if not s:
        return None
    try:
        return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(dt.timezone.utc)
    except ValueError:
        return None


def seconds_until(when: dt.datetime | None, now: dt.datetime) -> float:
    return 0.0 if when is None else (when - now).total_seconds()


# --- backoff ----------------------------------------------------------------

def backoff_seconds(failures: int, base_s: int, cap_s: int) -> float:
    """Delay before replacing the ``failures``-th failed worker: base, 2 x base, 4 x base... capped."""
    if failures <= 0 or base_s <= 0:
        return 0.0
    # Bound the exponent: 2**64 x base is far past any cap and stays a float.
    return float(min(base_s * 2.0 ** min(failures - 1, 64), max(cap_s, 0)))


# --- phase ------------------------------------------------------------------

def next_phase(prev: str, *, world_size: int, minimum: int, target: int, lost_member: bool) -> str:
    """The phase of a started, unsuspended, unfinished job after this reconcile."""
    was_active = prev in ACTIVE_PHASES
    if world_size >= max(minimum, 1):
        if was_active and (lost_member or (prev == "Recovering" and world_size < target)):
            return "Recovering"
        return "Running"
    return "Recovering" if was_active else "Pending"


def effective_target(target: int, unit: int) -> int:
    """The largest world ``target`` allows: a multiple of the model-parallel unit."""
    unit = max(unit, 1)
    return (target // unit) * unit


# --- conditions -------------------------------------------------------------

def set_condition(conditions: list[Condition], type_: str, status: bool, reason: str, message: str,
                  *, generation: int, now: dt.datetime) -> list[Condition]:
    """The list with ``type_`` set; its lastTransitionTime moves only when its status changes."""
    value = "True" if status else "False"
    out: list[Condition] = []
    found = False
    for c in conditions:
        if c.type != type_:
            out.append(c)
            continue
        found = True
        changed = c.status != value
        out.append(Condition(type=type_, status=value, reason=reason, message=message,  # type: ignore[arg-type]
                             last_transition_time=fmt_time(now) if changed or not c.last_transition_time
                             else c.last_transition_time,
                             observed_generation=generation))
    if not found:
        out.append(Condition(type=type_, status=value, reason=reason, message=message,  # type: ignore[arg-type]
                             last_transition_time=fmt_time(now), observed_generation=generation))
    return out


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def phase_conditions(conditions: list[Condition], *, phase: str, world_size: int, target: int, minimum: int,
                     final_reason: str, final_message: str, generation: int,
                     now: dt.datetime, waiting: str = "", suspended_reason: str = "Suspended",
                     suspended_message: str = "runPolicy.suspend is true: workers deleted") -> list[Condition]:
    """Ready, Running, Suspended, Succeeded and Failed for ``phase`` (``waiting``: why no world yet;
    ``suspended_*``: why a Suspended job is, for a job waiting in a Kueue queue Kueue's words)."""
    def put(type_: str, status: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, status, reason, message, generation=generation, now=now)

    training = phase in ACTIVE_PHASES and world_size >= max(minimum, 1)
    full = training and world_size >= target
    if full or not (phase in FINAL_PHASES or phase == "Suspended"):
        put("Ready", full, "AllWorkersReady" if full else "WorkersNotReady",
            f"{world_size}/{target} workers in the world")
    else:  # no workers to wait for: "0/4 workers in the world" under a Succeeded job read as a fault
        put("Ready", False, phase, f"job is {phase}")
    if training:
        put("Running", True, "Training", f"training with a world of {world_size} workers")
    elif phase in FINAL_PHASES or phase == "Suspended":
        put("Running", False, phase, f"job is {phase}")
    else:
        put("Running", False, "WaitingForWorkers",
            waiting or f"waiting for at least replicas.min={minimum} Ready workers ({world_size} in the world)")
    put("Suspended", phase == "Suspended", suspended_reason if phase == "Suspended" else "NotSuspended",
        suspended_message if phase == "Suspended" else "")
    put("Succeeded", phase == "Succeeded", final_reason if phase == "Succeeded" else "NotSucceeded",
        final_message if phase == "Succeeded" else "")
    put("Failed", phase == "Failed", final_reason if phase == "Failed" else "NotFailed",
        final_message if phase == "Failed" else "")
    return conditions
