"""Node objects for process nodes: registration, Lease heartbeats, node status.

Each node is untainted and labelled ``type: process`` and
``cohort.dev/node-kind: process``. Like a kubelet, the daemon renews a Lease in
kube-node-lease every 10 s (the node lifecycle controller reads it), refreshes
the Ready condition every minute, and deletes its Nodes when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import threading
from dataclasses import dataclass, field
from typing import Any

from . import kube

log = logging.getLogger("processnode.nodes")
Obj = dict[str, Any]
LEASE_DURATION_S = 40
LEASE_RENEW_S = 10
STATUS_EVERY_S = 60


@dataclass(frozen=True)
class NodeConfig:
    cpu: str = "32"
    memory: str = "64Gi"
    pods: str = "110"
    gpus: str = "4"
    ephemeral_storage: str = "200Gi"
    labels: dict[str, str] = field(default_factory=dict)

    def capacity(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "pods": self.pods, "nvidia.com/gpu": self.gpus,
                "ephemeral-storage": self.ephemeral_storage}


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _os_image() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "Linux"


def node_manifest(name: str, cfg: NodeConfig) -> Obj:
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine()),
              "type": "process", "cohort.dev/node-kind": "process", **cfg.labels}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0", "cohort.dev/process-node-pid": str(os.getpid())}},
            "spec": {}}


def node_status(name: str, cfg: NodeConfig, kubelet_version: str, host_ip: str, port: int, since: str) -> Obj:
    now = kube.now_rfc3339()

    def cond(type_: str, status: str, reason: str, message: str) -> Obj:
        return {"type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": since}

    machine_id = _read("/etc/machine-id", "processnode")
    return {
        "capacity": cfg.capacity(), "allocatable": cfg.capacity(),
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "process node"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "process node"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "process node"),
            cond("Ready", "True", "KubeletReady", "process node is running pods as local processes"),
        ],
        # No Hostname address: the API server would prefer it for `kubectl logs`, and it does not resolve.
        "addresses": [{"$patch": "replace"}, {"type": "InternalIP", "address": host_ip}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "machineID": machine_id, "systemUUID": f"{machine_id}-{name}",
            "bootID": _read("/proc/sys/kernel/random/boot_id"), "kernelVersion": platform.release(),
            "osImage": _os_image(), "containerRuntimeVersion": "processnode://0.1",
            "kubeletVersion": kubelet_version, "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": node_manifest(name, cfg)["metadata"]["labels"]["kubernetes.io/arch"],
        },
    }


class NodeSet:
    """The daemon's nodes: register them, keep them alive, delete them."""

    def __init__(self, api: kube.Kube, names: list[str], cfg: NodeConfig, host_ip: str, port: int = 0):
        self.api, self.names, self.cfg, self.host_ip, self.port = api, names, cfg, host_ip, port
        self.version = "v0.0.0"
        self.uids: dict[str, str] = {}
        self.since = kube.now_rfc3339()

    def register(self) -> None:
        try:
            self.version = self.api.get("/version").get("gitVersion", self.version)
        except Exception as e:
            log.warning("could not read the server version: %s", e)
        for name in self.names:
            body = node_manifest(name, self.cfg)
            try:
                got = self.api.create("/api/v1/nodes", body)
            except kube.ApiError as e:
                if e.status != 409:
                    raise
                # Left over from an earlier run: take it over, labels included.
                got = self.api.patch(f"/api/v1/nodes/{name}", {"metadata": body["metadata"]})
            self.uids[name] = got["metadata"]["uid"]
            self.report_status(name)
            self.renew_lease(name)
            log.info("registered node %s", name)

    def report_status(self, name: str) -> None:
        status = node_status(name, self.cfg, self.version, self.host_ip, self.port, self.since)
        self.api.patch(f"/api/v1/nodes/{name}/status", {"status": status}, content_type=kube.STRATEGIC_PATCH)

    def renew_lease(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": kube.now_micro()}
        try:
            self.api.patch(path, {"spec": spec})
        except kube.ApiError as e:
            if e.status != 404:
                raise
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self.uids.get(name, "")}
            self.api.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                            {"metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [owner]},
                             "spec": spec})

    def heartbeat(self, stop: threading.Event, on_beat: Any = None) -> None:
        """Renew leases every 10 s and node status every minute, until stop."""
        beats = 0
        while not stop.wait(LEASE_RENEW_S):
            beats += 1
            for name in self.names:
                try:
                    self.renew_lease(name)
                    if beats % (STATUS_EVERY_S // LEASE_RENEW_S) == 0:
                        self.report_status(name)
                except kube.ApiError as e:
                    if e.status == 404 and "nodes" in str(e):
                        log.warning("node %s was deleted; registering it again", name)
                        self.register()
                    else:
                        log.warning("heartbeat for %s failed: %s", name, e)
                except Exception as e:
                    log.warning("heartbeat for %s failed: %s", name, e)
            if on_beat:
                on_beat()

    def delete(self) -> None:
        for name in self.names:
            try:
                self.api.delete(f"/api/v1/nodes/{name}")
                log.info("deleted node %s", name)
            except Exception as e:
                log.warning("could not delete node %s: %s", name, e)
            with contextlib.suppress(Exception):
                self.api.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
