"""One container of a pod as a local process: start, probe, restart, stop.

The process runs in its own session (so its process group is its "container":
SIGTERM and SIGKILL go to the whole group), with stdout and stderr appended to
the container's log file. When it exits, the restart policy decides between a
final ``terminated`` state and a restart after a small, doubling backoff
(``CrashLoopBackOff`` meanwhile).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .kube import now_rfc3339
from .podspec import ConfigError
from .probes import Prober
from .status import ContainerState

if TYPE_CHECKING:
    from .pod import PodRuntime

log = logging.getLogger("processnode.container")
Obj = dict[str, Any]
BACKOFF_FIRST_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 0.5, 10.0, 60.0
MESSAGE_MAX_BYTES, FALLBACK_LINES = 4096, 80


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    map_path: Callable[[str], str]
    termination_file: Path


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Container(threading.Thread):
    def __init__(self, pod: PodRuntime, spec: Obj, state: ContainerState, init: bool = False):
        super().__init__(name=f"container-{pod.name}-{spec['name']}", daemon=True)
        self.pod, self.spec, self.state, self.init = pod, spec, state, init
        self.proc: subprocess.Popen | None = None
        self.exited = threading.Event()  # the current process (if any) has exited
        self.exited.set()
        self.finished = threading.Event()  # no more runs: the state is final
        self.stopping = False
        self.kill_at: Callable[[], float] = lambda: 0.0
        self.probers: list[Prober] = []
        self.runs = 0  # processes started (or tried); restartCount is runs - 1
        self._lock = threading.Lock()

    # --- the run loop -------------------------------------------------------------------------
    def run(self) -> None:
        backoff = BACKOFF_FIRST_S
        config_error = ""
        while not self.stopping:
            try:
                launch = self.pod.launch(self.spec)
            except ConfigError as e:
                self._set(state="waiting", reason="CreateContainerConfigError", message=str(e))
                if str(e) != config_error:  # one event per distinct problem, not one per retry
                    self.pod.event("Warning", "Failed", f"Error: {e}")
                config_error = str(e)
                self._sleep(2.0)
                continue
            t0 = time.monotonic()
            self._start_and_wait(launch)
            if self.stopping:
                break
            if not self._should_restart():
                break
            backoff = BACKOFF_FIRST_S if time.monotonic() - t0 > BACKOFF_RESET_S else backoff
            last = self.state.terminated()
            self._set(state="waiting", reason="CrashLoopBackOff", last=last, ready=False,
                      message=f"back-off {backoff:g}s restarting failed container={self.spec['name']} "
                              f"pod={self.pod.name}")
            self.pod.event("Warning", "BackOff", f"Back-off restarting container {self.spec['name']}")
            self._sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)
        if self.state.state != "terminated":  # stopped before its first run or during a backoff
            last = self.state.last
            if last:
                self._set(state="terminated", reason=last.get("reason", "Error"), exit_code=last.get("exitCode", 0),
                          signal=last.get("signal", 0), message=last.get("message", ""), ready=False,
                          started_at=last.get("startedAt", ""), finished_at=last.get("finishedAt", ""),
                          last={})
            else:
                now = now_rfc3339()
                self._set(state="terminated", reason="ContainerStatusUnknown", exit_code=137, ready=False,
                          message="The container was stopped before it started", started_at=now, finished_at=now)
        self.finished.set()
        self.pod.notify()

    def _should_restart(self) -> bool:
        policy = self.pod.pod["spec"].get("restartPolicy", "Always")
        failed = self.state.exit_code != 0
        if self.init:
            return failed and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and failed)

    def _start_and_wait(self, launch: Launch) -> None:
        launch.termination_file.parent.mkdir(parents=True, exist_ok=True)
        launch.termination_file.write_bytes(b"")
        log_path = self.pod.log_path(self.spec["name"])
        with open(log_path, "ab") as logf:
            offset = logf.tell()
            self.runs += 1
            self.state.restart_count = self.runs - 1
            try:
                with self._lock:
                    if self.stopping:
                        return
                    self.proc = subprocess.Popen(launch.argv, env=launch.env, cwd=launch.cwd, stdin=subprocess.DEVNULL,
                                                 stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
                    self.exited.clear()
            except (OSError, ValueError, IndexError) as e:
                what = launch.argv[0] if launch.argv else "(no command)"
                msg = f'failed to start container process: exec: "{what}": {e.strerror if isinstance(e, OSError) else e}'
                logf.write(f"processnode: {msg}\n".encode())
                now = now_rfc3339()
                self._set(state="terminated", reason="ContainerCannotRun", exit_code=128, signal=0, message=msg,
                          started_at=now, finished_at=now, container_id="")
                self.pod.event("Warning", "Failed", f"Error: {msg}")
                return
        pid = self.proc.pid
        self.pod.record_pid(self.spec["name"], pid)
        self._set(state="running", reason="", message="", started_at=now_rfc3339(), ready=False,
                  started="startupProbe" not in self.spec, container_id=f"processnode://{pid}", exit_code=0, signal=0)
        self.pod.event("Normal", "Started", f"Started container {self.spec['name']} (pid {pid})")
        self._start_probes(launch)
        rc = self.proc.wait()
        kill_group(pid, signal.SIGKILL)  # the rest of the "container" goes with its main process
        with self._lock:
            self.exited.set()  # from here on no prober starts for this run
            probers, self.probers = self.probers, []
        for p in probers:
            p.stop()
        sig = -rc if rc < 0 else 0
        code = 128 + sig if sig else rc
        self._set(state="terminated", reason="Completed" if code == 0 else "Error", exit_code=code, signal=sig,
                  finished_at=now_rfc3339(), ready=False,
                  message=self._termination_message(launch.termination_file, log_path, offset, code))
        self.pod.forget_pid(self.spec["name"])

    def _termination_message(self, path: Path, log_path: Path, offset: int, code: int) -> str:
        try:
            msg = path.read_bytes()[:MESSAGE_MAX_BYTES].decode(errors="replace")
        except OSError:
            msg = ""
        if not msg.strip() and code != 0 and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            try:
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    lines = f.read().decode(errors="replace").splitlines()[-FALLBACK_LINES:]
                msg = "\n".join(lines)[-2048:]
            except OSError:
                msg = ""
        return msg

    # --- probes -------------------------------------------------------------------------------
    def _start_probes(self, launch: Launch) -> None:
        ip = self.pod.ip
        startup, readiness, liveness = (self.spec.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe"))
        started = threading.Event()

        def begin_regular_probes() -> None:
            if readiness:
                self._add_prober("readiness", readiness, launch, ip, False, self._on_readiness)
            elif not self.exited.is_set():
                self._set(ready=True)
            if liveness:
                self._add_prober("liveness", liveness, launch, ip, True, self._on_liveness)

        if startup:
            def on_startup(ok: bool, message: str) -> None:
                if ok and not started.is_set():
                    started.set()
                    self._set(started=True)
                    begin_regular_probes()
                elif not ok:
                    self._fail_probe("startup", startup, message)
            self._add_prober("startup", startup, launch, ip, False, on_startup, stop_after_success=True)
        else:
            begin_regular_probes()

    def _add_prober(self, kind: str, probe: Obj, launch: Launch, ip: str, initial: bool,
                    on_change: Callable[[bool, str], None], stop_after_success: bool = False) -> None:
        p = Prober(kind, probe, self.spec, ip, launch.env, launch.cwd, launch.map_path, on_change, initial,
                   stop_after_success)
        with self._lock:
            if self.exited.is_set():  # the process is gone (a startup probe passed just as it exited)
                return
            self.probers.append(p)
        p.start()

    def _on_readiness(self, ok: bool, message: str) -> None:
        if self.state.state == "running":
            self._set(ready=ok)
        if not ok:
            self.pod.event("Warning", "Unhealthy", f"Readiness probe failed: {message}")

    def _on_liveness(self, ok: bool, message: str) -> None:
        if not ok:
            self._fail_probe("liveness", self.spec["livenessProbe"], message)

    def _fail_probe(self, kind: str, probe: Obj, message: str) -> None:
        self.pod.event("Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {message}")
        self.pod.event("Normal", "Killing", f"Container {self.spec['name']} failed {kind} probe, will be restarted")
        grace = probe.get("terminationGracePeriodSeconds", self.pod.pod["spec"].get("terminationGracePeriodSeconds", 30))
        deadline = time.monotonic() + float(grace)
        threading.Thread(target=self._signal_and_wait, args=(lambda: deadline,), daemon=True).start()

    # --- stopping -----------------------------------------------------------------------------
    def stop(self, kill_at: Callable[[], float]) -> None:
        """Stop for good: SIGTERM to the group now, SIGKILL at kill_at() (monotonic); returns at once."""
        with self._lock:
            self.stopping = True
            self.kill_at = kill_at
        threading.Thread(target=self._signal_and_wait, args=(kill_at,), daemon=True).start()
        self.pod.notify()

    def _signal_and_wait(self, kill_at: Callable[[], float]) -> None:
        proc = self.proc
        if proc is None or self.exited.is_set():
            return
        kill_group(proc.pid, signal.SIGTERM)
        while not self.exited.wait(0.1):
            if time.monotonic() >= kill_at():
                kill_group(proc.pid, signal.SIGKILL)
                self.exited.wait(5)
                return

    # --- helpers ------------------------------------------------------------------------------
    def _set(self, **changes: Any) -> None:
        for k, v in changes.items():
            setattr(self.state, k, v)
        self.pod.notify()

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))
