"""The process-node daemon: registers nodes and runs the pods bound to them.

It ties the parts together with watches (never tight polling): one pod watch
per node (``fieldSelector=spec.nodeName=<node>``), and cluster-wide watches of
ConfigMaps and Secrets (to keep volumes current and resolve env without a GET
per pod) and of PersistentVolumeClaims (the local provisioner). Each pod is a
``PodRuntime`` thread; this module only routes events to them.

On SIGTERM it stops every pod (SIGTERM, a short grace, SIGKILL), marks them
Failed (NodeShutdown), and deletes its Nodes. After a restart, pods an earlier
instance was running are marked Failed (NodeRestarted): their processes died
with it, or are killed now.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import kube
from .container import kill_group
from .ipam import Ipam, process_id
from .kubeletapi import KubeletServer
from .nodes import NodeConfig, NodeSet
from .pod import PodRuntime
from .provisioner import Provisioner
from .status import ContainerState, pod_status

log = logging.getLogger("processnode")
Obj = dict[str, Any]
# Host variables a pod must not inherit: the daemon's admin credentials, and the
# context of whoever started it (a test run, a torchrun, the contract's COHORT_*
# variables or fault injection), which would silently change every pod.
HIDDEN_HOST_VARS = {"KUBECONFIG", "PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                    "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK"}
HIDDEN_HOST_PREFIXES = ("PYTEST_", "TORCHELASTIC_", "COHORT_")
KEPT_HOST_VARS = {"COHORT_CACHE"}


def host_env(path_prefix: list[str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k in KEPT_HOST_VARS or not (k in HIDDEN_HOST_VARS or k.startswith(HIDDEN_HOST_PREFIXES))}
    env["PATH"] = os.pathsep.join([*path_prefix, env.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
    return env


class Daemon:
    def __init__(self, kubeconfig: str, cluster_dir: Path, node_names: list[str], cfg: NodeConfig,
                 path_prefix: list[str]):
        self.api = kube.Kube(kubeconfig)
        self.cluster_dir = cluster_dir
        self.state_dir = cluster_dir / "processnodes"
        self.pod_logs_dir = cluster_dir / "logs" / "pods"
        self.pod_logs_dir.mkdir(parents=True, exist_ok=True)
        self.node_names = node_names
        self.host_ip = "127.0.0.1"
        self.ipam = Ipam(self.state_dir)
        self.nodes = NodeSet(self.api, node_names, cfg, self.host_ip)
        self.provisioner = Provisioner(self.api, cluster_dir)
        self.allocatable = cfg.capacity()
        self.host_env = host_env(path_prefix)
        self.stop = threading.Event()
        self.runtimes: dict[str, PodRuntime] = {}
        self.finished: set[str] = set()
        self._lock = threading.RLock()
        # ConfigMaps and Secrets, kept by watches: (kind, ns, name) -> object
        self.cache: dict[tuple[str, str, str], Obj] = {}
        self.synced: set[str] = set()
        self.subscribers: dict[tuple[str, str, str], set[PodRuntime]] = {}

    # --- services for pod runtimes ----------------------------------------------------------
    def service_env(self) -> dict[str, str]:
        host, port = self.api.host_port
        return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(port), "KUBERNETES_PORT": f"tcp://{host}:{port}"}

    def lookup(self, kind: str, ns: str, name: str) -> Obj | None:
        obj = self.cache.get((kind, ns, name))
        if obj is not None:
            return obj
        plural = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
        try:  # not seen (yet) by the watch: ask
            return self.api.get(f"/api/v1/namespaces/{ns}/{plural}/{name}")
        except kube.ApiError as e:
            if e.status == 404:
                return None
            raise

    def watch_sources(self, rt: PodRuntime, sources: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            for kind, name in sources:
                self.subscribers.setdefault((kind, rt.ns, name), set()).add(rt)

    def unwatch_sources(self, rt: PodRuntime) -> None:
        with self._lock:
            for subs in self.subscribers.values():
                subs.discard(rt)

    def container_running(self, ns: str, name: str, container: str) -> bool:
        """Whether the container may still write to its log (for `kubectl logs -f`)."""
        with self._lock:
            runtimes = [rt for rt in self.runtimes.values() if rt.ns == ns and rt.name == name]
        return any(not c.finished.is_set() for rt in runtimes for c in rt.containers if c.spec["name"] == container) \
            or any(not rt.containers for rt in runtimes)

    def pod_dir(self, node: str, uid: str) -> Path:
        return self.state_dir / "pods" / node / uid

    def forget(self, uid: str) -> None:
        with self._lock:
            rt = self.runtimes.pop(uid, None)
            self.finished.add(uid)
        if rt is not None:
            self.unwatch_sources(rt)

    # --- watch handlers ---------------------------------------------------------------------
    def on_pod(self, etype: str, pod: Obj) -> None:
        md = pod["metadata"]
        uid = md["uid"]
        with self._lock:
            rt = self.runtimes.get(uid)
            if etype == "DELETED":
                if rt is not None:
                    rt.vanish()
                return
            if rt is not None:
                rt.update(pod)
                return
            if uid in self.finished or self.stop.is_set():
                return
            phase = (pod.get("status") or {}).get("phase")
            terminal = phase in ("Succeeded", "Failed")
            orphaned = not terminal and self._ran_before(pod)  # an earlier daemon ran it
            start = not (terminal or orphaned or md.get("deletionTimestamp"))
            if start:
                rt = PodRuntime(self, pod)
                self.runtimes[uid] = rt
        # API calls outside the lock: the other watches and the pods go on meanwhile.
        if orphaned:
            self._mark_restarted(pod)
        if not start and md.get("deletionTimestamp"):  # already over, or never started: nothing to stop
            self._delete_now(pod)
        if start:
            log.info("starting pod %s/%s", md["namespace"], md["name"])
            rt.start()

    def on_source(self, kind: str, etype: str, obj: Obj) -> None:
        md = obj["metadata"]
        key = (kind, md["namespace"], md["name"])
        if etype == "DELETED":
            self.cache.pop(key, None)
            return
        old = self.cache.get(key)
        self.cache[key] = obj
        if old is not None and old.get("data") == obj.get("data") and old.get("binaryData") == obj.get("binaryData"):
            return
        with self._lock:
            subs = list(self.subscribers.get(key, ()))
        for rt in subs:
            try:
                rt.source_changed(kind, md["name"])
            except Exception as e:
                log.warning("refreshing %s %s/%s for %s failed: %s", kind, md["namespace"], md["name"], rt.key, e)

    # --- restarts -------------------------------------------------------------------------------
    @staticmethod
    def _ran_before(pod: Obj) -> bool:
        status = pod.get("status") or {}
        return bool(status.get("startTime")) or status.get("phase") == "Running"

    def _kill_leftovers(self, pod_dir: Path) -> None:
        for f in (pod_dir / "pids").glob("*"):
            recorded = f.read_text().strip()
            pid = int(recorded.split(":", 1)[0])
            if process_id(pid) == recorded:
                log.info("killing leftover process group %d of %s", pid, pod_dir.name)
                kill_group(pid, signal.SIGKILL)

    def _mark_restarted(self, pod: Obj) -> None:
        md, spec = pod["metadata"], pod["spec"]
        self._kill_leftovers(self.pod_dir(spec["nodeName"], md["uid"]))
        old = {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or []}
        states = []
        for c in spec["containers"]:
            s = ContainerState(c["name"], c.get("image", ""), state="terminated", reason="ContainerStatusUnknown",
                               exit_code=137, message="The container could not be located when the pod was terminated",
                               restart_count=old.get(c["name"], {}).get("restartCount", 0))
            s.started_at = ((old.get(c["name"], {}).get("state") or {}).get("running") or {}).get("startedAt", "")
            s.finished_at = kube.now_rfc3339()
            states.append(s)
        st = pod.get("status") or {}
        status = pod_status(pod, states, [], pod_ip=st.get("podIP", ""), host_ip=self.host_ip,
                            start_time=st.get("startTime", ""), sandbox_ready=False, initialized=True,
                            reason="NodeRestarted", message="the process-node daemon restarted; the pod's processes "
                            "did not survive it", failed=True)
        try:
            self.api.patch(kube.pod_path(md["namespace"], md["name"], "status"),
                           {"metadata": {"uid": md["uid"]}, "status": status})
            log.info("marked %s/%s Failed (NodeRestarted)", md["namespace"], md["name"])
        except kube.ApiError as e:
            log.warning("could not mark %s/%s Failed: %s", md["namespace"], md["name"], e)

    def _delete_now(self, pod: Obj) -> None:
        md = pod["metadata"]
        shutil.rmtree(self.pod_dir(pod["spec"]["nodeName"], md["uid"]), ignore_errors=True)
        try:
            self.api.delete(kube.pod_path(md["namespace"], md["name"]),
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": md["uid"]}})
        except kube.ApiError as e:
            if e.status not in (404, 409):
                log.warning("could not delete %s/%s: %s", md["namespace"], md["name"], e)

    def _collect_garbage(self) -> None:
        """Pod directories of pods that no longer exist: kill what is left, remove them."""
        current = set()
        for node in self.node_names:
            pods = self.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")
            current |= {p["metadata"]["uid"] for p in pods.get("items", [])}
        for node in self.node_names:
            for d in (self.state_dir / "pods" / node).glob("*"):
                if d.name not in current:
                    self._kill_leftovers(d)
                    shutil.rmtree(d, ignore_errors=True)

    # --- main -------------------------------------------------------------------------------------
    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def run(self) -> None:
        try:
            server = KubeletServer(self.pod_logs_dir, self.state_dir / "pki", self.container_running)
            server.start()
            self.nodes.port = server.port
        except Exception as e:  # `kubectl logs` will not work; hack/processnodes.sh logs still does
            log.warning("kubelet API (for kubectl logs) not started: %s", e)
        self.provisioner.ensure_class()
        self.provisioner.clean_released()
        self.nodes.register()
        self._collect_garbage()
        for kind, plural in (("ConfigMap", "configmaps"), ("Secret", "secrets")):
            self._spawn(f"watch-{plural}", self.api.watch, f"/api/v1/{plural}",
                        lambda e, o, k=kind: self.on_source(k, e, o), self.stop)
        self._spawn("watch-pvcs", self.api.watch, "/api/v1/persistentvolumeclaims", self.provisioner.on_claim, self.stop)
        for node in self.node_names:
            self._spawn(f"watch-pods-{node}", self.api.watch, "/api/v1/pods", self.on_pod, self.stop,
                        {"fieldSelector": f"spec.nodeName={node}"}, f"pods on {node}")
        heartbeat_file = self.state_dir / "heartbeat"
        heartbeat_file.write_text(str(time.time()))
        self._spawn("heartbeat", self.nodes.heartbeat, self.stop, lambda: heartbeat_file.write_text(str(time.time())))
        ready = {"pid": os.getpid(), "nodes": self.node_names, "started": kube.now_rfc3339()}
        (self.state_dir / "daemon.json").write_text(json.dumps(ready))
        log.info("process nodes ready: %s", ", ".join(self.node_names))
        self.stop.wait()
        self.shutdown()

    def shutdown(self) -> None:
        log.info("stopping: ending %d pods, deleting nodes", len(self.runtimes))
        with self._lock:
            runtimes = list(self.runtimes.values())
        for rt in runtimes:
            rt.shutdown()
        deadline = time.monotonic() + 8
        for rt in runtimes:
            rt.join(max(0.1, deadline - time.monotonic()))
        self.nodes.delete()
        with contextlib.suppress(OSError):
            (self.state_dir / "daemon.json").unlink()
        log.info("stopped")
