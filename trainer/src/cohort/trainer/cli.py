"""Command lines: ``cohort-train`` (what runs in a pod) and ``cohort``'s trainer commands (run, validate,
plan, calibrate, train).

The ``cohort`` console script is cohort-client's (``cohort.client.cli``): it serves the cluster
commands itself and hands these, argv unchanged, to :func:`main` here.

Bad input exits 2 with one line that names the field or module at fault.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
from typing import Any

from cohort.api import ValidationError
from cohort.api.jobconfig import load_config, load_manifest


def _fail(error: str | Exception) -> int:
    """Exit status 2, saying why: each problem of a :class:`ValidationError` on a line of its own."""
    for problem in getattr(error, "problems", None) or (str(error),):
        print(f"error: {problem}", file=sys.stderr)
    return 2


def _fail_worker(message: str) -> int:
    """_fail, and the message as the termination message (docs/contracts.md §5): the job's status says it."""
    from .runtime.exit import write_termination_message

    write_termination_message({"error": message})
    return _fail(message)


def _user_errors() -> tuple[type[Exception], ...]:
    from .checkpoint import CheckpointError
    from .workloads.workload import WorkloadError

    return (ValidationError, WorkloadError, CheckpointError)


def cmd_train(args: argparse.Namespace) -> int:
    import faulthandler
    import logging

    from . import log

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack to the log
    log.configure()
    from .trainer import STOP_REQUESTED, Terminated

    # SIGTERM (pod deletion, scale-down): finish the step in flight, then leave cleanly.
    signal.signal(signal.SIGTERM, lambda signum, frame: STOP_REQUESTED.set())
    try:
        cfg = load_config(args.config)
        from .trainer import Trainer

        trainer = Trainer(cfg)
    except _user_errors() as e:
        return _fail_worker(str(e))
    rc = 0
    try:
        trainer.run()
    except ValidationError as e:  # a plan this world cannot run (e.g. not a multiple of tensor x pipeline)
        rc = _fail_worker(str(e))
    except Terminated:
        trainer.ckpt.wait()
        logging.getLogger("cohort.trainer").info("stopped by SIGTERM", extra={"step": trainer.state.step})
        rc = 143
    # The loader's worker processes end now, while the trainer still answers them. Left to notice that it
    # is gone, a worker receiving a step's indices then can print a traceback, and every run's log ended in
    # "resource_tracker: There appear to be 11 leaked semaphore objects to clean up at shutdown" (the queues'
    # semaphores are released when collected; os._exit collects nothing). The collection here, in this
    # thread, frees whatever else sits in reference cycles before exit_process stops the collector.
    trainer.loader.close()
    gc.collect()
    # The checkpoint is committed and the summary written: exit without interpreter
    # finalisation (exit_process says why).
    from .runtime.exit import exit_process

    exit_process(rc)


