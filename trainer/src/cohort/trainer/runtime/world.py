"""Membership: who is in the world now, as published by the authority.

The operator (or the local launcher) is the only authority on membership
(docs/contracts.md §3). A :class:`WorldSource` follows what it publishes:

- ``configmap:<name>``: watches the world ConfigMap through the API server with
  the pod's service-account token (RBAC lets it read that one object);
- ``file:<path>``: polls a JSON file written by ``cohort run --local``;
- no ``COHORT_WORLD``: a static world from torchrun's RANK/WORLD_SIZE/MASTER_*.

A member whose collective failed reports it where ``COHORT_REPORTS`` says
(``configmap:<name>`` or ``file:<dir>``, beside the world of the same kind):
the authority checks who is gone, or re-forms the same members after a false
alarm (docs/contracts.md §3).

Why a watch over the standard library's urllib, not the ``kubernetes``
client: the worker makes exactly one kind of call (get and watch one
ConfigMap), and the client would add its 126 MB package (measured in the
venv) and its dependency tree to every trainer image for it (the import rule
keeps it out of the trainer; tests/contract/test_import_rules.py).
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from ..log import get_logger
from ..paths import map_path

log = get_logger(__name__)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
REPORT_KEY = "report.json"


@dataclass(frozen=True)
class Member:
    rank: int
    pod: str
    ip: str
    uid: str = ""


@dataclass(frozen=True)
class World:
    version: int
    members: tuple[Member, ...]
    master_addr: str
    master_port: int
    spares: tuple[str, ...] = ()
    plan: dict[str, Any] | None = None
    reason: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, pod: str) -> int | None:
        for m in self.members:
            if m.pod == pod:
                return m.rank
        return None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> World:
        members = tuple(sorted((Member(int(m["rank"]), m["pod"], m.get("ip", ""), m.get("uid", ""))
                                for m in doc.get("members", [])), key=lambda m: m.rank))
        if [m.rank for m in members] != list(range(len(members))):
            raise ValueError(f"world {doc.get('version')}: ranks must be 0..n-1, got {[m.rank for m in members]}")
        master = doc.get("master") or {}
        return cls(version=int(doc["version"]), members=members,
                   master_addr=master.get("addr", members[0].ip if members else ""),
                   master_port=int(master.get("port", 0)),
                   spares=tuple(s["pod"] for s in doc.get("spares", [])),
                   plan=doc.get("plan"), reason=doc.get("reason", ""), raw=doc)


class WorldSource:
    """Follows the published world; ``latest`` is the newest version seen."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._latest: World | None = None
        self.error: str | None = None

    @property
    def latest(self) -> World | None:
        return self._latest

    def _publish(self, world: World) -> None:
        with self._cond:
            if self._latest is None or world.version > self._latest.version:
                self._latest = world
                self._cond.notify_all()

    def wait_newer(self, version: int, timeout_s: float | None = None) -> World | None:
        """Block until a world newer than ``version`` is seen (or the timeout passes)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._latest is None or self._latest.version <= version:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(timeout=0.5 if remaining is None else min(remaining, 0.5))
            return self._latest

    def start(self) -> WorldSource:
        threading.Thread(target=self._run, name="world-source", daemon=True).start()
        return self

    def report_failure(self, version: int, error: str, absent: tuple[str, ...] = ()) -> None:
        """Tell the authority that a collective of world ``version`` failed here (it checks who is gone), or
        that the ``absent`` members never arrived at its rendezvous. A static world has no authority to tell."""

    def _run(self) -> None:  # pragma: no cover - overridden
        pass


class StaticWorld(WorldSource):
    """torchrun-style: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""

    def __init__(self, env: dict[str, str], pod: str):
        super().__init__()
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        members = tuple(Member(r, pod if r == rank else f"rank-{r}", addr if r == 0 else "") for r in range(size))
        self._publish(World(1, members, addr, int(env.get("MASTER_PORT", "29500"))))


