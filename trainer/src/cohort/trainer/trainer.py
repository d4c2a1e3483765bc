"""The training loop, with in-process elastic recovery.

Reads top to bottom: wait until the membership authority puts this pod in a
world, form that world's process group, agree on the state to continue from
(a live peer's, else the newest checkpoint, else a fresh start), then train
until the job is done or the world changes. On a change nothing restarts: the
process group is torn down and the loop goes round again, keeping the model,
optimizer and data position in memory.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cohort.api.jobconfig import JobConfig

from . import log as logmod
from . import progress
from .checkpoint import Checkpointer
from .checkpoint_schedule import CheckpointSchedule
from .collective_timeout import CollectiveTimeout
from .commit import CommitGate
from .faults import Faults
from .ledger import HealthyPace, TimeLedger
from .loader import BatchLoader
from .metrics import WorkerMetrics
from .optim import build_optimizer, lr_at
from .parallel.activation_checkpoint import applied_checkpointing, check_activation_checkpointing
from .parallel.activation_probe import ProbeBatch
from .parallel.auto import may_shard
from .parallel.base import Plan, PlanContext
from .parallel.registry import PARALLELISMS, SHARDED_STRATEGIES
from .paths import map_path
from .runtime.device import (
    NCCL_ERROR_HANDLING,
    backend_for,
    keep_process_on_nccl_errors,
    peak_memory_bytes,
    select_device,
)
from .runtime.exit import write_termination_message
from .runtime.interrupt import StepWatch
from .runtime.process_group import (
    Absent,
    Rendezvous,
    Superseded,
    abort_nccl_communicators,
    pod_ip,
    set_collective_timeout,
    uses_nccl,
)
from .runtime.world import StaticWorld, World, world_source_from_env
from .sampler import ElasticSampler
from .state import TrainState
from .step import MicroBatching, StepRunner
from .sync.base import CommStats
from .sync.flat import holding
from .sync.localsgd import carried_state
from .throughput import Throughput
from .timing import StepClock
from .workloads.workload import build_workload, summarize

log = logmod.get_logger(__name__)


class WorldChanged(Exception):
    """A newer world was published between steps."""


class Terminated(Exception):
    """SIGTERM (e.g. the pod is being deleted): stop between steps, leave cleanly."""


# Set by the SIGTERM handler (cli.py), possibly before the Trainer exists.
STOP_REQUESTED = threading.Event()


class Trainer:
    def __init__(self, cfg: JobConfig, env: dict[str, str] | None = None):
        env = dict(os.environ if env is None else env)
        self.ledger = TimeLedger()  # first: the process's whole life is accounted for (ledger.py)
        self.pace = HealthyPace()
        self.cfg, self.spec = cfg, cfg.spec
        self.pod = self.ledger.pod = env.get("COHORT_POD_NAME") or socket.gethostname()
        self.ip = pod_ip()
        logmod.context.update(job=cfg.name, pod=self.pod)
        if "OMP_NUM_THREADS" not in env:
            torch.set_num_threads(1)  # many small ranks share a node's cores; users raise it via env
        if self.spec.workload.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.device = select_device(env)  # before the process group and the model: everything lands there

        self.metrics = WorkerMetrics()
        self.metrics.ledger = self.ledger.snapshot
        port = int(env.get("COHORT_METRICS_PORT", cfg.metrics_port)) + int(env.get("LOCAL_RANK", "0"))
        self.http = self.metrics.serve(self.ip, port)
        self.faults = Faults.from_env(env)
        # COHORT_SAMPLE_LOG=<dir>: each completed step appends the sample indices this rank trained on to
        # <dir>/<pod>.jsonl (an audit of the data order; the exact-resume tests read it).
        sample_dir = env.get("COHORT_SAMPLE_LOG")
        self.sample_log = Path(sample_dir) / f"{self.pod}.jsonl" if sample_dir else None
        if self.sample_log is not None:
            self.sample_log.parent.mkdir(parents=True, exist_ok=True)

        self.workload = build_workload(self.spec)
        self.model = self.workload.model
        PARALLELISMS[self.spec.parallelism.strategy].check(self.spec, self.model)  # refuse what cannot run
        check_activation_checkpointing(self.spec.workload.activation_checkpointing, self.model)
        # Planning for the device's memory measures what the model keeps on two samples (activationCheckpointing
        # auto, strategy auto: parallel/activation_probe.py).
        self.probe = ProbeBatch.of(self.workload) if "auto" in (self.spec.workload.activation_checkpointing,
                                                                  self.spec.parallelism.strategy) else None
        # Sharded plans restart each world from an unsharded model, kept untouched on the host: each world's plan
        # shards a copy of it onto the device unit by unit (parallelize.py), so the device never holds the whole
        # model. An explicit sharded strategy never trains the model built here: it is that copy itself. Strategy
        # auto's model waits on the host too while a world may shard it (_place_replicas moves it if not).
        strategy = self.spec.parallelism.strategy
        sharded_only = strategy in SHARDED_STRATEGIES
        self.pristine = None if strategy == "data" else self.model if sharded_only else copy.deepcopy(self.model)
        self.sharded_model = False  # the model holds one world's shards (set by _enter_sharded)
        self.on_device = not sharded_only and not (strategy == "auto" and may_shard(self.spec))
        if self.on_device:
            self.model.to(self.device)  # placed before the optimizer exists, so its state lands there too
        self.optimizer = build_optimizer(self.model.parameters(), self.spec.workload.optimizer)
        data = self.workload.data
        self.sampler = ElasticSampler(len(data.train), self.spec.workload.batch_size, self.spec.workload.seed,
                                      self.spec.workload.global_batch_size)
        self.loader = BatchLoader(data.train, self.spec.workload.data_loader_workers,
                                  pin_memory=self.device.type == "cuda")
        self.stats = CommStats()
        self.gate = CommitGate(self.device)
        self.stepper = StepRunner(self.spec, self.device, self.stats, self.gate)
        self.state = TrainState(self.model, self.optimizer, self.sampler, self.device, self.stepper.scaler,
                                carried_state(self.spec, self.model))
        self.throughput = Throughput.of(self.workload, self.device, self.spec.workload.precision)
        ck_root = self.spec.checkpoint.path.rstrip("/") + "/" + cfg.name
        self.ckpt = Checkpointer(map_path(ck_root), self.spec.checkpoint.keep, self.spec.checkpoint.async_,
                                 self.metrics, display_root=ck_root)
        self.ckpt.check_writable()
        self.schedule = CheckpointSchedule(self.spec.checkpoint, self.device)

        self.worlds = world_source_from_env(env, cfg.namespace, self.pod)
        self.static = isinstance(self.worlds, StaticWorld)
        if keep_process_on_nccl_errors(self.device, not self.static, os.environ):  # torch reads the process's
            log.info("NCCL errors abort the communicators and keep the process", extra={"env": NCCL_ERROR_HANDLING})
        ft = self.spec.fault_tolerance
        self.rdzv = Rendezvous(self.ip, cfg.rendezvous_port, timeout_s=float(ft.process_group_timeout_seconds),
                               device=self.device)
        sync = self.spec.sync
        self.timeouts = CollectiveTimeout(ft.collective_timeout_seconds, self.rdzv.timeout_s,
                                          steps_per_sync=sync.period if sync.algorithm != "allreduce" else 1)
        self.armed_timeout_s: float | None = None  # what the groups' collectives get now; None: unknown
        self.near_warned: set[str] = set()  # the timeout fields a step came near (_warn_near_timeout)
        self.watch: StepWatch | None = None  # a newer world interrupts a stuck NCCL step (runtime/interrupt.py)
        self.plan: Plan | None = None
        self.world: World | None = None
        self.rank = -1
        self.joined = 0          # worlds this process has trained in
        self.left_at: float | None = None
        self.recovery_source = ""
        self.loss_ema: float | None = None
        self.eval_result: dict[str, float] = {}
        # The replicas' average at a step, shared by an evaluation and a save due at that step (one collective, not
        # two); dropped when the next step starts, and tied to the plan it came from (a new world makes its own).
        self._average: tuple[Any, int, torch.Tensor | None] | None = None
        self.clock = StepClock()
        self.last_wall = 0.0
        self.first_step_pending = False
        self._progress_at = 0.0
        self.t_start = time.monotonic()
        self.metrics.info.labels(cfg.name, self.spec.parallelism.strategy, self.spec.sync.algorithm,
                                 self.spec.compression.method, "").set(1)

    # --- the loop ---------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        # The loader's workers before this worker says it is ready ("waiting"): a world that takes it in,
        # a spare's included, does not wait for them.
        self.loader.start()
        self.metrics.update_progress(state="waiting")
        log.info("trainer started", extra={"ip": self.ip, "strategy": self.spec.parallelism.strategy})
        while True:
            world = self._await_membership()
            try:
                self._enter(world)
                self._train(world)
                # In the try: a peer lost during the final evaluation is recovered from like one lost
                # mid-step (the next world re-forms at the last step, trains none, and finishes again).
                return self._finish()
            except (Superseded, WorldChanged) as e:
                log.info("world changed", extra={"from_version": world.version, "reason": type(e).__name__})
            except (RuntimeError, Absent) as e:  # a collective failed (a peer died or left), or a member never came
                self.ledger.relabel("recovery")  # the failed step was detection, not training
                if self.static or not self._newer_world_arrives(world, e):
                    raise
                if self._excluded():
                    # The step in flight failed before the optimizer ran: the state is the last whole step.
                    self._checkpoint_on_stop()
            self._leave()

    def _await_membership(self) -> World:
        seen = self.world.version if self.world else 0
        while True:
            latest = self.worlds.latest
            if latest is not None and latest.version > seen and latest.rank_of(self.pod) is not None:
                return latest
            if STOP_REQUESTED.is_set():
                raise Terminated()
            self.metrics.update_progress(state="waiting")
            self.metrics.rank.set(-1)
            if latest is not None:
                seen = max(seen, latest.version)
            self.worlds.wait_newer(seen, timeout_s=0.5)

    def _newer_world_arrives(self, world: World, error: Exception) -> bool:
        first_line = (str(error).splitlines() or [type(error).__name__])[0][:300]
        absent = tuple(error.pods) if isinstance(error, Absent) else ()
        log.warning("collective failed; waiting for the next world",
                    extra={"version": world.version, "error": first_line, "absent": list(absent), "t": time.time()})
        # the operator (reports.py) or the launcher checks who is gone, or hung
        self.worlds.report_failure(world.version, first_line, absent)
        deadline = time.monotonic() + float(os.environ.get("COHORT_RECOVERY_WAIT_S", "120"))
        while (left := deadline - time.monotonic()) > 0:
            if STOP_REQUESTED.is_set():  # SIGTERM while waiting: leave now, not when the wait runs out
                self._checkpoint_on_stop()  # the failed step never reached the optimizer
                raise Terminated()
            if self.worlds.wait_newer(world.version, timeout_s=min(left, 0.5)) is not None:
                return True
        return False

    def _enter(self, world: World) -> None:
        rank = world.rank_of(self.pod)
        assert rank is not None
        self.world, self.rank = world, rank
        logmod.context.update(rank=rank, world_version=world.version)
        entering = "recovering" if self.joined else "joining"
        self.metrics.update_progress(state=entering)
        self.armed_timeout_s = self.rdzv.timeout_s  # a group this process forms starts with it
        if self.static:  # torchrun-style: the environment's group (unless the caller formed one)
            if dist.is_initialized():
                self.armed_timeout_s = None  # the caller's: set at the first step
            else:
                dist.init_process_group(backend_for(self.device),
                                        timeout=datetime.timedelta(seconds=self.rdzv.timeout_s),
                                        device_id=self.device if self.device.type == "cuda" else None)
        else:
            try:
                self.rdzv.join(world, rank, is_newer=lambda: self._latest_version() > world.version,
                               forming=lambda: self._forming(world))
            finally:  # "forming" only while the group forms (cohort.api.progress reads it as held there)
                self.metrics.update_progress(state=entering)
            if self.watch is None and uses_nccl():
                self.watch = StepWatch(self.worlds, abort_nccl_communicators, self._interrupt_grace_s).start()
        log.info("process group formed", extra={"size": world.size, "t": time.time()})
        if self.armed_timeout_s is not None:
            self.metrics.collective_timeout.set(self.armed_timeout_s)
        self.plan = PARALLELISMS[self.spec.parallelism.strategy](
            PlanContext(self.spec, rank, world.size, self.stats, model=self.pristine, device=self.device,
                        carried=self.state.sync, check_gate=self.gate.check, probe=self.probe))
        self.sampler.batch_size = self.plan.batch_size
        if self.plan.replicated and not self.sharded_model:
            self._place_replicas()
            self._agree_on_state()
            self.plan.apply(self.model)
        else:
            self._enter_sharded()
        self.metrics.world_size.set(world.size)
        self.metrics.world_version.set(world.version)
        self.metrics.rank.set(rank)
        self.metrics.info.clear()
        self.metrics.info.labels(self.cfg.name, self.spec.parallelism.strategy, self.spec.sync.algorithm,
                                 self.spec.compression.method, self.plan.describe()).set(1)
        self.joined += 1
        self.first_step_pending = True
        log.info("joined world", extra={"size": world.size, "step": self.state.step, "plan": self.plan.describe(),
                                        "source": self.recovery_source, "t": time.time()})

    def _forming(self, world: World) -> None:
        """Every member arrived: the group forms now. ``/progress`` says which world, with the time it allows
        (a member still forming an older world when its peers name it absent from the next is hung there:
        cohort.api.progress)."""
        self.metrics.due_in(self.rdzv.form_bound_s)
        self.metrics.update_progress(state="forming", worldVersion=world.version)

    def _place_replicas(self) -> None:
        """A replicated plan's first world for a model kept on the host (strategy auto): the model goes to the
        device, and the optimizer is built again over its parameters there (no step was taken yet)."""
        if self.on_device:
            return
        self.model.to(self.device)
        self.optimizer = build_optimizer(self.model.parameters(), self.spec.workload.optimizer)
        self.state.rebind(self.model, self.optimizer)
        self.on_device = True

    def _agree_on_state(self) -> None:
        """Continue from the highest step any member holds; else the newest checkpoint; else step 0."""
        mine = self.state.step if self.state.has_state else -1
        steps: list[int] = [mine]
        if dist.get_world_size() > 1:
            steps = [0] * dist.get_world_size()
            dist.all_gather_object(steps, mine)
        best = max(steps)
        if best >= 0:
            self.recovery_source = "peer"
            if any(s != best for s in steps):
                leader = steps.index(best)
                nbytes = self.state.broadcast(leader, self.rank)
                log.info("state handed over by a live peer", extra={"leader": leader, "step": best, "bytes": nbytes})
            return
        ref = self.ckpt.latest()
        if ref is not None:
            state = self.state.checkpoint_state()
            self.ckpt.load(ref.step, state, optional=TrainState.OPTIONAL)
            self.state.after_checkpoint_load(state)
            self.recovery_source = "checkpoint"
            log.info("resumed from checkpoint", extra={"step": ref.step, "location": ref.location})
        else:
            self.state.has_state = True  # every rank built the same seeded model
            self.recovery_source = "fresh"
        if dist.get_world_size() > 1 and ref is None:
            # Belt and braces: identical start everywhere. The sync's carried state (DiLoCo's θ and momentum,
            # two model-sized buffers) is the same on every rank before the first round: not sent.
            self.state.broadcast(0, self.rank, sync=False)

    def _enter_sharded(self) -> None:
        """A fresh model for this world's plan, then state from the newest checkpoint, else step 0.

        Shards are lost with the ranks that held them, so there is no live peer
        to copy from: the newest committed checkpoint is loaded after sharding,
        and DCP reshards it to this world's mesh (any dp, tp or pp degree).
        """
        assert self.plan is not None and self.pristine is not None
        self.model = copy.deepcopy(self.pristine)  # on the host: the plan places it, shard by shard
        self.on_device = True  # once placed below
        if self.plan.replicated:  # auto moved from a sharded plan to replicas: load into plain tensors
            self.model.to(self.device)
            self.optimizer = build_optimizer(self.model.parameters(), self.spec.workload.optimizer)
            self.state.rebind(self.model, self.optimizer)
            self.sharded_model = False
            self._agree_on_state()
            self.plan.apply(self.model)
            return
        self.plan.apply(self.model)
        self.optimizer = build_optimizer(self.model.parameters(), self.spec.workload.optimizer)
        self.state.rebind(self.model, self.optimizer)
        self.sharded_model = True
        ref = [self.ckpt.latest() if self.rank == 0 else None]
        if dist.get_world_size() > 1:
            dist.broadcast_object_list(ref, src=0)  # every rank loads the one rank 0 saw
        if ref[0] is None:
            self.state.has_state = True  # every rank built the same seeded model
            self.recovery_source = "fresh"
            return
        state = self.state.checkpoint_state()
        self.ckpt.load(ref[0].step, state, sharded=True, optional=TrainState.OPTIONAL)
        self.state.after_checkpoint_load(state)
        self.recovery_source = "checkpoint"
        log.info("resumed from checkpoint", extra={"step": ref[0].step, "location": ref[0].location})

    def _leave(self) -> None:
        log.info("left world", extra={"step": self.state.step})
        self.left_at = time.perf_counter()
        if self.ledger.current != "recovery":
            self.ledger.switch("recovery")
        self.plan = None
        self.metrics.update_progress(state="recovering")
        if not self.static:
            began = time.perf_counter()
            Rendezvous.leave()  # NCCL: aborted, not destroyed (process_group.py)
            log.info("process group torn down", extra={"seconds": round(time.perf_counter() - began, 4),
                                                       "t": time.time()})

    def _latest_version(self) -> int:
        latest = self.worlds.latest
        return latest.version if latest else 0

    def _done(self) -> bool:
        w = self.spec.workload
        if w.max_steps > 0 and self.state.step >= w.max_steps:
            return True
        return w.epochs > 0 and self.sampler.epoch >= w.epochs and w.max_steps <= 0

    def _last_step_taken(self, size: int) -> bool:
        """The step just taken is the job's last: its step budget reached, or the last epoch's batches taken."""
        w = self.spec.workload
        return self._done() or (w.max_steps <= 0 and 0 < w.epochs <= self.sampler.epoch + 1
                                and self.sampler.epoch_done(size))

    def _train(self, world: World) -> None:
        assert self.plan is not None
        size = self.plan.dp_size
        self.metrics.update_progress(state="training", worldVersion=world.version, rank=self.rank)
        self.clock.restart()
        self.pace.new_world(size)
        self.timeouts.new_world()
        while not self._done():
            if STOP_REQUESTED.is_set():
                self._checkpoint_on_stop()
                raise Terminated()
            if not self.static and self._latest_version() != world.version:
                if self._excluded():
                    self._checkpoint_on_stop()  # a world without this worker: it is leaving for good
                raise WorldChanged()
            if self.sampler.epoch_done(size):
                self._due_after_a_wait()
                self._end_epoch()
                self.timeouts.after(plain=False)
                continue
            self._arm_timeout(self.timeouts.for_next_step(self.clock.step_median()))
            self.metrics.due_in(self._step_allowance_s())
            if self.watch is None:
                self._step(size)
            else:
                self.watch.begin(world.version)
                try:
                    self._step(size)
                finally:
                    self.watch.end()
            self._warn_near_timeout()
            self._due_after_a_wait()
            every = self.spec.workload.eval_every_steps
            last = self._last_step_taken(size)  # the final evaluation and checkpoint follow, after plan.finish
            evaluated = bool(every and self.state.step % every == 0 and not last)
            if evaluated:
                self.evaluate()
            saved = not last and self._maybe_checkpoint()
            self.timeouts.after(plain=not evaluated and not saved)
            self.clock.record(self.last_wall, samples=self.sampler.global_batch(size))

    def _due_after_a_wait(self) -> None:
        """An evaluation or a save may follow, on this rank alone: its peers then wait in the next step with
        the group's timeout (collective_timeout.py)."""
        self.metrics.due_in(self.rdzv.timeout_s + self._step_allowance_s())

    def _step_allowance_s(self) -> float:
        """A step's compute stays under its collectives' timeout (else its peers' fail), and they wait at most
        that long: a step not over in twice that is stuck, as its peers see it."""
        return 2 * (self.armed_timeout_s or self.rdzv.timeout_s)

    def _warn_near_timeout(self) -> None:
        """Warn once per field when a step came near the timeout its collectives had (collective_timeout.py)."""
        timeout = self.armed_timeout_s or 0.0
        field = self.timeouts.near_limit(self.last_wall, timeout)
        if field is None or field in self.near_warned:
            return
        self.near_warned.add(field)
        log.warning(f"step {self.state.step} took {self.last_wall:.1f}s of the {timeout:.0f}s its collectives may "
                    f"wait for a peer ({field}): a step {timeout / self.last_wall:.1f}x slower fails; raise it",
                    extra={"step": self.state.step, "seconds": round(self.last_wall, 3), "timeout": timeout,
                           "field": field})

    def _interrupt_grace_s(self) -> float:
        """How long a step may go on once a newer world is seen before it counts as stuck."""
        median = self.clock.step_median()
        return max(1.0, 2 * median) if median is not None else 5.0

    def _arm_timeout(self, seconds: float) -> None:
        """Give the next collectives ``seconds`` to complete (collective_timeout.py)."""
        if seconds == self.armed_timeout_s or not dist.is_initialized():
            return
        set_collective_timeout(seconds)
        self.armed_timeout_s = seconds
        self.metrics.collective_timeout.set(seconds)

    def _step(self, size: int) -> None:
        assert self.plan is not None
        self._average = None  # before the step allocates: the average of the step before is done with
        step, dp_rank = self.state.step, self.plan.dp_rank
        self.faults.before_step(self.rank, step)
        idx = self.sampler.indices(dp_rank, size)
        global_batch = self.sampler.global_batch(size)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, global_batch / self.spec.workload.batch_size, self.spec,
                                self.sampler.epoch + self.sampler.offset / max(self.sampler.num_samples, 1))
        parts = self.sampler.micro_batches(size)
        whole = parts == 1 and len(idx) * size == global_batch  # one per-rank batch: no weighting needed
        micro = MicroBatching(parts, size, 0 if whole else global_batch)

        def applied() -> None:
            # The update is in the model: the step counts, even if the exchange after it (local SGD's
            # round, gossip's mixing) fails. Counted after that exchange instead, a failed round left a
            # model one update ahead of its step and data position: the step ran again in the next world,
            # its batch applied twice, and a checkpoint on leaving held the mismatch.
            if self.sample_log is not None:
                self._log_samples(step, idx)
            self.sampler.advance(size)
            self.state.step = step + 1
            self.state.has_state = True

        result = self.stepper.run(
            self.plan, self.optimizer, lambda: self.loader.get(idx, lambda: self.sampler.upcoming(dp_rank, size)),
            self.workload.loss_fn, micro, self.ckpt.before_update, step + 1, self.faults.delay,
            lambda: self.faults.after_backward(self.rank, step, self.model.parameters(), self.gate.fail), applied)
        self._record_step(result.wall_s, result.compute_s, result.comm_s, result.loss, size)

    def _log_samples(self, step: int, idx: torch.Tensor) -> None:
        assert self.sample_log is not None and self.plan is not None and self.world is not None
        line = {"step": step, "epoch": self.sampler.epoch, "offset": self.sampler.offset,
                "samples": self.sampler.num_samples,
                "world_version": self.world.version, "size": self.plan.dp_size, "dp_rank": self.plan.dp_rank,
                "indices": idx.tolist()}
        with open(self.sample_log, "a") as f:
            f.write(json.dumps(line) + "\n")

    def _record_step(self, wall: float, compute: float, comm: float, loss: float, size: int) -> None:
        m = self.metrics
        m.step.set(self.state.step)
        m.epoch.set(self.sampler.epoch)
        m.steps.inc()
        m.step_seconds.observe(wall)
        self.last_wall = wall
        m.compute_seconds.observe(max(compute, 0.0))
        m.comm_seconds.observe(max(comm, 0.0))
        self.loss_ema = loss if self.loss_ema is None else 0.9 * self.loss_ema + 0.1 * loss
        sps = self.sps
        if sps is not None:  # from the second loop on
            m.samples_per_second.set(sps)
            m.tokens_per_second.set(self.throughput.tokens_per_second(sps))
        mfu = self._mfu()
        if mfu is not None:
            m.mfu.set(mfu)
        peak = peak_memory_bytes(self.device)
        if peak is not None:
            m.device_memory_peak.set(peak)
        m.loss.set(loss)
        m.bytes_sent.inc(self.stats.bytes_sent - getattr(self, "_bytes_reported", 0))
        self._bytes_reported = self.stats.bytes_sent
        m.compression_ratio.set(self.stats.compression_ratio)
        m.replica_drift.set(self.stats.replica_drift)
        if self.first_step_pending:  # every rank, newcomers too: where benchmarks end a recovery
            self.first_step_pending = False
            self.ledger.first_step_in_world(self.state.step)  # it ends starting or recovery
            log.info("first step in world", extra={"step": self.state.step, "t": time.time()})
        else:
            self.pace.add(self.ledger.step(self.pace.healthy(), self.spec.stragglers.threshold, self.state.step))
        if self.left_at is not None:  # first step of a new world completes a recovery
            m.recovery_seconds.observe(time.perf_counter() - self.left_at)
            m.recoveries.labels("checkpoint" if self.recovery_source == "checkpoint" else "peer").inc()
            log.info("recovered", extra={"seconds": round(time.perf_counter() - self.left_at, 4),
                                         "step": self.state.step, "source": self.recovery_source,
                                         "t": time.time()})
            self.left_at = None
        self._publish_progress()

    def _publish_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._progress_at < 0.25:  # readers poll every second or so
            return
        self._progress_at = now
        last, dp = self.ckpt.last, self.plan.dp_size if self.plan else None
        total = progress.total_steps(self.spec.workload, self.sampler, self.state.step, dp)

        sps = self.sps

        def seconds_for(steps: int) -> int | None:
            return progress.seconds_for(steps, self.sampler, dp, sps)

        self.metrics.update_progress(
            state="training", step=self.state.step, epoch=self.sampler.epoch, loss=self.loss_ema,
            samplesPerSecond=sps, plan=self.plan.describe() if self.plan else "",
            worldVersion=self.world.version if self.world else 0, worldSize=self.world.size if self.world else 0,
            tokensPerSecond=self.throughput.tokens_per_second(sps) if sps else None,
            mfu=self._mfu(),
            accuracy=self.eval_result.get("accuracy"), perplexity=self.eval_result.get("perplexity"),
            evalLoss=self.eval_result.get("eval_loss"),
            lastCheckpoint=last.to_json() if last else None,
            # what a restart now would cost: the work since the newest durable checkpoint (or since step 0)
            restartCostSeconds=seconds_for(self.state.step - (last.step if last else 0)),
            stepsTotal=total, etaSeconds=None if total is None else seconds_for(max(0, total - self.state.step)))

    @property
    def sps(self) -> float | None:
        """Global samples per second over the loop's last ~30 s (timing.StepClock)."""
        return self.clock.samples_per_second()

    def _mfu(self) -> float | None:
        sps = self.sps
        if not sps:
            return None
        mfu = self.throughput.mfu(sps, self.world.size if self.world else 1)
        return round(mfu, 4) if mfu is not None else None

    def _end_epoch(self) -> None:
        self.sampler.next_epoch()
        every = self.spec.workload.eval_every_epochs
        if every and self.sampler.epoch % every == 0 and self.sampler.epoch < self.spec.workload.epochs:
            self.evaluate()

    def evaluate(self) -> dict[str, float]:
        """Collective evaluation: each rank scores its shard of the eval set; sums are all-reduced."""
        assert self.plan is not None
        self._arm_timeout(self.timeouts.long_s)  # ranks evaluate at their own pace before the collectives
        with self.ledger.during("evaluation"):
            return self._evaluate()

    def _evaluate(self) -> dict[str, float]:
        assert self.plan is not None
        data = self.workload.data
        module = self.plan.eval_module()
        was_training = module.training
        module.eval()
        sums: dict[str, float] = {}
        one = self._consensus()  # replicas that train apart: the model they make (as saved)
        with torch.no_grad(), holding(list(self.model.parameters()), one):
            # Batches of 4 x batchSize: no activations are kept for a backward, but the outputs (an lm's
            # logits: batch x seq x vocab) are as large as the training step's.
            for target, out in self.plan.eval_outputs(data.eval, 4 * self.spec.workload.batch_size):
                for k, v in self.workload.batch_metrics(out, target).items():
                    sums[k] = sums.get(k, 0.0) + v
        module.train(was_training)
        keys = sorted(sums) or ["count"]
        if dist.is_initialized() and dist.get_world_size() > 1:  # ranks without outputs have no keys
            every: list[list[str]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(every, keys)
            keys = sorted(set().union(*every))
        vec = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(vec)
        self.eval_result = summarize(self.workload.task, dict(zip(keys, vec.tolist(), strict=True)))
        if "accuracy" in self.eval_result:
            self.metrics.accuracy.set(self.eval_result["accuracy"])
        if "perplexity" in self.eval_result:
            self.metrics.perplexity.set(self.eval_result["perplexity"])
        drift = {"replica_drift": round(self.stats.replica_drift, 6)} if one is not None else {}
        log.info("evaluated", extra={"step": self.state.step, "epoch": self.sampler.epoch, **self.eval_result, **drift})
        return self.eval_result

    def _maybe_checkpoint(self, final: bool = False) -> bool:
        """Save if one is due (checkpoint_schedule.py); True if one was, on any rank (rank 0 saves a
        replicated plan alone)."""
        if self.plan is None:
            return False
        agree = not final and dist.is_initialized() and dist.get_world_size() > 1
        if not self.schedule.due(self.state.step, final, agree):
            return False
        self._arm_timeout(self.timeouts.long_s)  # the others wait in the next step while it saves
        with self.ledger.during("checkpoint"):
            # Every rank decided this save (a final one may be rank 0's alone: it holds its own replica).
            params = None if final else self._consensus()
            if self.plan.replicated and self.rank != 0:
                return True
            meta = {"worldSize": self.world.size if self.world else 1, "plan": self.plan.describe()}
            self.ckpt.save(self.state.step, self.state.checkpoint_state(params), meta, coordinator=self.rank == 0,
                           sharded=not self.plan.replicated, group=self.plan.checkpoint_group)
        return True

    def _consensus(self) -> torch.Tensor | None:
        """Collective: the plan's consensus at this step (``Plan.consensus``), computed once per step and plan."""
        assert self.plan is not None
        if self._average is None or self._average[0] is not self.plan or self._average[1] != self.state.step:
            self._average = (self.plan, self.state.step, self.plan.consensus(self.state.step))
        return self._average[2]

    def _excluded(self) -> bool:
        """The newest world leaves this worker out (suspend, eviction, scale-down, replacement)."""
        latest = self.worlds.latest
        return latest is not None and latest.rank_of(self.pod) is None

    def _checkpoint_on_stop(self) -> None:
        """Leaving for good between steps (SIGTERM, or a world without this worker: suspend, a Kueue
        eviction; also when a peer left first and the step in flight failed): rank 0 of a replicated plan holds the whole state and saves it alone, so nothing
        since the last checkpoint is lost when no worker stays. Sharded plans would need every rank in a
        collective save while the pods are going away: they keep their newest periodic checkpoint."""
        if self.plan is None or not self.plan.replicated or self.rank != 0:
            return
        before = self.schedule.last_step
        self._maybe_checkpoint(final=True)
        with self.ledger.during("checkpoint"):
            self.ckpt.wait()
        if self.schedule.last_step != before:
            log.info("checkpointed on leaving", extra={"step": self.state.step})

    def _finish(self) -> dict[str, Any]:
        self._due_after_a_wait()
        self.faults.before_step(self.rank, self.state.step)  # COHORT_FAULT_KILL at the last step fires here
        self.ledger.switch("finishing")
        if self.plan is not None:  # replicas that trained apart become one: the model saved and evaluated
            self.plan.finish(self.state.step)
        self._average = None  # one taken at this step (an epoch's end) is not the model finish made
        self._maybe_checkpoint(final=True)  # before the evaluation: durable even if a peer is lost in it
        self.evaluate()
        with self.ledger.during("checkpoint"):
            self.ckpt.wait()  # the last commit: blocked by a save
        summary = {"step": self.state.step, "epoch": self.sampler.epoch, "loss": self.loss_ema,
                   **self.eval_result, "samplesPerSecond": self.sps,
                   "tokensPerSecond": self.throughput.tokens_per_second(self.sps) if self.sps else None,
                   "mfu": self._mfu(), "device": str(self.device), "peakMemoryBytes": peak_memory_bytes(self.device),
                   "precision": self.spec.workload.precision, "compiled": self.spec.workload.compile,
                   # the mode the blocks run (auto's choice), else the spec's
                   "activationCheckpointing": applied_checkpointing(self.model)
                   or self.spec.workload.activation_checkpointing,
                   "worldVersion": self.world.version if self.world else 0, "checkpoints": self.ckpt.committed,
                   # the newest durable checkpoint, so the job's status names it at the end (a /progress read
                   # before the last saves would name one the keep limit has pruned since)
                   "lastCheckpoint": self.ckpt.last.to_json() if self.ckpt.last else None,
                   "seconds": round(time.monotonic() - self.t_start, 3), "rank": self.rank,
                   "stepSecondsMedian": self.clock.step_median(), "loopSecondsMean": self.clock.loop_mean(),
                   "plan": self.plan.describe() if self.plan else "", "ledger": self.ledger.snapshot()}
        self.metrics.update_progress(state="done", **{k: v for k, v in summary.items()
                                                      if k not in ("seconds", "ledger")})
        log.info("training complete", extra=summary)
        write_termination_message(summary)
        if dist.is_initialized():
            dist.destroy_process_group()
        return summary
