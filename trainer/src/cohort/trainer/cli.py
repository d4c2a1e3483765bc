"""Command lines: ``cohort-train`` (what runs in a pod) and ``cohort`` (run, validate).

Bad input exits 2 with one line that names the field or module at fault.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .config import ConfigError, load_config, load_manifest


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _user_errors() -> tuple[type[Exception], ...]:
    from .checkpoint import CheckpointError
    from .workloads.workload import WorkloadError

    return (ConfigError, WorkloadError, CheckpointError)


def cmd_train(args: argparse.Namespace) -> int:
    import faulthandler
    import signal

    from . import log

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack to the log
    log.configure()
    try:
        cfg = load_config(args.config)
        from .trainer import Trainer

        trainer = Trainer(cfg)
    except _user_errors() as e:
        return _fail(str(e))
    rc = 0
    try:
        trainer.run()
    except ConfigError as e:  # a plan this world cannot run (e.g. not a multiple of tensor x pipeline)
        rc = _fail(str(e))
    # The checkpoint is committed and the summary written. Exit without interpreter
    # finalisation: the rendezvous store's native server thread can block it.
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def cmd_run(args: argparse.Namespace) -> int:
    if not args.local:
        return _fail("cohort run needs --local (to run on Kubernetes: kubectl apply -f " + args.manifest + ")")
    try:
        cfg = load_manifest(args.manifest)
    except ConfigError as e:
        return _fail(str(e))
    from .launcher import run_local
    from .parallel.dims import check_world_size

    workers = args.workers or cfg.spec.replicas.target
    try:
        check_world_size(cfg.spec, workers)
    except ConfigError as e:
        return _fail(str(e))
    try:
        summary = run_local(cfg, workers, checkpoint_dir=args.checkpoint_dir, run_dir=args.run_dir,
                            replace_failed=not args.no_replace)
    except RuntimeError as e:
        return _fail(str(e))
    _print_summary(summary)
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


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
    except ConfigError as e:
        return _fail(str(e))
    print(f"{args.manifest}: valid TrainingJob {cfg.name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cohort", description="Cohort elastic training")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run one worker (what a pod runs; same as cohort-train)")
    t.add_argument("--config", required=True, help="job config JSON (docs/contracts.md)")
    t.set_defaults(fn=cmd_train)
    r = sub.add_parser("run", help="run a TrainingJob manifest")
    r.add_argument("manifest")
    r.add_argument("--local", action="store_true", help="run on this machine without Kubernetes")
    r.add_argument("--workers", type=int, default=0, help="worker processes (default: replicas.target)")
    r.add_argument("--checkpoint-dir", help="local directory for checkpoints (default: in the run dir)")
    r.add_argument("--run-dir", help="directory for the config, world file and worker logs")
    r.add_argument("--no-replace", action="store_true", help="do not start replacements for failed workers")
    r.add_argument("--summary-json", help="also write the final summary here")
    r.set_defaults(fn=cmd_run)
    v = sub.add_parser("validate", help="check a manifest (defaults and bounds as the API server applies them)")
    v.add_argument("manifest")
    v.set_defaults(fn=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


def train_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cohort-train", description="run one Cohort worker")
    p.add_argument("--config", required=True)
    return cmd_train(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
