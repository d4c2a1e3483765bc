"""The ``cohort`` command: cluster commands on :class:`~cohort.client.Client`, and the trainer's beside them.

    cohort submit job.yaml [--watch]   cohort list        cohort status NAME
    cohort logs NAME [--rank N] [-f]   cohort scale NAME N
    cohort delete NAME                 cohort events NAME
    cohort run job.yaml --local | plan | calibrate | validate | train   (cohort.trainer.cli)

There is one ``cohort`` command. The trainer's subcommands are handed, argv
untouched, to ``cohort.trainer.cli.main`` where the trainer is installed;
where it is not they exit 2 saying how to install it. Exit codes: 0 done,
1 the API server refused or the job failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from .errors import CohortError
from .job import TrainingJob
from .progress import format_duration, format_goodput, format_progress

if TYPE_CHECKING:
    from .client import Client

# name -> help; argv from the name on goes to cohort.trainer.cli.main unchanged.
TRAINER_COMMANDS = {
    "run": "run a TrainingJob manifest on this machine (--local), no Kubernetes",
    "validate": "check a manifest (defaults and bounds as the API server applies them)",
    "plan": "rank the dp x tp x pp plans of a manifest's model for N devices",
    "calibrate": "measure α, β and device throughput here, for the planner",
    "train": "run one worker (what a pod runs; same as cohort-train)",
}
INSTALL_TRAINER = ("`cohort {cmd}` needs the trainer (cohort-trainer, with torch), which is not installed here: "
                   "pip install cohort-trainer (from a checkout: pip install -e api -e client -e trainer, "
                   "or hack/venv.sh). The cluster commands (submit, list, status, logs, scale, delete) "
                   "need only cohort-client.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cohort", description="Cohort elastic training: TrainingJobs on a cluster, "
                                "and (with the trainer installed) on this machine")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    conn = argparse.ArgumentParser(add_help=False)
    conn.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    conn.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else default)")

    s = sub.add_parser("submit", parents=[conn], help="create a TrainingJob from a manifest")
    s.add_argument("manifest", help="TrainingJob YAML (the same file `cohort run --local` takes)")
    s.add_argument("-w", "--watch", action="store_true",
                   help="show live progress until the job ends; exit 0 if it Succeeds, 1 if it Fails")
    s.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="with --watch: give up after this")
    s.set_defaults(fn=cmd_submit)
    ls = sub.add_parser("list", parents=[conn], help="the namespace's TrainingJobs")
    ls.set_defaults(fn=cmd_list)
    st = sub.add_parser("status", parents=[conn], help="one job: phase, workers, progress, conditions, events")
    st.add_argument("name")
    st.set_defaults(fn=cmd_status)
    lg = sub.add_parser("logs", parents=[conn], help="the trainer log of one worker (--rank) or of all")
    lg.add_argument("name")
    lg.add_argument("--rank", type=int, default=None, help="the worker holding this rank in the current world")
    lg.add_argument("-f", "--follow", action="store_true", help="stream until the workers end")
    lg.add_argument("--tail", type=int, default=None, metavar="LINES", help="only the last LINES of each log")
    lg.set_defaults(fn=cmd_logs)
    sc = sub.add_parser("scale", parents=[conn], help="set the target worker count (within [min, max])")
    sc.add_argument("name")
    sc.add_argument("replicas", type=int)
    sc.set_defaults(fn=cmd_scale)
    d = sub.add_parser("delete", parents=[conn], help="delete a job (its pods go with it)")
    d.add_argument("name")
    d.set_defaults(fn=cmd_delete)
    ev = sub.add_parser("events", parents=[conn], help="the job's Events (and its pods', with --pods)")
    ev.add_argument("name")
    ev.add_argument("--pods", action="store_true", help="include the worker pods' Events")
    ev.set_defaults(fn=cmd_events)
    for name, text in TRAINER_COMMANDS.items():  # listed in --help; parsed by the trainer's own parser
        sub.add_parser(name, help=text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in TRAINER_COMMANDS:
        return run_trainer_command(argv)
    args = build_parser().parse_args(argv)
    fn: Callable[[argparse.Namespace], int] = args.fn
    try:
        return fn(args)
    except CohortError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run_trainer_command(argv: list[str]) -> int:
    try:
        trainer_cli = importlib.import_module("cohort.trainer.cli")
    except ModuleNotFoundError as e:
        if e.name and (e.name.split(".")[0] == "torch" or e.name in ("cohort.trainer", "cohort.trainer.cli")):
            print(f"error: {INSTALL_TRAINER.format(cmd=argv[0])}", file=sys.stderr)
            return 2
        raise
    return int(trainer_cli.main(argv))


def _client(args: argparse.Namespace) -> Client:
    try:
        from .client import Client
    except ModuleNotFoundError as e:  # the trainer image installs the client without its dependencies
        raise CohortError(f"the cluster commands need the {e.name} package: pip install cohort-client") from None
    return Client(kubeconfig=args.kubeconfig, namespace=args.namespace)


# --- commands -------------------------------------------------------------------------

def cmd_submit(args: argparse.Namespace) -> int:
    c = _client(args)
    job = c.submit(args.manifest)
    print(f"trainingjob.cohort.dev/{job.name} created (namespace {job.namespace})")
    if not args.watch:
        return 0
    if job.namespace != c.namespace:
        c.namespace = job.namespace
    return watch_job(c, job.name, timeout_s=args.timeout)


def watch_job(c: Client, name: str, *, timeout_s: float | None = None, out: TextIO | None = None,
              interval_s: float = 1.0) -> int:
    """Print a progress line per change until the job ends: 0 if it Succeeded, 1 if it Failed or timed out."""
    out = out or sys.stdout
    live = out.isatty()
    last, job = "", None
    for job in c.watch(name, interval_s=interval_s, timeout_s=timeout_s):
        line = format_progress(job)
        if line != last:
            out.write(f"\r\033[K{line}" if live else f"{line}\n")
            out.flush()
            last = line
    if live:
        out.write("\n")
    if job is None or not job.finished:
        print(f"error: TrainingJob {name} still {job.phase if job else 'unknown'} after {timeout_s:g}s",
              file=sys.stderr)
        return 1
    if job.phase == "Failed":
        print(f"error: TrainingJob {name} failed: {job.failure_reason()}", file=sys.stderr)
        return 1
    print(f"TrainingJob {name} succeeded: {summary(job)}", file=out)
    return 0


def summary(job: TrainingJob) -> str:
    p = job.progress
    parts = [f"{p.step} steps"]
    if p.loss is not None:
        parts.append(f"loss {p.loss:.4g}")
    if p.accuracy is not None:
        parts.append(f"accuracy {p.accuracy:.4f}")
    if p.perplexity is not None:
        parts.append(f"perplexity {p.perplexity:.4g}")
    parts.append(f"recoveries {job.recoveries}")
    return ", ".join(parts)


def cmd_list(args: argparse.Namespace) -> int:
    jobs = _client(args).list()
    if not jobs:
        print(f"no TrainingJobs in namespace {args.namespace or 'default'}", file=sys.stderr)
        return 0
    print(format_table(jobs))
    return 0


def format_table(jobs: list[TrainingJob], now: datetime.datetime | None = None) -> str:
    """``kubectl get tj``'s columns."""
    rows = [("NAME", "PHASE", "READY", "STEP", "PROGRESS", "ETA", "LOSS", "AGE")]
    for j in jobs:
        p = j.progress
        rows.append((j.name, j.phase, j.status.replicas.summary or f"{j.status.replicas.ready}/"
                     f"{j.status.replicas.desired}", str(p.step),
                     "-" if p.percent is None else f"{p.percent:.1f}%", format_duration(p.eta_seconds),
                     "-" if p.loss is None else f"{p.loss:.4g}", age(j.raw, now)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def age(obj: dict[str, Any], now: datetime.datetime | None = None) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "-"
    t = datetime.datetime.fromisoformat(str(created).replace("Z", "+00:00"))
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return format_duration((now - t).total_seconds())


def cmd_status(args: argparse.Namespace) -> int:
    c = _client(args)
    job = c.get(args.name)
    st = job.status
    print(format_progress(job))
    print(f"  replicas    target {job.spec.replicas.target} in [{job.spec.replicas.min}, {job.spec.replicas.max}], "
          f"ready {st.replicas.ready}, active {st.replicas.active}, spares {st.replicas.spares}")
    if st.world.members:
        print(f"  world       v{st.world.version}: {', '.join(st.world.members)}")
    if st.last_checkpoint.step:
        print(f"  checkpoint  step {st.last_checkpoint.step} at {st.last_checkpoint.location}")
    if (goodput := format_goodput(job)) is not None:
        print(f"  goodput     {goodput}")
    for cond in st.conditions:
        print(f"  {cond.type:<11} {cond.status:<7} {cond.reason}{': ' + cond.message if cond.message else ''}")
    for e in c.events(args.name, uid=job.raw.get("metadata", {}).get("uid"))[-10:]:  # the job read above
        print(f"  event       {e.time}  {e.type:<7} {e.reason}: {e.message}")
    if job.phase == "Failed":
        print(f"failed: {job.failure_reason()}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    for line in _client(args).logs(args.name, rank=args.rank, follow=args.follow, tail_lines=args.tail):
        print(line, flush=args.follow)
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    n = _client(args).scale(args.name, args.replicas)
    print(f"trainingjob.cohort.dev/{args.name} scaled to {n}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    _client(args).delete(args.name)
    print(f'trainingjob.cohort.dev "{args.name}" deleted')
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    for e in _client(args).events(args.name, pods=args.pods):
        print(f"{e.time}  {e.type:<7} {e.object:<32} {e.reason}: {e.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
