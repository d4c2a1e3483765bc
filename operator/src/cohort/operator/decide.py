"""One reconcile's decisions for one job, as a pure function: observations in, a Decision out.

``decide`` is the whole lifecycle of issue 3 §4 and the operator's side of
membership (docs/contracts.md §3) in one readable pass, in this order:

1. extra pods (the job's labels, not its owner reference) are deleted;
2. finished jobs only clean up (and honour ``ttlSecondsAfterFinished``);
3. suspended jobs delete their pods and publish an empty world;
4. ``activeDeadlineSeconds``;
5. ``successPolicy``: the current rank 0 (or every member) exited 0 (checked
   before failures: peers of a finished rank 0 may fail on their way out);
6. failed workers are counted once (``status.retiring``), deleted, and leave
   the world; past ``maxRestarts`` the job fails;
7. stragglers: a replacement avoiding the slow pod's node is started, and
   swapped in once Ready;
8. the next world is published at once (no backoff on membership);
9. surplus pods are deleted (never members; newest first), missing ones are
   created, failure replacements only after the exponential backoff;
10. phase, belowMin timeout, conditions and counters.

The reconciler executes the Decision in a crash-safe order: world, status (which
persists ``podIndex`` before any pod with that index exists), deletions,
creations, Events.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from typing import Any, cast

from cohort.api.models import Phase, TrainingJobSpec, TrainingJobStatus

from .lifecycle import (
    ACTIVE_PHASES,
    FINAL_PHASES,
    backoff_seconds,
    effective_target,
    fmt_time,
    fmt_time_ceil,
    next_phase,
    parse_time,
    phase_conditions,
    seconds_until,
)
from .naming import selector_string
from .observe import PodView
from .stragglers import Straggler
from .world import Member, World, next_world


@dataclasses.dataclass(frozen=True)
class PodRequest:
    """A worker pod to create: its ordinal, and for a straggler's replacement what it replaces."""

    index: int
    replaces: str = ""
    avoid_nodes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclasses.dataclass
class Inputs:
    job: dict[str, Any]
    spec: TrainingJobSpec
    status: TrainingJobStatus
    world: World
    pods: list[PodView]
    now: dt.datetime
    straggler: Straggler | None = None
    progress: dict[str, Any] | None = None


@dataclasses.dataclass
class Decision:
    status: TrainingJobStatus
    world: World | None = None
    create: list[PodRequest] = dataclasses.field(default_factory=list)
    delete: dict[str, str] = dataclasses.field(default_factory=dict)  # pod -> why
    events: list[EventSpec] = dataclasses.field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    straggler_handled: bool = False  # the prober's verdict was acted on (starts its cooldown)
    waiting: str = ""  # why no world is formed yet, when it is not the usual "fewer than min"
    gang_holding: bool = False  # min are Ready, but a gang start holds out for the target
    replaced: dict[str, int] = dataclasses.field(default_factory=lambda: {"failure": 0, "straggler": 0})

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(EventSpec("Warning" if warning else "Normal", reason, message))

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.5)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def remove(self, pod: PodView, why: str) -> None:
        if not pod.terminating and pod.name not in self.delete:
            self.delete[pod.name] = why


