"""Pure helpers that turn a pod spec into what a local process needs.

- field references (the downward API) and resource references;
- the container environment, resolved in the kubelet's order (envFrom, then env),
  with ``$(VAR)`` expansion;
- path mapping: there is no mount namespace, so every volumeMount's mountPath is
  rewritten to its local directory in command, args and env values.

Nothing here does I/O: ConfigMaps and Secrets come in through lookup callables.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

Obj = dict[str, Any]
# lookup(kind, namespace, name) -> the object, or None when it does not exist
Lookup = Callable[[str, str, str], "Obj | None"]


class ConfigError(Exception):
    """The container cannot be configured yet (e.g. a referenced ConfigMap is missing)."""


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Obj, path: str) -> str:
    md, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    m = _SUBSCRIPT.match(path)
    if m:
        return str((md.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": md.get("name"), "metadata.namespace": md.get("namespace"),
        "metadata.uid": md.get("uid"), "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"), "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
    }
    if path in simple:
        return simple[path] or ""
    if path in ("metadata.labels", "metadata.annotations"):  # downwardAPI volumes only
        items = md.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ConfigError(f"unsupported fieldRef {path!r}")


_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(q: Any) -> float:
    m = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", str(q).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ConfigError(f"bad quantity {q!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def resource_ref(pod: Obj, container: Obj | None, ref: Obj, node_allocatable: Mapping[str, str]) -> str:
    name = ref.get("containerName")
    c = container
    if name:
        c = next((x for x in pod["spec"].get("containers", []) if x["name"] == name), None)
    if c is None:
        raise ConfigError(f"resourceFieldRef: no container {name!r}")
    kind, _, res = ref["resource"].partition(".")
    value = ((c.get("resources") or {}).get(kind) or {}).get(res)
    if value is None:  # like the kubelet: an unset limit reads as the node's allocatable
        value = node_allocatable.get(res, "0") if kind == "limits" else "0"
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(math.ceil(parse_quantity(value) / divisor))


def expand(s: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, undefined ones kept as
    written, and ``$$`` is a literal ``$`` (so ``$$(VAR)`` is never expanded)."""
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch != "$" or i + 1 == n:
            out.append(ch)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = s.find(")", i + 2)
            if close == -1:
                out.append(s[i:])
                break
            name = s[i + 2:close]
            out.append(env[name] if name in env else s[i:close + 1])
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _decoded(obj: Obj, kind: str) -> dict[str, str]:
    if kind == "Secret":
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()} | \
            dict(obj.get("stringData") or {})
    return dict(obj.get("data") or {})


def resolve_env(pod: Obj, container: Obj, lookup: Lookup, base: Mapping[str, str],
                node_allocatable: Mapping[str, str]) -> dict[str, str]:
    """The container's own variables (not the host's), in the kubelet's order.

    ``base`` holds the variables visible to ``$(VAR)`` expansion before the
    container's own ones (the service variables); they are not in the result.
    """
    ns = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            ref = src.get(key)
            if not ref:
                continue
            obj = lookup(kind, ns, ref["name"])
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
            for k, v in _decoded(obj, kind).items():
                env[prefix + k] = v
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), {**base, **env})
            continue
        vf = var["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_ref(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = resource_ref(pod, container, vf["resourceFieldRef"], node_allocatable)
        else:
            kind, ref = ("ConfigMap", vf["configMapKeyRef"]) if "configMapKeyRef" in vf else \
                ("Secret", vf.get("secretKeyRef"))
            if ref is None:
                raise ConfigError(f"env {name}: unsupported valueFrom {sorted(vf)}")
            obj = lookup(kind, ns, ref["name"])
            data = _decoded(obj, kind) if obj is not None else None
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                what = f'{kind.lower()} "{ref["name"]}"'
                raise ConfigError(f"{what} not found" if data is None else f'key "{ref["key"]}" not in {what}')
            env[name] = data[ref["key"]]
    return env


class PathMap:
    """mountPath -> local path, and the rewriting of those prefixes inside strings.

    A mount path is replaced only where it stands as a whole path: at the start of
    the string or after a non-path character (``=``, ``:``, space...), and followed
    by ``/``, the end, or a non-path character. Longer mount paths win.
    """

    def __init__(self, mapping: Mapping[str, str]):
        self.mapping = {k.rstrip("/") or "/": v for k, v in mapping.items() if k.rstrip("/")}
        keys = sorted(self.mapping, key=len, reverse=True)
        self._re = re.compile(r"(?<![\w.\-/~])(" + "|".join(map(re.escape, keys)) + r")(?=/|$|[^\w.\-])") \
            if keys else None

    def rewrite(self, s: str) -> str:
        if self._re is None:
            return s
        return self._re.sub(lambda m: self.mapping[m.group(1)], s)

    def local(self, path: str) -> str:
        """Map one absolute path (e.g. a workingDir); paths outside every mount stay as they are."""
        return self.rewrite(path)
