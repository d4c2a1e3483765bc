"""Pure builders of pod status: container statuses, phase and conditions.

The pod runtime keeps one ``ContainerState`` per container and calls
``pod_status`` to turn them into the ``status`` it patches. Nothing here talks
to the API server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .kube import now_rfc3339

Obj = dict[str, Any]
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


@dataclass
class ContainerState:
    name: str
    image: str
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str = ""
    finished_at: str = ""
    exit_code: int = 0
    signal: int = 0
    restart_count: int = 0
    ready: bool = False
    started: bool = False  # the startup probe passed (or there is none)
    container_id: str = ""
    last: Obj = field(default_factory=dict)  # lastState.terminated of the previous run

    def terminated(self) -> Obj:
        t: Obj = {"exitCode": self.exit_code, "reason": self.reason, "startedAt": self.started_at or None,
                  "finishedAt": self.finished_at or None, "containerID": self.container_id or None}
        if self.signal:
            t["signal"] = self.signal
        if self.message:
            t["message"] = self.message
        return {k: v for k, v in t.items() if v is not None}

    def to_status(self) -> Obj:
        if self.state == "running":
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": self.terminated()}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        out: Obj = {"name": self.name, "image": self.image or "ignored", "imageID": "", "ready": self.ready,
                    "restartCount": self.restart_count, "started": self.state == "running" and self.started,
                    "state": state, "lastState": {"terminated": self.last} if self.last else {}}
        if self.container_id:
            out["containerID"] = self.container_id
        return out

    @property
    def never_ran(self) -> bool:
        return self.state == "waiting" and not self.last


def pod_phase(containers: list[ContainerState], initialized: bool, init_failed: bool) -> str:
    if init_failed:
        return "Failed"
    if not initialized or not containers:
        return "Pending"
    if all(c.state == "terminated" for c in containers):
        return "Failed" if any(c.exit_code != 0 for c in containers) else "Succeeded"
    if any(c.never_ran for c in containers):
        return "Pending"
    return "Running"


def _condition(type_: str, ok: bool, old: dict[str, Obj], reason: str = "", generation: int | None = None) -> Obj:
    status = "True" if ok else "False"
    prev = old.get(type_)
    c: Obj = {"type": type_, "status": status, "lastProbeTime": None,
              "lastTransitionTime": prev["lastTransitionTime"] if prev and prev.get("status") == status
              and prev.get("lastTransitionTime") else now_rfc3339()}
    if reason and not ok:
        c["reason"] = reason
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def pod_status(pod: Obj, containers: list[ContainerState], init_containers: list[ContainerState], *,
               pod_ip: str, host_ip: str, start_time: str, sandbox_ready: bool, initialized: bool,
               init_failed: bool = False, reason: str = "", message: str = "", previous: Obj | None = None,
               failed: bool = False) -> Obj:
    """The whole status to send with a JSON merge patch (lists are replaced wholesale).

    ``previous`` is the status last sent: our own conditions keep their transition
    times from it (the API's copy may lag behind). ``failed`` forces phase Failed
    once everything stopped (node shutdown).
    """
    old = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    old.update({c["type"]: c for c in (previous or {}).get("conditions") or [] if c["type"] in OWN_CONDITIONS})
    gen = pod["metadata"].get("generation")
    phase = pod_phase(containers, initialized, init_failed)
    if failed and phase == "Succeeded":
        phase = "Failed"
    terminal = phase in ("Succeeded", "Failed")
    containers_ready = initialized and bool(containers) and all(c.ready for c in containers) and not terminal
    gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
    gates_ok = all(old.get(g, {}).get("status") == "True" for g in gates)
    not_ready = "PodCompleted" if terminal else "ContainersNotReady"
    conditions = [c for t, c in old.items() if t not in OWN_CONDITIONS]  # PodScheduled, DisruptionTarget...
    conditions += [
        _condition("PodReadyToStartContainers", sandbox_ready and not terminal, old, generation=gen),
        _condition("Initialized", initialized, old, "ContainersNotInitialized", gen),
        _condition("ContainersReady", containers_ready, old, not_ready, gen),
        _condition("Ready", containers_ready and gates_ok, old,
                   "ReadinessGatesNotReady" if containers_ready else not_ready, gen),
    ]
    status: Obj = {
        "phase": phase, "conditions": conditions, "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "containerStatuses": [c.to_status() for c in containers],
        "reason": reason or None, "message": message or None,
    }
    if gen is not None:
        status["observedGeneration"] = gen
    if pod_ip:
        status["podIP"], status["podIPs"] = pod_ip, [{"ip": pod_ip}]
    if start_time:
        status["startTime"] = start_time
    if init_containers:
        status["initContainerStatuses"] = [c.to_status() for c in init_containers]
    return status