def decide(observed: Inputs) -> Decision:
    status = copy.deepcopy(observed.status)
    decision = Decision(status=status)
    spec, now = observed.spec, observed.now
    meta = observed.job["metadata"]
    generation = int(meta.get("generation") or 0)
    ours = [view for view in observed.pods if view.owned]
    for view in observed.pods:
        if not view.owned:
            decision.remove(view, "carries the job's labels but was not created for it")
            if not view.terminating:
                decision.event("ExtraPodDeleted",
                               f"Deleted pod {view.name}: it carries the job's labels but is not its worker",
                               warning=True)
    existing = {view.name for view in ours}
    status.retiring = [n for n in status.retiring if n in existing]
    for view in ours:
        if view.name in status.retiring:
            decision.remove(view, "replaced")  # counted before a restart, not yet deleted: finish the job
    status.pod_index = max([status.pod_index] + [view.index + 1 for view in ours])
    status.observed_generation = generation
    status.selector = selector_string(meta["name"])

    if status.phase in FINAL_PHASES:
        _finished(observed, decision)
        return decision
    if spec.run_policy.suspend:
        _suspend(observed, decision)
        return decision
    if status.phase == "Suspended":
        decision.event("Resumed", "runPolicy.suspend is false: recreating the workers")
        status.phase, status.start_time, status.below_min_since, status.backoff_until = "Pending", "", "", ""
    if not status.start_time:
        status.start_time = fmt_time(now)

    deadline_s = spec.run_policy.active_deadline_seconds
    if deadline_s:
        left = seconds_until(parse_time(status.start_time), now) + deadline_s
        if left <= 0:
            _fail(observed, decision, "DeadlineExceeded",
                  f"the job ran longer than runPolicy.activeDeadlineSeconds={deadline_s}")
            return decision
        decision.requeue(left)

    world = observed.world
    by_name = {view.name: view for view in ours}
    done = {view.name for view in ours if view.succeeded}
    # Success first: when rank 0 finishes, its peers often fail on the way out
    # (their collectives lose a peer); that is not a failure of the job.
    if world.members and _succeeded(spec, world, done):
        _succeed(observed, decision, by_name.get(world.members[0].pod))
        return decision

    why: dict[str, str] = {}  # members leaving, and why (for the world's reason)
    lost_member = False
    ft = spec.fault_tolerance
    for view in ours:
        if not (view.failed and not view.terminating):
            continue
        if view.name not in status.retiring:
            status.retiring.append(view.name)
            status.restarts += 1
            status.replacements.failure += 1
            decision.replaced["failure"] += 1
            delay = backoff_seconds(status.restarts, ft.backoff_seconds, ft.max_backoff_seconds)
            status.backoff_until = fmt_time_ceil(now + dt.timedelta(seconds=delay))
            decision.event("WorkerFailed", f"Worker {view.name} failed ({view.describe_exit()}); failure "
                           f"{status.restarts} of faultTolerance.maxRestarts={ft.max_restarts}; replacement in "
                           f"{delay:g}s", warning=True)
            if status.restarts > ft.max_restarts:
                decision.remove(view, "failed")
                _fail(observed, decision, "TooManyRestarts",
                      f"{status.restarts} worker failures exceed faultTolerance.maxRestarts={ft.max_restarts}")
                return decision
        if view.name in world.names:
            why[view.name] = "failed"
            lost_member = True
        decision.remove(view, "failed")

    # A member finished: the job is completing. Freeze membership and creation
    # so the others can finish too instead of being re-formed into a new world.
    completing = any(n in done for n in world.names)

    for m in world.members:
        member = by_name.get(m.pod)
        if completing:
            break  # membership is frozen; completion or failure decides
        if member is None or member.terminating:
            why[m.pod], lost_member = "was deleted", True
            decision.event("WorkerLost", f"Worker {m.pod} (rank {world.rank_of(m.pod)}) was deleted", warning=True)
        elif member.active and not member.ready:
            why[m.pod], lost_member = "is no longer Ready", True
            decision.event("WorkerLost", f"Worker {m.pod} (rank {world.rank_of(m.pod)}) is no longer Ready",
                           warning=True)

    target, unit = spec.replicas.target, spec.parallelism.tensor * spec.parallelism.pipeline
    eff_target = _effective_target(spec)
    exclude, swap_pending = _stragglers(observed, decision, world, by_name, why, quiet=lost_member or completing,
                                        full=world.size >= eff_target)

    new_world = world
    if not completing:
        ready = [Member(view.name, view.uid, view.ip) for view in ours
                 if view.admissible and view.name not in exclude and view.name not in status.retiring]
        minimum = _gang_minimum(observed, decision, world, ready_count=len(ready), eff_target=eff_target)
        new_world = next_world(world, ready, target=target, unit=unit, minimum=minimum, why=why)
        if new_world.version != world.version:
            promoted = [m.pod for m in new_world.members if m.pod in {s.pod for s in world.spares}
                        and (lost_member or exclude)]
            for pod in promoted:
                decision.event("SparePromoted", f"Spare {pod} joined the world at once")
            decision.event("WorldPublished", f"World v{new_world.version}: {new_world.size} members "
                           f"[{', '.join(new_world.names)}]; {new_world.reason}")
        if new_world != world:
            decision.world = new_world
        for s in exclude:
            if s not in new_world.names and s in by_name:
                replacement = [m for m in new_world.names if m not in world.names]
                status.retiring.append(s)
                status.replacements.straggler += 1
                decision.replaced["straggler"] += 1
                decision.remove(by_name[s], "replaced as a straggler")
                decision.event("StragglerReplaced", f"Worker {s} was replaced as a straggler by "
                               f"{', '.join(replacement) or 'a spare'}")

    _scale(observed, decision, new_world, ours, completing=completing, swap_pending=swap_pending)

    prev = status.phase
    status.phase = cast(Phase, next_phase(prev, world_size=new_world.size, minimum=spec.replicas.min, target=eff_target,
                                          lost_member=lost_member))
    if new_world.size >= max(spec.replicas.min, 1):
        status.below_min_since = ""
    else:
        since = parse_time(status.below_min_since) or now
        status.below_min_since = fmt_time(since)
        left = seconds_until(since, now) + ft.below_min_timeout_seconds
        # A gang start has min Ready and waits for the rest on purpose: not a failure.
        if left <= 0 and not decision.gang_holding:
            _fail(observed, decision, "BelowMinTimeout", f"fewer than replicas.min={spec.replicas.min} workers were "
                  f"Ready for faultTolerance.belowMinTimeoutSeconds={ft.below_min_timeout_seconds}")
            return decision
        decision.requeue(left)
    if status.phase != prev:
        decision.event(status.phase, _phase_message(status.phase, new_world, spec.replicas.min, eff_target),
                       warning=status.phase == "Recovering")
    status.conditions = phase_conditions(status.conditions, phase=status.phase, world_size=new_world.size,
                                         target=eff_target, minimum=spec.replicas.min, final_reason="",
                                         final_message="", generation=generation, now=now, waiting=decision.waiting)
    _fill_counts(observed, decision, new_world, eff_target)
    _progress(observed, decision)
    return decision


