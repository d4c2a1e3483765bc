"""``cohort run JOB.yaml --local --workers N``: the same manifest, no Kubernetes.

The launcher plays the operator's part on one machine: it renders the job
config, starts N worker processes (each on its own loopback IP, as pods have
their own IPs), and is the membership authority: it writes the world file the
workers follow (docs/contracts.md §3). When a worker dies it publishes a new
world without it at once (the survivors recover in place), with a ready spare
in its place if it holds one (``replicas.spares``, as the operator does), and,
unless told not to, starts a replacement that joins (or waits as a spare) when
ready. It shows live progress and ends with a summary, which lists when each
world was published (``worlds``: wall-clock times, for benchmarks).

It takes the members' reports as the operator does (docs/contracts.md §3): a
member whose collective failed writes ``reports/<pod>.json`` in the run
directory. A member that died is seen by its process ending; when every
member's process is alive, the report was a false alarm (a collective timeout
too short for a slow step, a process paused for a while), its reporters have
left that world and wait for the next, so the same members re-form under a
new version (at most once per ``REFORM_INTERVAL_S``), instead of waiting until
their wait runs out and exiting. A report that names members absent from a
world's rendezvous (its peers waited out the rendezvous timeout) while their
processes live names hung processes: they are killed and replaced; so, sooner,
is a member still in an older world (a step, or forming its group) past its
own deadline after a re-form (its /progress says so; cohort.api.progress).

On a machine with a GPU the workers share it: the launcher sets no
``LOCAL_RANK``, so each worker takes ``cuda:0`` (runtime/device.py), and NCCL
refuses two ranks of one communicator on one GPU unless told otherwise. The
launcher tells it (``nccl_sharing_env``): ``NCCL_MULTI_RANK_GPU_ENABLE=1`` from
NCCL 2.30 on, else a distinct ``NCCL_HOSTID`` per worker (NCCL then takes the
ranks for separate hosts and connects them over loopback sockets). Ranks that
share a GPU time-slice it: their throughput is a lower bound, not a benchmark.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from cohort.api.jobconfig import REFORM_INTERVAL_S, JobConfig
from cohort.api.progress import in_old_worlds

# A report is taken once it is this old, so that a member whose death made it is reaped first: a process
# killed a moment ago may still be exiting when its peers' collectives have already failed on its sockets.
REPORT_SETTLE_S = 0.2


@dataclass
class Worker:
    name: str
    ip: str
    proc: subprocess.Popen
    log_path: Path
    term_path: Path
    ready: bool = False
    exit_code: int | None = None


@dataclass
class LocalRun:
    cfg: JobConfig
    workers: int
    run_dir: Path
    checkpoint_dir: Path
    replace_failed: bool = True
    max_restarts: int | None = None
    spares: int | None = None
    """Ready workers held outside the world, promoted when a member fails (default: replicas.spares)."""
    out: TextIO = sys.stderr
    extra_env: dict[str, str] = field(default_factory=dict)
    progress_interval_s: float = 1.0

    def __post_init__(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.run_dir / "job.json"
        self.config_path.write_text(json.dumps(self.cfg.to_document(), indent=1))
        self.world_path = self.run_dir / "world.json"
        self.reports_dir = self.run_dir / "reports"
        # A run directory used before holds that run's world, reports and results: new workers would follow
        # the old world (addresses nobody listens on) and its results would be read as this run's. Its
        # checkpoints stay: resuming from them is what a second run in the same place is for.
        for stale in [self.world_path, self.world_path.with_suffix(".tmp"), *self.run_dir.glob("*.termination"),
                      *self.reports_dir.glob("*.json")]:
            stale.unlink(missing_ok=True)
        self.reports_dir.mkdir(exist_ok=True)
        self.ip_prefix = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
        self.pool: list[Worker] = []
        self.members: list[Worker] = []
        self.version = 0
        self.next_index = 0
        self.restarts = 0
        self.recoveries: list[dict[str, Any]] = []
        self.published: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        if self.spares is None:
            self.spares = self.cfg.spec.replicas.spares
        self.gpus, self.nccl_version = local_cuda({**os.environ, **self.extra_env})
        self.sharing_told = False
        self.reformed_at = float("-inf")  # monotonic time of the last re-form after a false alarm
        self.reports_seen: tuple[int, float] | None = None  # (the directory's mtime, when first seen)
        self.reports_read = 0  # the directory's mtime when its reports were last read
        self.answered_version = 0  # the newest world whose reports were answered (or refused)
        self.old_world_watch: tuple[int, float, float] | None = None  # (re-formed world, next look, until)

    # --- processes -----------------------------------------------------------------
    def _spawn(self) -> Worker:
        i = self.next_index
        self.next_index += 1
        name, ip = f"{self.cfg.name}-worker-{i}", f"{self.ip_prefix}.{10 + i}"
        log_path, term_path = self.run_dir / f"{name}.log", self.run_dir / f"{name}.termination"
        env = {**os.environ, "COHORT_WORLD": f"file:{self.world_path}", "COHORT_REPORTS": f"file:{self.reports_dir}",
               "COHORT_POD_NAME": name,
               "COHORT_POD_IP": ip, "COHORT_JOB_NAME": self.cfg.name, "COHORT_NAMESPACE": self.cfg.namespace,
               "COHORT_CONFIG": str(self.config_path), "COHORT_TERMINATION_LOG": str(term_path),
               "COHORT_PATH_MAP": json.dumps({self.cfg.spec.checkpoint.path: str(self.checkpoint_dir)}),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **self.extra_env}
        # Every worker takes cuda:0 (no LOCAL_RANK), so on a GPU machine they all share one GPU.
        sharing = nccl_sharing_env(self.workers + (self.spares or 0), min(self.gpus, 1), self.nccl_version,
                                   name, env)
        env.update(sharing)
        if sharing and not self.sharing_told:
            self.sharing_told = True
            told = " ".join(f"{k}={v}" for k, v in sharing.items() if k != "NCCL_HOSTID")
            told += " NCCL_HOSTID=<worker name>" if "NCCL_HOSTID" in sharing else ""
            self._say(f"the workers share one GPU (NCCL {'.'.join(map(str, self.nccl_version or ()))}):{told}")
        log_file = open(log_path, "w")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen([sys.executable, "-m", "cohort.trainer.cli", "train", "--config",
                                 str(self.config_path)], env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log_file.close()
        w = Worker(name, ip, proc, log_path, term_path)
        self.pool.append(w)
        return w

    def _is_ready(self, w: Worker) -> bool:
        if w.ready:
            return True
        try:
            with urllib.request.urlopen(f"http://{w.ip}:{self.cfg.metrics_port}/healthz", timeout=0.5):
                w.ready = True
        except OSError:
            pass
        return w.ready

    def _waiting(self) -> list[Worker]:
        """Started, alive and not members: spares once ready."""
        return [w for w in self.pool if w not in self.members and w.exit_code is None and w.proc.poll() is None]

    def _publish(self, reason: str) -> None:
        self.version += 1
        spares = [w for w in self._waiting() if w.ready]
        doc = {"version": self.version,
               "members": [{"rank": r, "pod": w.name, "ip": w.ip} for r, w in enumerate(self.members)],
               "master": {"addr": self.members[0].ip if self.members else "", "port": self.cfg.rendezvous_port},
               "spares": [{"pod": w.name, "ip": w.ip} for w in spares], "reason": reason}
        tmp = self.world_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.world_path)
        self.published.append({"version": self.version, "size": len(self.members), "t": time.time(),
                               "reason": reason})

    def _progress(self) -> dict[str, Any] | None:
        return self._progress_of(self.members[0]) if self.members else None

    def _progress_of(self, w: Worker) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://{w.ip}:{self.cfg.metrics_port}/progress", timeout=0.5) as r:
                doc = json.load(r)
        except (OSError, ValueError, http.client.HTTPException):  # a worker dying mid-answer: IncompleteRead
            return None
        return doc if isinstance(doc, dict) else None

    def terminate(self) -> None:
        """Stop every worker still running as the kubelet stops a deleted pod's: SIGTERM to the trainer alone
        (it finishes its step, ends its loader's processes and leaves), SIGKILL to its whole process group
        10 s later. (SIGTERM to the group killed the loader's processes under the trainer, leaving their
        multiprocessing directories behind.)"""
        alive = [w for w in self.pool if w.proc.poll() is None]
        if not alive:
            return
        self._say(f"stopping {len(alive)} worker{'s' if len(alive) > 1 else ''}: SIGTERM, SIGKILL 10 s on")
        for w in alive:
            os.kill(w.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        killed = 0
        for w in alive:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
                killed += 1
        self._say(f"workers stopped{f' ({killed} killed)' if killed else ''}; logs: {self.run_dir}")

    # --- the authority loop --------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        max_restarts = self.cfg.spec.fault_tolerance.max_restarts if self.max_restarts is None else self.max_restarts
        self._say(f"starting {self.workers} workers for {self.cfg.name} (logs: {self.run_dir})")
        for _ in range(self.workers + (self.spares or 0)):
            self._spawn()
        last_print = 0.0
        try:
            while True:
                self._admit_ready()
                failed = self._reap()
                if failed:
                    self.members = [w for w in self.members if w not in failed]
                    names = ", ".join(w.name for w in failed)
                    self.recoveries.append({"t": time.monotonic() - self.t0, "failed": names})
                    promoted = [w for w in self._waiting() if self._is_ready(w)][:len(failed)]
                    self.members += promoted
                    if self.members:
                        self._publish(f"worker {names} failed" + (
                            f"; spare {', '.join(w.name for w in promoted)} promoted" if promoted else ""))
                        self._say(f"worker {names} failed; world v{self.version} has {len(self.members)} ranks"
                                  + (f" ({len(promoted)} spare promoted)" if promoted else ""))
                    for w in failed:
                        self._say("  last log lines:\n" + _tail(w.log_path, 5))
                    if self.replace_failed:
                        for _ in failed:
                            if self.restarts >= max_restarts:
                                raise RuntimeError(f"more than maxRestarts={max_restarts} worker failures")
                            self.restarts += 1
                            self._spawn()
                self._answer_reports()
                self._watch_old_world()
                if any(w.exit_code == 0 for w in self.members):  # training completed (rank 0 or all)
                    self._await_members_exit(timeout_s=30)
                    return self._summary()
                if not self.members and not any(w.proc.poll() is None for w in self.pool):
                    raise RuntimeError("every worker exited without finishing; see the logs in " + str(self.run_dir))
                now = time.monotonic()
                if now - last_print >= self.progress_interval_s:
                    self._show_progress()
                    last_print = now
                time.sleep(0.05)
        finally:
            self.terminate()

    def _await_members_exit(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for w in self.members:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def _admit_ready(self) -> None:
        waiting = self._waiting()
        ready = [w for w in waiting if self._is_ready(w)]
        if not ready or len(self.members) >= self.workers:
            return  # the ready ones wait as spares
        if self.version == 0 and len(ready) < len(waiting) and time.monotonic() - self.t0 < 120:
            return  # at start, admit everyone together so the first world is the full world
        admitted = ready[:self.workers - len(self.members)]
        self.members += admitted
        self._publish("admitted " + ", ".join(w.name for w in admitted))

    def _answer_reports(self) -> None:
        """Answer the members' reports for the current world (module docstring): members that never arrived
        at its rendezvous while their processes live are hung, and are killed (then _reap replaces them); a
        failed collective while every member's process is alive re-forms the same members. A dead member is
        _reap's: its world goes at once."""
        if self.answered_version >= self.version or not self.members:
            return
        try:
            mtime = os.stat(self.reports_dir).st_mtime_ns  # a report is renamed in: the directory changes
        except OSError:
            return
        now = time.monotonic()
        if self.reports_seen is None or self.reports_seen[0] != mtime:
            self.reports_seen = (mtime, now)
        # Nothing new since the last read: a report about this world changes the directory (old reports stay).
        if now - self.reports_seen[1] < REPORT_SETTLE_S or mtime == self.reports_read:
            return
        self.reports_read = mtime
        reports = self._reports_for(self.version)
        if not reports or any(w.proc.poll() is not None for w in self.members):
            return
        self.answered_version = self.version
        error = str(reports[0].get("error", ""))[:120]
        absent = {pod for r in reports for pod in r.get("absent") or ()} - {r["pod"] for r in reports}
        hung = [w for w in self.members if w.name in absent]  # a member that reported reached the rendezvous
        if hung:
            for w in hung:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(w.proc.pid, signal.SIGKILL)
            self._say(f"{', '.join(w.name for w in hung)} never arrived at world v{self.version}'s rendezvous "
                      f"while {len(self.members) - len(hung)} peers waited ({error}), and lived: hung; killed, "
                      "to be replaced")
            return
        why = f"{reports[0]['pod']} reported a failed collective ({error})"
        if now - self.reformed_at < REFORM_INTERVAL_S:
            self._say(f"{why}; every member is alive, but the last re-form was {now - self.reformed_at:.0f}s ago: "
                      f"none again within {REFORM_INTERVAL_S:.0f}s (the members wait, then exit)")
            return
        self.reformed_at = now
        self._publish(f"the same members re-form: {why} and every member is alive")
        pg_timeout = self.cfg.spec.fault_tolerance.process_group_timeout_seconds
        self.old_world_watch = (self.version, now + 1.0, now + 2 * pg_timeout + 10)
        self._say(f"{why}; every member is alive: world v{self.version} re-forms the same "
                  f"{len(self.members)} ranks in place")

    def _watch_old_world(self) -> None:
        """After a re-form, once a second: a member whose trainer is still in an older world (a step of it, or
        forming its group) past its own deadline is hung (cohort.api.progress), and is killed (then _reap
        replaces it) without waiting for the new world's rendezvous to time out. Until no member is in an older
        world, or twice the timeout."""
        if self.old_world_watch is None:
            return
        version, next_look, until = self.old_world_watch
        now = time.monotonic()
        if version != self.version or now > until:
            self.old_world_watch = None  # another change took over, or the rendezvous timeout's path did
            return
        if now < next_look:
            return
        self.old_world_watch = (version, now + 1.0, until)
        old = in_old_worlds({w.name: self._progress_of(w) for w in self.members}, version)
        if not old:
            self.old_world_watch = None  # every member that answers has left the older worlds
            return
        hung = [w for w in self.members if old.get(w.name)]
        for w in hung:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGKILL)
            self._say(f"{w.name} is hung: {old[w.name]}; killed, to be replaced")
        if hung:
            self.old_world_watch = None

    def _reports_for(self, version: int) -> list[dict[str, Any]]:
        """The members' reports about world ``version`` (runtime/world.py writes them), oldest first."""
        names = {w.name for w in self.members}
        found = []
        for path in self.reports_dir.glob("*.json"):
            try:
                report = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(report, dict) and report.get("version") == version and report.get("pod") in names:
                found.append(report)
        return sorted(found, key=lambda r: r.get("at") or 0.0)

    def _reap(self) -> list[Worker]:
        failed = []
        for w in self.pool:
            if w.exit_code is None and w.proc.poll() is not None:
                w.exit_code = w.proc.returncode
                if w.exit_code != 0 and w in self.members:
                    failed.append(w)
                elif w.exit_code != 0:
                    self._say(f"{w.name} exited with {w.exit_code} before joining:\n" + _tail(w.log_path, 8))
        return failed

    def _show_progress(self) -> None:
        p = self._progress()
        if not p or p.get("state") not in ("training", "done"):
            return
        step, total = p.get("step", 0), p.get("stepsTotal")
        sps, loss = p.get("samplesPerSecond") or 0.0, p.get("loss")
        eta = f" eta {p['etaSeconds']}s" if p.get("etaSeconds") is not None else ""  # the trainer's estimate
        acc = f" acc {p['accuracy']:.3f}" if p.get("accuracy") is not None else ""
        size = p.get("worldSize")  # "-": not known yet (before the first step)
        self._say(f"step {step}/{total or '?'} epoch {p.get('epoch', 0)} loss {'-' if loss is None else round(loss, 4)}"
                  f"{acc} {sps:.0f} samples/s world v{p.get('worldVersion')}x{size or '-'}{eta}")

    def _summary(self) -> dict[str, Any]:
        rank0 = self.members[0]
        try:
            summary = json.loads(rank0.term_path.read_text())
        except (OSError, ValueError):
            summary = {}
        summary.update({"wallSeconds": round(time.monotonic() - self.t0, 2), "restarts": self.restarts,
                        "worldVersions": self.version, "worlds": self.published,
                        "checkpointDir": str(self.checkpoint_dir),
                        "runDir": str(self.run_dir)})
        return summary

    def _say(self, text: str) -> None:
        print(f"[cohort {time.monotonic() - self.t0:6.1f}s] {text}", file=self.out, flush=True)


