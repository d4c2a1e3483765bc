"""A pod's volumes as local directories, and the mount-path map built from them.

Every volume becomes a directory: emptyDir and friends under the pod's sandbox
dir, persistentVolumeClaim under ``<cluster dir>/processnodes/pvc/<ns>/<claim>``
(so data outlives pods), hostPath as the real path. File-set volumes
(configMap, secret, downwardAPI, projected, the service-account token) are
written there and rewritten when their source changes; each file is replaced
atomically (write, then rename), so a reader never sees half a file.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import kube
from .podspec import ConfigError, Lookup, expand, field_ref, resource_ref

log = logging.getLogger("processnode.volumes")
Obj = dict[str, Any]
FileSet = dict[str, tuple[bytes, int]]  # relative path -> (content, mode)


def pvc_dir(cluster_dir: Path, namespace: str, claim: str) -> Path:
    return cluster_dir / "processnodes" / "pvc" / namespace / claim


class Volumes:
    def __init__(self, pod: Obj, pod_dir: Path, cluster_dir: Path, lookup: Lookup, api: kube.Kube,
                 allocatable: Mapping[str, str]):
        self.pod = pod
        self.pod_dir = pod_dir
        self.cluster_dir = cluster_dir
        self.lookup = lookup
        self.api = api
        self.allocatable = allocatable
        self.dirs: dict[str, Path] = {}
        self._written: dict[str, set[str]] = {}  # volume -> files we wrote (to remove stale ones)
        self._token_due: dict[str, float] = {}  # volume -> when its token needs refreshing
        self._tokens: dict[tuple[str, int], tuple[str, float]] = {}  # (audience, ttl) -> (token, due)
        self._lock = threading.RLock()  # the pod thread sets up, watch threads refresh

    # --- set-up ---------------------------------------------------------------------------
    def setup(self) -> None:
        """Create every volume; raises ConfigError when a source is missing (the caller retries)."""
        with self._lock:
            self._setup()

    def _setup(self) -> None:
        ns = self.pod["metadata"]["namespace"]
        for vol in self.pod["spec"].get("volumes") or []:
            name = vol["name"]
            if "persistentVolumeClaim" in vol:
                d = pvc_dir(self.cluster_dir, ns, vol["persistentVolumeClaim"]["claimName"])
            elif "hostPath" in vol:
                d = Path(vol["hostPath"]["path"])
                kind = vol["hostPath"].get("type", "")
                if kind == "DirectoryOrCreate":
                    d.mkdir(parents=True, exist_ok=True)
                elif kind == "FileOrCreate":
                    d.parent.mkdir(parents=True, exist_ok=True)
                    d.touch(exist_ok=True)
                self.dirs[name] = d
                continue
            elif any(k in vol for k in ("emptyDir", "ephemeral", "configMap", "secret", "downwardAPI", "projected")):
                d = self.pod_dir / "volumes" / name
            else:
                other = sorted(k for k in vol if k != "name")
                raise ConfigError(f"volume {name!r}: type {other} is not supported on process nodes")
            d.mkdir(parents=True, exist_ok=True)
            self.dirs[name] = d
            files = self._render(vol)
            if files is not None:
                self._write(name, files)

    def path_map(self, container: Obj, env: Mapping[str, str]) -> dict[str, str]:
        """mountPath -> local path for one container (subPath/subPathExpr honoured)."""
        out = {}
        for m in container.get("volumeMounts") or []:
            base = self.dirs.get(m["name"])
            if base is None:
                raise ConfigError(f"volumeMount {m['name']!r} names no volume")
            sub = m.get("subPath") or ""
            if m.get("subPathExpr"):
                sub = expand(m["subPathExpr"], env)
            local = base / sub if sub else base
            if sub and not local.exists() and base.is_dir():
                local.mkdir(parents=True, exist_ok=True)
            out[m["mountPath"]] = str(local)
        return out

    # --- updates ----------------------------------------------------------------------------
    def sources(self) -> set[tuple[str, str]]:
        """(kind, name) of every ConfigMap and Secret the file-set volumes read."""
        out = set()
        for vol in self.pod["spec"].get("volumes") or []:
            if "configMap" in vol:
                out.add(("ConfigMap", vol["configMap"]["name"]))
            if "secret" in vol:
                out.add(("Secret", vol["secret"]["secretName"]))
            for src in (vol.get("projected") or {}).get("sources") or []:
                if "configMap" in src:
                    out.add(("ConfigMap", src["configMap"]["name"]))
                if "secret" in src:
                    out.add(("Secret", src["secret"]["name"]))
        return out

    def refresh(self, kind: str | None = None, name: str | None = None) -> None:
        """Rewrite the file-set volumes that read (kind, name), or all of them."""
        with self._lock:
            self._refresh(kind, name)

    def _refresh(self, kind: str | None, name: str | None) -> None:
        for vol in self.pod["spec"].get("volumes") or []:
            if vol["name"] not in self.dirs:
                continue
            uses = (kind is None or (kind == "ConfigMap" and vol.get("configMap", {}).get("name") == name)
                    or (kind == "Secret" and vol.get("secret", {}).get("secretName") == name)
                    or any((src.get("configMap") or {}).get("name") == name and kind == "ConfigMap"
                           or (src.get("secret") or {}).get("name") == name and kind == "Secret"
                           for src in (vol.get("projected") or {}).get("sources") or []))
            if not uses:
                continue
            try:
                files = self._render(vol)
            except ConfigError as e:
                log.info("%s: volume %s not refreshed: %s", self._podname(), vol["name"], e)
                continue
            if files is not None:
                self._write(vol["name"], files)

    def refresh_tokens(self) -> None:
        """Rewrite projected volumes whose service-account token reached 80% of its life."""
        now = time.time()
        with self._lock:
            for vol in self.pod["spec"].get("volumes") or []:
                due = self._token_due.get(vol["name"])
                if due is not None and due <= now:
                    try:
                        self._write(vol["name"], self._render(vol) or {})
                    except ConfigError as e:
                        log.warning("%s: token in volume %s not refreshed: %s", self._podname(), vol["name"], e)

    # --- rendering --------------------------------------------------------------------------
    def _render(self, vol: Obj) -> FileSet | None:
        if "configMap" in vol:
            src = vol["configMap"]
            return self._keys("ConfigMap", src["name"], src, src.get("defaultMode", 0o644))
        if "secret" in vol:
            src = vol["secret"]
            return self._keys("Secret", src["secretName"], src, src.get("defaultMode", 0o644))
        if "downwardAPI" in vol:
            return self._downward(vol["downwardAPI"].get("items") or [], vol["downwardAPI"].get("defaultMode", 0o644))
        if "projected" in vol:
            mode = vol["projected"].get("defaultMode", 0o644)
            files: FileSet = {}
            self._token_due.pop(vol["name"], None)
            for src in vol["projected"].get("sources") or []:
                if "configMap" in src:
                    files.update(self._keys("ConfigMap", src["configMap"]["name"], src["configMap"], mode))
                elif "secret" in src:
                    files.update(self._keys("Secret", src["secret"]["name"], src["secret"], mode))
                elif "downwardAPI" in src:
                    files.update(self._downward(src["downwardAPI"].get("items") or [], mode))
                elif "serviceAccountToken" in src:
                    t = src["serviceAccountToken"]
                    token, due = self._token(t.get("audience", ""), int(t.get("expirationSeconds", 3607)))
                    files[t["path"]] = (token.encode(), t.get("mode", 0o600 if mode == 0o644 else mode))
                    self._token_due[vol["name"]] = min(due, self._token_due.get(vol["name"], due))
            return files
        return None

    def _keys(self, kind: str, name: str, src: Obj, mode: int) -> FileSet:
        obj = self.lookup(kind, self.pod["metadata"]["namespace"], name)
        if obj is None:
            if src.get("optional"):
                return {}
            raise ConfigError(f'{kind.lower()} "{name}" not found')
        data: dict[str, bytes] = {}
        if kind == "Secret":
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        else:
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        if not src.get("items"):
            return {k: (v, mode) for k, v in data.items()}
        out = {}
        for item in src["items"]:
            if item["key"] not in data:
                if src.get("optional"):
                    continue
                raise ConfigError(f'key "{item["key"]}" not in {kind.lower()} "{name}"')
            out[item["path"]] = (data[item["key"]], item.get("mode", mode))
        return out

    def _downward(self, items: list[Obj], mode: int) -> FileSet:
        out = {}
        for item in items:
            if "fieldRef" in item:
                value = field_ref(self.pod, item["fieldRef"]["fieldPath"])
            else:
                value = resource_ref(self.pod, None, item["resourceFieldRef"], self.allocatable)
            out[item["path"]] = (value.encode(), item.get("mode", mode))
        return out

    def _token(self, audience: str, ttl_s: int) -> tuple[str, float]:
        cached = self._tokens.get((audience, ttl_s))
        if cached and cached[1] > time.time():
            return cached
        md, spec = self.pod["metadata"], self.pod["spec"]
        sa = spec.get("serviceAccountName") or "default"
        body: Obj = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                     "spec": {"expirationSeconds": ttl_s,
                              "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": md["name"],
                                                 "uid": md["uid"]}}}
        if audience:
            body["spec"]["audiences"] = [audience]
        try:
            got = self.api.create(f"/api/v1/namespaces/{md['namespace']}/serviceaccounts/{sa}/token", body)
        except kube.ApiError as e:
            raise ConfigError(f"service account token for {sa!r}: {e}") from e
        issued = time.time()
        expires = kube.parse_time(got["status"]["expirationTimestamp"])
        due = issued + 0.8 * max(60.0, expires - issued)
        self._tokens[(audience, ttl_s)] = (got["status"]["token"], due)
        return got["status"]["token"], due

    def _write(self, volume: str, files: FileSet) -> None:
        d = self.dirs[volume]
        for rel, (content, mode) in files.items():
            path = d / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                if path.read_bytes() == content:
                    os.chmod(path, mode)
                    continue
            except OSError:
                pass
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(content)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        for rel in self._written.get(volume, set()) - set(files):
            with contextlib.suppress(OSError):
                (d / rel).unlink()
        self._written[volume] = set(files)

    def _podname(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"