def _gang_minimum(observed: Inputs, decision: Decision, world: World, *, ready_count: int, eff_target: int) -> int:
    """The fewest members the next world may have: a gang start holds out for the target.

    While no world exists (start, resume, or after a full restart), forming one
    with fewer than ``eff_target`` workers would be re-formed a moment later as
    the rest turn Ready. So the first world waits for the target, or for
    ``replicas.startupGraceSeconds`` of having no world (``below_min_since``),
    after which ``replicas.min`` is enough.
    """
    spec, minimum = observed.spec, observed.spec.replicas.min
    if world.members or ready_count >= eff_target or eff_target <= minimum:
        return minimum
    grace = spec.replicas.startup_grace_seconds
    since = parse_time(observed.status.below_min_since) or observed.now
    left = seconds_until(since, observed.now) + grace
    if left > 0:
        decision.requeue(left)
        decision.gang_holding = ready_count >= minimum
        until = fmt_time(since + dt.timedelta(seconds=grace))
        decision.waiting = (f"gang start: waiting for replicas.target={eff_target} Ready workers ({ready_count} "
                            f"Ready) until {until} (replicas.startupGraceSeconds={grace}), then for at least "
                            f"replicas.min={minimum}")
        return eff_target
    if ready_count >= minimum:
        decision.event("GangStartTimedOut", f"replicas.startupGraceSeconds={grace} passed with {ready_count} of "
                       f"{eff_target} workers Ready: starting with what is Ready (replicas.min={minimum})",
                       warning=True)
    return minimum


def _effective_target(spec: TrainingJobSpec) -> int:
    """replicas.target rounded down to a whole number of model-parallel units (tensor x pipeline)."""
    return effective_target(spec.replicas.target, spec.parallelism.tensor * spec.parallelism.pipeline)


def _phase_message(phase: str, world: World, minimum: int, target: int) -> str:
    if phase == "Running":
        return f"Training with a world of {world.size} workers (target {target})"
    if phase == "Recovering":
        return f"Lost a worker: world of {world.size}, target {target}; replacing it"
    return f"Waiting for at least replicas.min={minimum} Ready workers"


def _succeeded(spec: TrainingJobSpec, world: World, done: set[str]) -> bool:
    if spec.run_policy.success_policy == "rank0":
        return world.members[0].pod in done
    return all(n in done for n in world.names)