def cmd_run(args: argparse.Namespace) -> int:
    if not args.local:
        return _fail(f"cohort run needs --local (to run on Kubernetes: cohort submit {args.manifest}, "
                     f"or kubectl apply -f {args.manifest})")
    try:
        cfg = load_manifest(args.manifest)
    except ValidationError as e:
        return _fail(e)
    from .launcher import run_local
    from .parallel.dims import check_world_size

    workers = args.workers or cfg.spec.replicas.target
    try:
        check_world_size(cfg.spec, workers)
    except ValidationError as e:
        return _fail(e)
    # SIGTERM (a job runner, `kill`) and Ctrl-C end the launcher through its `finally`, which stops the
    # workers and says so; Python's default would end it at once on SIGTERM and leave them running, orphaned.
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        summary = run_local(cfg, workers, checkpoint_dir=args.checkpoint_dir, run_dir=args.run_dir,
                            replace_failed=not args.no_replace, spares=args.spares)
    except RuntimeError as e:
        return _fail(e)
    except (_Stopped, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, _Stopped) else signal.SIGINT
        print(f"cohort: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    _print_summary(summary)
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


class _Stopped(Exception):
    """The launcher was sent ``signum`` (SIGTERM): raised in its main thread, as Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, _frame: Any) -> None:
    raise _Stopped(signum)


def _print_summary(s: dict[str, Any]) -> None:
    lines = [f"done: {s.get('step')} steps, {s.get('epoch')} epochs in {s.get('wallSeconds')}s"]
    if s.get("accuracy") is not None:
        lines.append(f"  test accuracy   {s['accuracy']:.4f}")
    if s.get("perplexity") is not None:
        lines.append(f"  perplexity      {s['perplexity']:.3f}")
    lines.append(f"  final loss      {s.get('loss')}")
    lines.append(f"  checkpoints     {s.get('checkpoints')} written to {s.get('checkpointDir')}")
    lines.append(f"  world versions  {s.get('worldVersions')}, restarts {s.get('restarts')}")
    print("\n".join(lines))


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        cfg = load_manifest(args.manifest)
    except ValidationError as e:
        return _fail(e)
    print(f"{args.manifest}: valid TrainingJob {cfg.name}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Rank every dp x tp x pp plan of a manifest's model for N devices (docs/parallelism.md#planner)."""
    from .planner import format_table, load_hardware, rank_plans
    from .planner.hardware import parse_bandwidth, parse_bytes, parse_flops, parse_seconds
    from .profiling import profile_spec

    try:
        cfg = load_manifest(args.manifest)
        hw = load_hardware(args.calibration)
        if args.bandwidth or args.latency:  # another network: this host's measured lines no longer apply
            hw = hw.with_overrides(lines=(), sync_lines=(),
                                   beta_s_per_byte=1 / parse_bandwidth(args.bandwidth) if args.bandwidth else None,
                                   alpha_s=parse_seconds(args.latency) if args.latency else None)
        if args.device_flops:  # separate devices: nothing shares their compute
            hw = hw.with_overrides(device_flops=parse_flops(args.device_flops), host_flops=0.0, block_table=())
        if args.memory_bandwidth:
            hw = hw.with_overrides(memory_bandwidth=parse_bandwidth(args.memory_bandwidth))
        if args.gpu_memory:
            hw = hw.with_overrides(memory_bytes=parse_bytes(args.gpu_memory))
        profile = profile_spec(cfg.spec)
    except (ValidationError, ValueError, FileNotFoundError, KeyError) as e:  # WorkloadError is a ValueError
        return _fail(e)
    w, par = cfg.spec.workload, cfg.spec.parallelism
    global_batch = args.global_batch or w.batch_size * args.gpus
    candidates = rank_plans(args.gpus, profile, hw, global_batch, w.optimizer.name, w.optimizer.momentum,
                            tp=par.tensor if par.tensor > 1 else None, pp=par.pipeline if par.pipeline > 1 else None,
                            ac=w.activation_checkpointing)
    print(f"model      {profile.name}: {profile.params / 1e6:.2f} M parameters, "
          f"{profile.forward_flops / 1e9:.3f} GFLOP forward per sample")
    print(f"batch      {global_batch} samples per step (global), optimizer {w.optimizer.name}")
    print(f"hardware   {hw.source}: α {hw.alpha_s * 1e6:.1f} µs, β {hw.beta_s_per_byte * 1e9:.3f} ns/B "
          f"({1 / hw.beta_s_per_byte / 1e9:.2f} GB/s, {hw.allreduce} allreduce), "
          f"{hw.device_flops / 1e12:.3f} TFLOP/s per device"
          + (f", {hw.host_flops / 1e12:.3f} TFLOP/s shared per host" if hw.host_flops else "")
          + (f", {hw.memory_bytes / 2 ** 30:.1f} GiB per device" if hw.memory_bytes else ""))
    if w.precision == "bf16":  # the planner's count runs no model: a bf16 job's devices keep less than it says
        print("memory     counted in fp32; this job runs bf16, which keeps less: strategy auto measures it on the "
              "device and may choose less checkpointing (docs/parallelism.md#activation-checkpointing)")
    print()
    print(format_table(candidates, limit=args.top))
    chosen = next((c for c in candidates if not c.rejected), None)
    if chosen is None:
        print(f"\nno plan fits {args.gpus} devices")
        return 1
    print(f"\nstrategy: auto would run {chosen.dims.describe()} "
          f"(predicted {chosen.time.total * 1e3:.1f} ms per step)")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from . import calibrate

    path = calibrate.run(args.out, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    from .planner.hardware import load_hardware

    hw = load_hardware(path)
    print(f"wrote {path}: α {hw.alpha_s * 1e6:.1f} µs, β {hw.beta_s_per_byte * 1e9:.3f} ns/B ({hw.allreduce}), "
          f"{hw.device_flops / 1e9:.1f} GFLOP/s per rank" +
          (f", {hw.host_flops / 1e9:.1f} GFLOP/s per host (shared)" if hw.host_flops else ""))
    return 0


def _config_arg() -> dict[str, Any]:
    """--config, which defaults to $COHORT_CONFIG (the operator sets it: docs/contracts.md §2)."""
    env = os.environ.get("COHORT_CONFIG")
    return {"default": env, "required": not env, "help": "job config JSON (docs/contracts.md); default $COHORT_CONFIG"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cohort", description="Cohort elastic training")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run one worker (what a pod runs; same as cohort-train)")
    t.add_argument("--config", **_config_arg())
    t.set_defaults(fn=cmd_train)
    r = sub.add_parser("run", help="run a TrainingJob manifest")
    r.add_argument("manifest")
    r.add_argument("--local", action="store_true", help="run on this machine without Kubernetes")
    r.add_argument("--workers", type=int, default=0, help="worker processes (default: replicas.target)")
    r.add_argument("--checkpoint-dir", help="local directory for checkpoints (default: in the run dir)")
    r.add_argument("--run-dir", help="directory for the config, world file and worker logs")
    r.add_argument("--no-replace", action="store_true", help="do not start replacements for failed workers")
    r.add_argument("--spares", type=int, default=None,
                   help="ready workers held outside the world, promoted when one fails (default: replicas.spares)")
    r.add_argument("--summary-json", help="also write the final summary here")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("validate", help="check a manifest (defaults and bounds as the API server applies them)")
    v.add_argument("manifest")
    v.set_defaults(fn=cmd_validate)
    pl = sub.add_parser("plan", help="rank the dp x tp x pp plans of a manifest's model for N devices")
    pl.add_argument("manifest")
    pl.add_argument("--gpus", type=int, required=True, help="devices (ranks) to plan for")
    pl.add_argument("--gpu-memory", help="memory per device, e.g. 80GiB (default: unlimited)")
    pl.add_argument("--bandwidth", help="link bandwidth, e.g. 100Gbit (default: the calibration's)")
    pl.add_argument("--latency", help="per-message latency α, e.g. 10us (default: the calibration's)")
    pl.add_argument("--device-flops", help="throughput per device, e.g. 300TFLOPs (default: the calibration's)")
    pl.add_argument("--memory-bandwidth", help="device memory bandwidth, e.g. 3TB (default: the calibration's)")
    pl.add_argument("--calibration", help="file from `cohort calibrate` (default: ~/.cache/cohort/calibration.json)")
    pl.add_argument("--global-batch", type=int, default=0, help="samples per step (default: batchSize x gpus)")
    pl.add_argument("--top", type=int, default=None, help="show only the first N rows")
    pl.set_defaults(fn=cmd_plan)
    c = sub.add_parser("calibrate", help="measure α, β and device throughput here, for the planner")
    c.add_argument("--out", help="where to write (default: ~/.cache/cohort/calibration.json)")
    c.set_defaults(fn=cmd_calibrate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


def train_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cohort-train", description="run one Cohort worker")
    p.add_argument("--config", **_config_arg())
    return cmd_train(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
