"""Readiness, liveness and startup probes: httpGet, tcpSocket and exec.

A ``Prober`` thread runs one probe of one container with the kubelet's timing
(initialDelaySeconds, periodSeconds, timeoutSeconds, success/failureThreshold)
and calls back when its verdict flips. httpGet and tcpSocket go to the pod's
own loopback IP unless the probe names a host.
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("processnode.probes")
Obj = dict[str, Any]


def resolve_port(port: Any, container: Obj) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def run_probe(probe: Obj, container: Obj, pod_ip: str, env: dict[str, str], cwd: str,
              map_path: Callable[[str], str]) -> tuple[bool, str]:
    """Run the probe once: (success, message for the Unhealthy event)."""
    timeout_s = float(probe.get("timeoutSeconds") or 1)
    try:
        if "httpGet" in probe:
            h = probe["httpGet"]
            host, port = h.get("host") or pod_ip, resolve_port(h["port"], container)
            if h.get("scheme", "HTTP").upper() == "HTTPS":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    host, port, timeout=timeout_s, context=ssl._create_unverified_context())  # the kubelet skips verification too
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
            headers = {"User-Agent": "kube-probe/processnode", "Accept": "*/*"}
            headers.update({x["name"]: x["value"] for x in h.get("httpHeaders") or []})
            try:
                conn.request("GET", h.get("path") or "/", headers=headers)
                code = conn.getresponse().status
            finally:
                conn.close()
            return 200 <= code < 400, f"HTTP probe failed with statuscode: {code}"
        if "tcpSocket" in probe:
            t = probe["tcpSocket"]
            with socket.create_connection((t.get("host") or pod_ip, resolve_port(t["port"], container)), timeout_s):
                return True, ""
        if "exec" in probe:
            argv = [map_path(a) for a in probe["exec"].get("command") or []]
            r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=timeout_s,
                               stdin=subprocess.DEVNULL)
            out = (r.stdout + r.stderr).decode(errors="replace").strip()[-500:]
            return r.returncode == 0, f"exec probe exited {r.returncode}: {out}"
        if "grpc" in probe:
            return True, ""  # not supported: treated as passing (documented)
        return True, ""
    except Exception as e:
        return False, f"probe failed: {e}"


class Prober(threading.Thread):
    """Runs one probe until stopped; ``on_change(ok, message)`` is called when the verdict flips.

    The verdict starts as ``initial`` (False for readiness and startup, True for liveness).
    """

    def __init__(self, kind: str, probe: Obj, container: Obj, pod_ip: str, env: dict[str, str], cwd: str,
                 map_path: Callable[[str], str], on_change: Callable[[bool, str], None], initial: bool,
                 stop_after_success: bool = False):
        super().__init__(name=f"probe-{kind}-{container['name']}", daemon=True)
        self.kind, self.probe, self.container = kind, probe, container
        self.pod_ip, self.env, self.cwd, self.map_path = pod_ip, env, cwd, map_path
        self.on_change = on_change
        self.ok = initial
        self.stop_after_success = stop_after_success
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        p = self.probe
        period = max(1.0, float(p.get("periodSeconds") or 10))
        success_needed = int(p.get("successThreshold") or 1)
        failure_needed = int(p.get("failureThreshold") or 3)
        successes = failures = 0
        if self.stopped.wait(float(p.get("initialDelaySeconds") or 0)):
            return
        while not self.stopped.is_set():
            ok, message = run_probe(p, self.container, self.pod_ip, self.env, self.cwd, self.map_path)
            if self.stopped.is_set():
                return
            if ok:
                successes, failures = successes + 1, 0
                if not self.ok and successes >= success_needed:
                    self.ok = True
                    self.on_change(True, "")
                if self.ok and self.stop_after_success:
                    return
            else:
                failures, successes = failures + 1, 0
                log.debug("%s probe of %s failed: %s", self.kind, self.container["name"], message)
                if self.ok and failures >= failure_needed or not self.ok and failures == failure_needed:
                    self.ok = False
                    self.on_change(False, message)
            self.stopped.wait(period)