def _stragglers(observed: Inputs, decision: Decision, world: World, by_name: dict[str, PodView], why: dict[str, str], *,
                quiet: bool, full: bool) -> tuple[set[str], bool]:
    """Advance straggler swaps. Returns (members to swap out now, a replacement is still starting)."""
    exclude: set[str] = set()
    pending = False
    members = set(world.names)
    for r in by_name.values():
        if not r.replaces or not r.active:
            continue
        s = by_name.get(r.replaces)
        if s is None or not s.active or r.replaces in observed.status.retiring:
            continue  # the straggler is gone anyway: r is an ordinary worker now
        if r.replaces in members and r.ready:
            exclude.add(r.replaces)
            why[r.replaces] = "was replaced as a straggler"
        elif r.replaces in members:
            pending = True
        elif r.name in members:
            exclude.add(r.replaces)  # the swap was published before a restart: finish it
    verdict = observed.straggler
    if exclude or pending or verdict is None or quiet or not full or verdict.pod not in members:
        return exclude, pending
    s = by_name.get(verdict.pod)
    if s is None or not s.ready:
        return exclude, pending
    decision.straggler_handled = True
    policy = observed.spec.stragglers.policy
    if policy == "ignore":
        decision.event("StragglerDetected", f"{verdict.describe()} (stragglers.policy=ignore: no action)", warning=True)
        return exclude, pending
    spares = [m.pod for m in world.spares if m.pod in by_name and by_name[m.pod].admissible]
    if spares:
        exclude.add(s.name)
        why[s.name] = "was replaced as a straggler"
        decision.event("StragglerDetected", f"{verdict.describe()}; swapping in spare {spares[0]}", warning=True)
        return exclude, pending
    index = decision.status.pod_index
    decision.status.pod_index += 1
    decision.create.append(PodRequest(index=index, replaces=s.name, avoid_nodes=(s.node,) if s.node else ()))
    decision.event("StragglerDetected", f"{verdict.describe()}; starting a replacement away from node "
                   f"{s.node or '(unknown)'}", warning=True)
    return exclude, True


def _scale(observed: Inputs, decision: Decision, world: World, ours: list[PodView], *, completing: bool,
           swap_pending: bool) -> None:
    """Delete surplus pods (never members; not-Ready, then newest first) or create missing ones."""
    status, spec, now = decision.status, observed.spec, observed.now
    active = [view for view in ours if view.active and view.name not in decision.delete]
    desired = spec.replicas.target + spec.replicas.spares + (1 if swap_pending else 0)
    if len(active) > desired:
        keep = set(world.names) | {view.name for view in active if view.replaces and swap_pending}
        victims = sorted((view for view in active if view.name not in keep), key=lambda view: (view.ready, -view.index))
        for view in victims[: len(active) - desired]:
            decision.remove(view, "scaled down")
            decision.event("PodDeleted", f"Deleted worker {view.name}: replicas.target={spec.replicas.target}")
        return
    missing = desired - len(active) - len(decision.create)
    if missing <= 0 or completing:
        return
    wait = seconds_until(parse_time(status.backoff_until), now)
    if wait > 0:
        decision.requeue(wait)
        return
    for _ in range(missing):
        decision.create.append(PodRequest(index=status.pod_index))
        status.pod_index += 1


def _finished(observed: Inputs, decision: Decision) -> None:
    status = decision.status
    for view in observed.pods:
        if view.owned and view.active:
            decision.remove(view, f"job {status.phase}")
    ttl = observed.spec.run_policy.ttl_seconds_after_finished
    done_at = parse_time(status.completion_time)
    if ttl is not None and done_at is not None:
        left = seconds_until(done_at, observed.now) + ttl
        if left <= 0:
            decision.delete_job = True
            decision.event("TTLExpired", f"Deleting the job: runPolicy.ttlSecondsAfterFinished={ttl} passed")
        else:
            decision.requeue(left)
    status.replicas.active = 0
    status.replicas.ready = 0
    status.replicas.spares = 0