def nccl_sharing_env(workers: int, gpus: int, nccl_version: tuple[int, ...] | None, worker: str,
                     env: Mapping[str, str]) -> dict[str, str]:
    """What NCCL needs in ``worker``'s environment when ``workers`` local workers share ``gpus`` GPUs.

    Nothing when each worker has a GPU of its own, when there is no GPU or no NCCL, when the
    workers will not use NCCL (``COHORT_DEVICE`` other than cuda, a ``COHORT_PG_BACKEND`` without
    nccl), or when the user already chose (either variable set). Otherwise, from NCCL 2.30 on, its
    opt-in for several ranks on one GPU; below, a host id of the worker's own, so that NCCL takes
    the ranks for separate hosts instead of refusing a "duplicate GPU" (NVIDIA/nccl src/init.cc),
    and loopback for the sockets those "hosts" then talk over, unless an interface was chosen.
    """
    if gpus < 1 or workers <= gpus or not nccl_version:
        return {}
    if (env.get("COHORT_DEVICE") or "cuda") != "cuda":
        return {}
    backend = env.get("COHORT_PG_BACKEND", "")
    if backend and "nccl" not in backend:
        return {}
    if "NCCL_MULTI_RANK_GPU_ENABLE" in env or "NCCL_HOSTID" in env:
        return {}
    if tuple(nccl_version[:2]) >= (2, 30):
        return {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    out = {"NCCL_HOSTID": worker}
    if "NCCL_SOCKET_IFNAME" not in env:
        out["NCCL_SOCKET_IFNAME"] = "lo"
    return out


def local_cuda(env: Mapping[str, str]) -> tuple[int, tuple[int, ...] | None]:
    """(GPUs the workers will see, NCCL's version) on this machine; (0, None) without a GPU.

    torch is imported only where an NVIDIA driver is present (most local runs are on CPU hosts,
    where the launcher would pay a second or two for nothing) and the workers may use CUDA.
    """
    if env.get("COHORT_DEVICE", "") not in ("", "cuda"):
        return 0, None
    if not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidiactl")
            or os.path.exists("/proc/driver/nvidia/version")):
        return 0, None
    try:
        import torch

        if not torch.cuda.is_available():
            return 0, None
        gpus = torch.cuda.device_count()
        raw: Any = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    except Exception:  # a broken driver or torch: the workers will say so themselves
        return 0, None
    return gpus, nccl_version_tuple(raw)


def nccl_version_tuple(raw: Any) -> tuple[int, ...] | None:
    """``torch.cuda.nccl.version()`` as (major, minor, patch): a tuple in today's torch, an int in older
    ones (major*10000 + minor*100 + patch since NCCL 2.9, major*1000 + minor*100 + patch before)."""
    if not raw:
        return None
    if isinstance(raw, int):
        if raw >= 10000:
            return raw // 10000, raw // 100 % 100, raw % 100
        return raw // 1000, raw // 100 % 10, raw % 100
    return tuple(int(v) for v in raw)


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join("    " + line for line in path.read_text().splitlines()[-n:])
    except OSError:
        return "    (no log)"


def run_local(cfg: JobConfig, workers: int, checkpoint_dir: str | None = None, run_dir: str | None = None,
              **kwargs: Any) -> dict[str, Any]:
    rd = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix=f"cohort-{cfg.name}-"))
    ck = Path(checkpoint_dir) if checkpoint_dir else rd / "checkpoints"
    return LocalRun(cfg, workers, rd, ck, **kwargs).run()
