"""One pod's life on a process node: sandbox, containers, status, deletion.

A ``PodRuntime`` thread owns everything about one pod uid: its loopback IP, its
sandbox directory (volumes, termination-message files, working dir), its
containers, and the pod status, which only this thread patches. Container
threads and watch events just record what happened and wake it up.

Deletion follows the kubelet: SIGTERM to every container's process group, wait
the pod's deletionGracePeriodSeconds, SIGKILL, report the final status, then
delete the pod with gracePeriodSeconds=0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import kube
from .container import Container, Launch, kill_group
from .ipam import process_id
from .podspec import ConfigError, PathMap, expand, resolve_env
from .status import ContainerState, pod_status
from .volumes import Volumes

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("processnode.pod")
Obj = dict[str, Any]
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
MIN_FORCED_GRACE_S = 2.0  # a pod deleted from under us (force delete) still gets a short SIGTERM window
SHUTDOWN_GRACE_S = 5.0  # when the daemon stops, it must finish within cluster.sh's 10 s


class PodRuntime(threading.Thread):
    def __init__(self, daemon: Daemon, pod: Obj):
        md = pod["metadata"]
        super().__init__(name=f"pod-{md['namespace']}/{md['name']}", daemon=True)
        self.d = daemon
        self.pod = pod
        self.uid, self.ns, self.name = md["uid"], md["namespace"], md["name"]
        self.key = f"{self.ns}/{self.name}"
        self.dir = daemon.pod_dir(pod["spec"]["nodeName"], self.uid)
        self.ip = ""
        self.start_time = ""
        self.volumes: Volumes | None = None
        self.init_states = [ContainerState(c["name"], c.get("image", "")) for c in pod["spec"].get("initContainers") or []]
        self.states = [ContainerState(c["name"], c.get("image", "")) for c in pod["spec"]["containers"]]
        self.containers: list[Container] = []
        self.initialized = not self.init_states
        self.init_failed = False
        self.reason = self.message = ""
        self.changed = threading.Event()
        self.gone = False  # deleted from the API without us
        self.deletion_requested = False  # sticky: a later, older view of the pod cannot undo it
        self.shutting_down = False  # the daemon is stopping
        self.force_failed = False  # phase Failed even if every container exited 0 (deadline, node shutdown)
        self._grace_deadline: float | None = None
        self._last_status: Obj | None = None
        if md.get("deletionTimestamp"):
            self.update(pod)

    # --- inputs from the daemon (watch threads) ----------------------------------------------
    def update(self, pod: Obj) -> None:
        self._adopt(pod)
        md = pod["metadata"]
        if md.get("deletionTimestamp"):
            self.deletion_requested = True
            grace = float(md.get("deletionGracePeriodSeconds") or 0)
            deadline = time.monotonic() + grace
            if self._grace_deadline is None or deadline < self._grace_deadline:
                self._grace_deadline = deadline  # a second delete may shorten the grace period
        self.notify()

    def _view(self, pod: Obj) -> Obj:
        """The API's view of the pod, with our addresses (the downward API reads them)."""
        status = dict(pod.get("status") or {})
        if self.ip:
            status.update(podIP=self.ip, podIPs=[{"ip": self.ip}], hostIP=self.d.host_ip,
                          hostIPs=[{"ip": self.d.host_ip}])
        return {**pod, "status": status}

    def _adopt(self, pod: Obj) -> None:
        self.pod = self._view(pod)
        if self.volumes is not None:
            self.volumes.pod = self.pod

    def vanish(self) -> None:
        self.gone = True
        deadline = time.monotonic() + MIN_FORCED_GRACE_S
        if self._grace_deadline is None or deadline < self._grace_deadline:
            self._grace_deadline = deadline
        self.notify()

    def shutdown(self) -> None:
        self.shutting_down = True
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        if self._grace_deadline is None or deadline < self._grace_deadline:
            self._grace_deadline = deadline
        self.notify()

    def source_changed(self, kind: str, name: str) -> None:
        v = self.volumes
        if v is not None:
            v.refresh(kind, name)

    def notify(self) -> None:
        self.changed.set()

    # --- services for containers ----------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str) -> None:
        self.d.api.event({"kind": "Pod", "apiVersion": "v1", "metadata": self.pod["metadata"]}, type_, reason,
                         message, self.pod["spec"].get("nodeName", ""))

    def log_path(self, container: str) -> Path:
        return self.d.pod_logs_dir / f"{self.ns}_{self.name}_{container}.log"

    def record_pid(self, container: str, pid: int) -> None:
        (self.dir / "pids").mkdir(parents=True, exist_ok=True)
        (self.dir / "pids" / container).write_text(process_id(pid))

    def forget_pid(self, container: str) -> None:
        with contextlib.suppress(OSError):
            (self.dir / "pids" / container).unlink()

    def launch(self, c: Obj) -> Launch:
        """Everything to start container c: argv, env, cwd, with mount paths mapped."""
        assert self.volumes is not None
        pod = self._view(self.pod)  # never without our IP, whatever view the watch last brought
        service_env = self.d.service_env()
        env = resolve_env(pod, c, self.d.lookup, service_env, self.d.allocatable)
        term_path = c.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH
        term_file = self.dir / "termination" / c["name"]
        mapping = self.volumes.path_map(c, env)
        mapping[term_path] = str(term_file)
        paths = PathMap(mapping)
        full_env = {**self.d.host_env, **service_env, "HOSTNAME": self.name}
        full_env.update({k: paths.rewrite(v) for k, v in env.items()})
        full_env["COHORT_PATH_MAP"] = json.dumps(mapping, sort_keys=True)
        exp_env = {**service_env, **env}
        argv = [paths.rewrite(expand(a, exp_env)) for a in (c.get("command") or []) + (c.get("args") or [])]
        cwd = paths.local(c["workingDir"]) if c.get("workingDir") else str(self.dir / "cwd")
        try:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"workingDir {cwd}: {e}") from e
        return Launch(argv, full_env, cwd, paths.rewrite, term_file)

    # --- the pod's life -------------------------------------------------------------------------
    def run(self) -> None:
        try:
            try:
                if self._sandbox() and self._init_containers():
                    self._run_containers()
            except Exception as e:  # a bug here must not leave the pod Running, or undeletable
                log.exception("%s: pod runtime failed", self.key)
                self.reason, self.message, self.force_failed = "ProcessNodeError", f"process node: {e}", True
                self._kill_everything(0)
            self._finish()
        except Exception:
            log.exception("%s: finishing the pod failed", self.key)
        finally:
            self.d.forget(self.uid)

    def _deleting(self) -> bool:
        return self.gone or self.shutting_down or self.deletion_requested

    def _wait(self, timeout_s: float = 30.0) -> None:
        self.changed.wait(timeout_s)
        self.changed.clear()

    def _sandbox(self) -> bool:
        """IP, directories, log files and volumes; False if the pod is deleted first."""
        self.ip = self.d.ipam.allocate(self.uid, self.key)
        self._adopt(self.pod)
        self.start_time = (self.pod.get("status") or {}).get("startTime") or kube.now_rfc3339()
        for sub in ("volumes", "termination", "cwd"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for c in (self.pod["spec"].get("initContainers") or []) + self.pod["spec"]["containers"]:
            path = self.log_path(c["name"])
            if path.exists():  # an earlier pod of the same name: keep its log one generation back
                os.replace(path, path.with_suffix(".log.previous"))
            path.touch()
        self.volumes = Volumes(self._view(self.pod), self.dir, self.d.cluster_dir, self.d.lookup, self.d.api,
                               self.d.allocatable)
        self.d.watch_sources(self, self.volumes.sources())
        while not self._deleting():
            try:
                self.volumes.setup()
                return True
            except (ConfigError, OSError) as e:
                for s in self.init_states + self.states:
                    s.reason, s.message = "ContainerCreating", f"MountVolume.SetUp failed: {e}"
                if self.message != str(e):
                    self.event("Warning", "FailedMount", f"MountVolume.SetUp failed: {e}")
                self.message = str(e)
                self._report()
                self._wait(2.0)
        return False

    def _init_containers(self) -> bool:
        specs = self.pod["spec"].get("initContainers") or []
        for spec, state in zip(specs, self.init_states, strict=False):
            c = Container(self, spec, state, init=True)
            self.containers.append(c)
            c.start()
            while not c.finished.is_set():
                self._report()
                if self._deleting():
                    return False
                self._wait()
            if state.exit_code != 0:
                self.init_failed = True
                self._report()
                return False
        self.initialized = True
        return True

    def _run_containers(self) -> None:
        for spec, state in zip(self.pod["spec"]["containers"], self.states, strict=False):
            c = Container(self, spec, state)
            self.containers.append(c)
            c.start()
        deadline = self.pod["spec"].get("activeDeadlineSeconds")
        while not self._deleting():
            self._report()
            if all(c.finished.is_set() for c in self.containers):
                return
            if deadline and time.time() > kube.parse_time(self.start_time) + int(deadline):
                self.reason, self.message = "DeadlineExceeded", f"Pod was active on the node longer than {deadline}s"
                self.force_failed = True
                self.event("Normal", "DeadlineExceeded", self.message)
                self._kill_everything(float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)))
                return
            if self.volumes is not None:
                self.volumes.refresh_tokens()
            self._wait()

    def _finish(self) -> None:
        """Stop what runs, report the final status, and wait for (or complete) the deletion."""
        if self._deleting():
            self._kill_everything(None)
        self._report()
        self.d.ipam.release(self.uid)  # a terminal pod's sandbox is gone; its IP stays in its status
        self.d.unwatch_sources(self)
        while not self._deleting():  # Succeeded/Failed pods stay until someone deletes them
            self._wait(30.0)
            self._report()  # a no-op unless the last patch failed
        if self.shutting_down:
            return
        if not self.gone:
            try:
                self.d.api.delete(kube.pod_path(self.ns, self.name),
                                  {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}})
            except kube.ApiError as e:
                if e.status not in (404, 409):
                    log.warning("%s: final delete failed: %s", self.key, e)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_everything(self, grace_s: float | None) -> None:
        """Stop every container; grace_s None means the pod's deletion deadline."""
        if grace_s is not None:
            fixed = time.monotonic() + grace_s
            self._grace_deadline = min(self._grace_deadline or fixed, fixed)
        running = [c for c in self.containers if not c.finished.is_set()]
        if running:
            names = ", ".join(c.spec["name"] for c in running)
            self.event("Normal", "Killing", f"Stopping container {names}")
        for c in running:
            c.stop(lambda: self._grace_deadline if self._grace_deadline is not None else 0.0)
        for c in running:
            c.finished.wait(max(0.0, (self._grace_deadline or 0) - time.monotonic()) + 10)
        for c in self.containers:  # belt and braces: nothing of this pod survives
            if c.proc is not None:
                kill_group(c.proc.pid, 9)
        if self.shutting_down:
            self.reason, self.message, self.force_failed = "NodeShutdown", "the process node stopped", True
        for s in self.init_states + self.states:
            if s.state != "terminated":
                s.state, s.reason, s.exit_code, s.ready = "terminated", "ContainerStatusUnknown", 137, False
                s.finished_at = s.started_at = s.started_at or kube.now_rfc3339()
                s.message = "The container could not be located when the pod was terminated"

    def _report(self) -> None:
        """Patch the pod status if it changed since the last patch."""
        if self.gone:
            return
        status = pod_status(self.pod, self.states, self.init_states, pod_ip=self.ip, host_ip=self.d.host_ip,
                            start_time=self.start_time, sandbox_ready=bool(self.ip), initialized=self.initialized,
                            init_failed=self.init_failed, reason=self.reason, message=self.message,
                            previous=self._last_status, failed=self.force_failed)
        if status == self._last_status:
            return
        try:
            # The response is not adopted: the watch brings the API's view in order.
            kube.retry(lambda: self.d.api.patch(kube.pod_path(self.ns, self.name, "status"),
                                                {"metadata": {"uid": self.uid}, "status": status}),
                       what=f"status of {self.key}")
            self._last_status = status
        except kube.ApiError as e:
            if e.status == 404 or e.status == 409:
                self.vanish()
            else:
                log.warning("%s: status patch failed: %s", self.key, e)
        except Exception as e:
            log.warning("%s: status patch failed: %s", self.key, e)