def _suspend(observed: Inputs, decision: Decision) -> None:
    status = decision.status
    active = [view for view in observed.pods if view.owned and view.active]
    if status.phase != "Suspended":
        decision.event("Suspended", f"runPolicy.suspend is true: deleting {len(active)} workers")
    for view in active:
        decision.remove(view, "job suspended")
    if observed.world.members or observed.world.spares:
        decision.world = World(version=observed.world.version + (1 if observed.world.members else 0),
                               reason="job suspended")
        if observed.world.members:
            decision.event("WorldPublished", f"World v{decision.world.version}: 0 members; job suspended")
    status.phase, status.backoff_until, status.below_min_since = "Suspended", "", ""
    generation = int(observed.job["metadata"].get("generation") or 0)
    eff = _effective_target(observed.spec)
    status.conditions = phase_conditions(status.conditions, phase="Suspended", world_size=0, target=eff,
                                         minimum=observed.spec.replicas.min, final_reason="", final_message="",
                                         generation=generation, now=observed.now)
    _fill_counts(observed, decision, decision.world or observed.world, eff)


def _finish(observed: Inputs, decision: Decision, phase: str, reason: str, message: str) -> None:
    status = decision.status
    status.phase = cast(Phase, phase)
    status.completion_time = fmt_time(observed.now)
    status.backoff_until = status.below_min_since = ""
    generation = int(observed.job["metadata"].get("generation") or 0)
    eff = _effective_target(observed.spec)
    status.conditions = phase_conditions(status.conditions, phase=phase, world_size=0, target=eff,
                                         minimum=observed.spec.replicas.min, final_reason=reason, final_message=message,
                                         generation=generation, now=observed.now)
    decision.event(phase, f"{reason}: {message}", warning=phase == "Failed")
    _finished(observed, decision)
    status.world.size = observed.world.size


def _fail(observed: Inputs, decision: Decision, reason: str, message: str) -> None:
    _finish(observed, decision, "Failed", reason, message)


def _succeed(observed: Inputs, decision: Decision, rank0: PodView | None) -> None:
    summary = rank0.termination_summary() if rank0 else {}
    if summary:
        _apply_progress(decision.status, summary, observed.now)
    policy = observed.spec.run_policy.success_policy
    if policy == "rank0":
        _finish(observed, decision, "Succeeded", "Rank0Succeeded", f"rank 0 ({rank0.name if rank0 else '?'}) exited 0")
    else:
        _finish(observed, decision, "Succeeded", "AllWorkersSucceeded", f"all {observed.world.size} members exited 0")


def _fill_counts(observed: Inputs, decision: Decision, world: World, eff_target: int) -> None:
    status = decision.status
    running = status.phase in ACTIVE_PHASES
    ready = [view for view in observed.pods if view.owned and view.admissible and view.name not in decision.delete]
    status.replicas.desired = eff_target
    status.replicas.active = world.size if running else 0
    status.replicas.ready = len(ready)
    status.replicas.spares = len(world.spares) if running else 0
    status.replicas.summary = f"{status.replicas.active}/{eff_target}"
    status.world.version = world.version
    status.world.size = world.size
    status.world.members = world.names
    status.world.reason = world.reason


def _progress(observed: Inputs, decision: Decision) -> None:
    if observed.progress:
        _apply_progress(decision.status, observed.progress, observed.now)


def _apply_progress(status: TrainingJobStatus, data: dict[str, Any], now: dt.datetime) -> None:
    """Copy a /progress document (or a termination summary) into the status, if anything changed."""
    pr = copy.deepcopy(status.progress)

    def num(key: str, cast: type) -> Any:
        value = data.get(key)
        try:
            return cast(value) if value is not None else None
        except (TypeError, ValueError):
            return None

    for key, attr, kind in (("step", "step", int), ("epoch", "epoch", int), ("loss", "loss", float),
                            ("samplesPerSecond", "samples_per_second", float), ("accuracy", "accuracy", float)):
        value = num(key, kind)
        if value is not None:
            setattr(pr, attr, value)
    if isinstance(data.get("plan"), str):
        pr.plan = data["plan"]
    if dataclasses.replace(pr, updated_at="") != dataclasses.replace(status.progress, updated_at=""):
        pr.updated_at = fmt_time(now)
        status.progress = pr
    ckpt = data.get("lastCheckpoint")
    if isinstance(ckpt, dict) and ckpt.get("step") is not None:
        try:
            status.last_checkpoint.step = int(ckpt["step"])
        except (TypeError, ValueError):
            return
        status.last_checkpoint.location = str(ckpt.get("location") or "")
        t = ckpt.get("time")
        if isinstance(t, (int, float)):
            status.last_checkpoint.time = fmt_time(dt.datetime.fromtimestamp(t, dt.timezone.utc))
        elif t:
            status.last_checkpoint.time = str(t)
