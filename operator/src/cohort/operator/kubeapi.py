"""A small asyncio client for the Kubernetes API: plain dicts in and out.

Credentials come from the ``kubernetes`` package's loaders (in-cluster service
account first, then ``$KUBECONFIG``), so every kind of kubeconfig it
understands works here; the requests themselves go over one pooled aiohttp
session, with no thread per call and no model (de)serialisation, which keeps
the operator cheap at hundreds of jobs.

Why not kubernetes_asyncio or lightkube: both would be a second client beside
the ``kubernetes`` package kopf already brings, and kopf's own API calls are
internal; the requests here are plain REST on dicts (get, list, create-if-absent,
patch, delete, discovery), and bench/operator_scale.py measures the operator
with this client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config import incluster_config

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def load_configuration() -> k8s_client.Configuration:
    """In a pod: its service-account token (never a kubeconfig). Elsewhere: the kubeconfig."""
    cfg = k8s_client.Configuration()
    try:
        loader = incluster_config.InClusterConfigLoader(token_filename=f"{SERVICE_ACCOUNT_DIR}/token",
                                                        cert_filename=f"{SERVICE_ACCOUNT_DIR}/ca.crt")
        loader.load_and_set(cfg)
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=cfg)
    return cfg


class Kube:
    """Async REST calls against one API server."""

    def __init__(self, cfg: k8s_client.Configuration, *, concurrency: int = 32, timeout_s: float = 30):
        self.cfg = cfg
        self.base = cfg.host.rstrip("/")
        self.concurrency = concurrency
        # sock_connect, not connect: aiohttp's "connect" also counts the wait
        # for a free pooled connection, which under load is not a failure.
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls, **kwargs: Any) -> Kube:
        return cls(load_configuration(), **kwargs)

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.base.startswith("https"):
            return False
        ctx = ssl.create_default_context(cafile=self.cfg.ssl_ca_cert or None)
        if not self.cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cfg.cert_file:
            ctx.load_cert_chain(self.cfg.cert_file, self.cfg.key_file)
        return ctx

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=self.concurrency)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "cohort-operator"}
        token = self.cfg.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json", parse: bool = True) -> dict[str, Any]:
        """One API call. ``parse=False`` skips decoding the answer: a write returns the
        whole object (managedFields included), and most callers never look at it."""
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.base + path, params=params, data=data,
                                        headers=self._headers(content_type if data else None)) as resp:
            raw = await resp.read()
            if resp.status >= 300:
                text = raw.decode(errors="replace")
                try:
                    status = json.loads(text)
                    message, reason = status.get("message", text), status.get("reason", resp.reason or "")
                except ValueError:
                    message, reason = text, resp.reason or ""
                raise ApiError(resp.status, reason, message)
            return json.loads(raw) if raw and parse else {}

    # --- verbs ----------------------------------------------------------------
    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(self, path: str, *, label_selector: str = "") -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        return list((await self.request("GET", path, params=params)).get("items") or [])

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def create_if_absent(self, path: str, body: dict[str, Any]) -> bool:
        """Create; True if this call created it, False if it already existed (409)."""
        try:
            await self.request("POST", path, body=body, parse=False)
            return True
        except ApiError as e:
            if e.status == 409:
                return False
            raise

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", path, body=body)

    async def patch(self, path: str, patch: Any, *, content_type: str = MERGE_PATCH, parse: bool = False) -> dict[str, Any]:
        return await self.request("PATCH", path, body=patch, content_type=content_type, parse=parse)

    async def delete(self, path: str, *, uid: str = "", grace_s: int | None = None) -> bool:
        """Delete (background propagation); False if it was already gone.

        ``uid`` adds a precondition, so a pod deleted by name is never a newer
        pod that reuses the name.
        """
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        try:
            await self.request("DELETE", path, body=body, parse=False)
            return True
        except ApiError as e:
            if e.status in (404, 409):
                return False
            raise

    async def served_resources(self, group_version: str) -> set[tuple[str, str]]:
        """(groupVersion, plural) pairs a group/version serves; empty if it is not served."""
        path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        try:
            doc = await self.request("GET", path)
        except ApiError as e:
            if e.status in (404, 503):
                return set()
            raise
        return {(group_version, r["name"]) for r in doc.get("resources") or [] if "/" not in r["name"]}


async def gather_limited(coros: list[Any], limit: int) -> list[Any]:
    """Run coroutines concurrently, at most ``limit`` at a time; exceptions are returned."""
    sem = asyncio.Semaphore(max(limit, 1))

    async def one(c: Any) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)
