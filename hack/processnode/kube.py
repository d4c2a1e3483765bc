"""A small JSON client for the Kubernetes API: requests, list+watch, events.

Objects are plain dicts as the API server serialises them (camelCase), which is
what the rest of the process-node code reads. It needs only urllib3 and PyYAML:
the kubelet role is all about a handful of endpoints, and raw dicts avoid the
cost of model (de)serialisation on every watch event.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
import yaml

log = logging.getLogger("processnode.kube")
Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: str, what: str):
        self.status = status
        self.body = body
        try:
            self.reason = json.loads(body).get("reason", "")
            message = json.loads(body).get("message", body)
        except ValueError:
            self.reason, message = "", body
        super().__init__(f"{what}: HTTP {status}: {message}")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Kube:
    """API access with the credentials of one kubeconfig (its current context)."""

    def __init__(self, kubeconfig: str):
        with open(kubeconfig) as f:
            cfg = yaml.safe_load(f)
        ctx_name = cfg.get("current-context")
        ctx = _named(cfg.get("contexts", []), ctx_name)["context"]
        cluster = _named(cfg["clusters"], ctx["cluster"])["cluster"]
        user = _named(cfg.get("users", []), ctx.get("user"))["user"] if ctx.get("user") else {}
        self.server = cluster["server"].rstrip("/")
        self.ca_pem = _data_or_file(cluster, "certificate-authority")
        ssl_ctx = ssl.create_default_context()
        if self.ca_pem:
            ssl_ctx.load_verify_locations(cadata=self.ca_pem.decode())
        if cluster.get("insecure-skip-tls-verify"):
            ssl_ctx.check_hostname = False
            ssl_ctx.verify_mode = ssl.CERT_NONE
        cert, key = _data_or_file(user, "client-certificate"), _data_or_file(user, "client-key")
        if cert and key:
            _load_cert_chain(ssl_ctx, cert, key)
        self.headers = {"Accept": "application/json"}
        if user.get("token"):
            self.headers["Authorization"] = f"Bearer {user['token']}"
        self.http = urllib3.PoolManager(maxsize=32, block=False, ssl_context=ssl_ctx, retries=False)

    @property
    def host_port(self) -> tuple[str, int]:
        hostport = self.server.split("://", 1)[1]
        host, _, port = hostport.rpartition(":")
        return host.strip("[]"), int(port or 443)

    # --- plain requests ---------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "application/json", timeout_s: float = 30) -> Obj:
        url = self.server + path + ("?" + urlencode(query) if query else "")
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        r = self.http.request(method, url, body=data, headers=headers,
                              timeout=urllib3.Timeout(connect=5, read=timeout_s))
        if r.status >= 400:
            raise ApiError(r.status, r.data.decode(errors="replace"), f"{method} {path}")
        return json.loads(r.data) if r.data else {}

    def get(self, path: str, **query: Any) -> Obj:
        return self.request("GET", path, query=query or None)

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Obj, content_type: str = MERGE_PATCH) -> Obj:
        return self.request("PATCH", path, body, content_type=content_type)

    def put(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body)

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        return self.request("DELETE", path, body)

    # --- list + watch -------------------------------------------------------------
    def watch(self, path: str, handler: Callable[[str, Obj], None], stop: threading.Event,
              query: dict[str, Any] | None = None, what: str = "") -> None:
        """List then watch ``path`` until ``stop``; call handler(type, obj) for each change.

        type is ADDED, MODIFIED or DELETED. After a dropped or expired watch it lists
        again and reports the differences, so the handler sees a consistent stream.
        """
        known: dict[str, Obj] = {}
        what = what or path
        while not stop.is_set():
            try:
                listing = self.get(path, **(query or {}))
                fresh = {item["metadata"]["uid"]: item for item in listing.get("items", [])}
                for uid, item in fresh.items():
                    _call(handler, "MODIFIED" if uid in known else "ADDED", item, what)
                for uid in set(known) - set(fresh):
                    _call(handler, "DELETED", known[uid], what)
                known = fresh
                rv = listing["metadata"]["resourceVersion"]
                for etype, obj in self._watch_stream(path, rv, query):
                    if stop.is_set():
                        return
                    if etype == "BOOKMARK":
                        continue
                    uid = obj["metadata"]["uid"]
                    if etype == "DELETED":
                        known.pop(uid, None)
                    else:
                        known[uid] = obj
                    _call(handler, etype, obj, what)
            except Exception as e:  # the API server restarted, a timeout, a 410 Gone...
                if stop.is_set():
                    return
                quiet = isinstance(e, ApiError) and e.status == 410 or not isinstance(e, ApiError)
                (log.debug if quiet else log.warning)("watch %s: %s; listing again", what, e)
                stop.wait(1.0)

    def _watch_stream(self, path: str, rv: str, query: dict[str, Any] | None) -> Iterator[tuple[str, Obj]]:
        q = dict(query or {}, watch="true", resourceVersion=rv, allowWatchBookmarks="true", timeoutSeconds=290)
        url = f"{self.server}{path}?{urlencode(q)}"
        r = self.http.request("GET", url, headers=self.headers, preload_content=False,
                              timeout=urllib3.Timeout(connect=5, read=330))
        try:
            if r.status >= 400:
                raise ApiError(r.status, r.read().decode(errors="replace"), f"watch {path}")
            buf = b""
            for chunk in r.stream(65536, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event["type"] == "ERROR":  # usually 410 Gone: list again
                        raise ApiError(event["object"].get("code", 500), json.dumps(event["object"]), "watch")
                    yield event["type"], event["object"]
        finally:
            r.release_conn()

    # --- events ---------------------------------------------------------------------
    def event(self, obj: Obj, type_: str, reason: str, message: str, component: str) -> None:
        """Record a core/v1 Event about obj; failures are logged, never raised."""
        md = obj["metadata"]
        ns = md.get("namespace") or "default"
        ts = now_rfc3339()
        body = {
            "metadata": {"generateName": f"{md['name']}.", "namespace": ns},
            "involvedObject": {"kind": obj.get("kind", "Pod"), "apiVersion": obj.get("apiVersion", "v1"),
                               "name": md["name"], "namespace": md.get("namespace"), "uid": md.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": "processnode", "host": component},
            "reportingComponent": "processnode", "reportingInstance": component,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        }
        try:
            self.create(f"/api/v1/namespaces/{ns}/events", body)
        except Exception as e:
            log.debug("event %s for %s/%s not recorded: %s", reason, ns, md["name"], e)


def _call(handler: Callable[[str, Obj], None], etype: str, obj: Obj, what: str) -> None:
    try:
        handler(etype, obj)
    except Exception:  # one bad object must not stop the watch
        md = obj.get("metadata", {})
        log.exception("watch %s: handling %s %s/%s failed", what, etype, md.get("namespace", ""), md.get("name"))


def pod_path(ns: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{quote(ns)}/pods/{quote(name)}" + (f"/{sub}" if sub else "")


def _named(items: list[Obj], name: str | None) -> Obj:
    for item in items:
        if item.get("name") == name:
            return item
    raise ValueError(f"kubeconfig has no entry named {name!r}")


def _data_or_file(section: Obj, key: str) -> bytes | None:
    if section.get(f"{key}-data"):
        return base64.b64decode(section[f"{key}-data"])
    if section.get(key):
        with open(section[key], "rb") as f:
            return f.read()
    return None


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl only loads client credentials from files: write them privately, load, remove.
    with tempfile.TemporaryDirectory(prefix="processnode-") as d:
        os.chmod(d, 0o700)
        cert_path, key_path = os.path.join(d, "c.crt"), os.path.join(d, "c.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)


def retry(fn: Callable[[], Any], attempts: int = 5, delay_s: float = 0.5, what: str = "") -> Any:
    """Call fn, retrying transient failures (connection errors, 5xx, 429)."""
    for i in range(attempts):
        try:
            return fn()
        except ApiError as e:
            if e.status < 500 and e.status != 429 or i == attempts - 1:
                raise
        except (urllib3.exceptions.HTTPError, OSError):
            if i == attempts - 1:
                raise
        log.debug("retrying %s", what)
        time.sleep(delay_s * (i + 1))
    return None