def report_document(pod: str, version: int, error: str, absent: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a member reports when a collective of world ``version`` failed, or when members never arrived at
    its rendezvous (``absent``; docs/contracts.md §3)."""
    doc: dict[str, Any] = {"pod": pod, "version": version, "at": time.time(), "error": error[:300]}
    if absent:
        doc["absent"] = list(absent)
    return doc


class FileWorld(WorldSource):
    """Polls the launcher's world file; reports a failed collective as ``<reports>/<pod>.json``."""

    def __init__(self, path: str, poll_s: float = 0.05, pod: str = "", reports: str = ""):
        super().__init__()
        self.path, self.poll_s, self.pod, self.reports = path, poll_s, pod, reports

    def report_failure(self, version: int, error: str, absent: tuple[str, ...] = ()) -> None:
        if not self.reports:
            return
        try:  # one file per member, replaced whole, so the launcher never reads half of one
            os.makedirs(self.reports, exist_ok=True)
            path = os.path.join(self.reports, f"{self.pod}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(report_document(self.pod, version, error, absent), f)
            os.replace(path + ".tmp", path)
        except OSError as e:  # the launcher still sees a dead process end, only not a false alarm
            log.warning("could not report the failed collective", extra={"error": str(e)})

    def _run(self) -> None:
        last = None
        while True:
            try:
                stat = os.stat(self.path)
                key = (stat.st_mtime_ns, stat.st_size)
                if key != last:
                    with open(self.path) as f:
                        self._publish(World.from_json(json.load(f)))
                    last = key
            except (OSError, ValueError):
                pass  # not written yet, or mid-replace
            time.sleep(self.poll_s)


class ConfigMapWorld(WorldSource):
    """Watches one ConfigMap (key ``world.json``) with the pod's service-account token; reports a failed
    collective by patching another (``reports``, key ``report.json``: docs/contracts.md §3)."""

    def __init__(self, namespace: str, name: str, pod: str = "", reports: str = ""):
        super().__init__()
        self.namespace, self.name, self.pod, self.reports = namespace, name, pod, reports
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        self.base = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
        sa_dir = map_path(os.environ.get("COHORT_SA_DIR", SA_DIR))
        self.token_path = os.path.join(sa_dir, "token")
        self.ctx = ssl.create_default_context(cafile=os.path.join(sa_dir, "ca.crt"))

    def _open(self, path: str, timeout: float, body: bytes | None = None, content_type: str = "") -> Any:
        """One API request with the pod's service-account token (read each time: the kubelet rotates it)."""
        with open(self.token_path) as f:
            headers = {"Authorization": f"Bearer {f.read().strip()}"}
        if content_type:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(f"{self.base}/api/v1/namespaces/{self.namespace}/configmaps{path}", data=body,
                                     method="PATCH" if body is not None else "GET", headers=headers)
        return urllib.request.urlopen(req, context=self.ctx, timeout=timeout)

    def _request(self, query: dict[str, str], timeout: float) -> Any:
        return self._open("?" + urllib.parse.urlencode({"fieldSelector": f"metadata.name={self.name}", **query}),
                          timeout)

    def report_failure(self, version: int, error: str, absent: tuple[str, ...] = ()) -> None:
        if self.reports:  # off the training thread: the survivor goes on waiting for the next world
            threading.Thread(target=self._patch_report, args=(version, error, absent), name="report",
                             daemon=True).start()

    def _patch_report(self, version: int, error: str, absent: tuple[str, ...] = ()) -> None:
        report = report_document(self.pod, version, error, absent)
        body = json.dumps({"data": {REPORT_KEY: json.dumps(report)}}).encode()
        try:
            with self._open(f"/{self.reports}", 5, body, "application/merge-patch+json"):
                log.info("reported the failed collective", extra={"version": version})
        except (OSError, urllib.error.URLError) as e:  # the kubelet still tells the operator, only later
            log.warning("could not report the failed collective", extra={"error": str(e)})

    def _take(self, cm: dict[str, Any]) -> None:
        text = (cm.get("data") or {}).get("world.json")
        if text:
            self._publish(World.from_json(json.loads(text)))

    def _run(self) -> None:
        backoff = 0.2
        while True:
            try:
                with self._request({}, 10) as resp:
                    listing = json.load(resp)
                for cm in listing.get("items", []):
                    self._take(cm)
                rv = listing["metadata"]["resourceVersion"]
                with self._request({"watch": "1", "resourceVersion": rv, "timeoutSeconds": "300",
                                    "allowWatchBookmarks": "true"}, 330) as resp:
                    for line in resp:
                        event = json.loads(line)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._take(event["object"])
                self.error, backoff = None, 0.2
            except (OSError, urllib.error.URLError, ValueError) as e:
                self.error = f"watching configmap {self.namespace}/{self.name}: {e}"
                log.warning("world watch failed; retrying", extra={"error": str(e)})
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


def world_source_from_env(env: dict[str, str], namespace: str, pod: str) -> WorldSource:
    spec = env.get("COHORT_WORLD", "")
    kind, colon, where = spec.partition(":")
    reports_kind, _, reports = env.get("COHORT_REPORTS", "").partition(":")
    reports = reports if reports_kind == kind else ""  # reports go to the authority the world comes from
    if colon and kind == "configmap":
        return ConfigMapWorld(namespace, where, pod, reports).start()
    if colon and kind == "file":
        return FileWorld(where, pod=pod, reports=reports).start()
    if spec:
        raise ValueError(f"COHORT_WORLD={spec!r}: expected configmap:<name> or file:<path>")
    return StaticWorld(env, pod)
