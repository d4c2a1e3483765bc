"""The local Prometheus for tests (hack/prometheus.sh), its HTTP API, and PromQL metric names.

``prometheus`` (a session fixture) reuses a running hack/prometheus.sh
instance or starts one, and stops only one it started. Use it from a test
module with::

    from tests.support.prometheus import prometheus  # noqa: F401  (a session fixture)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube import Cluster
from tests.support.paths import cache_dir
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "prometheus.sh"


class Prometheus:
    """A Prometheus HTTP API client."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector (or scalar wrapped as one sample)."""
        data = self.get("/api/v1/query", query=expr, time=at)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step_s)["result"])

    def values_by(self, expr: str, label: str, at: float | None = None) -> dict[str, float]:
        return {s["metric"].get(label, ""): float(s["value"][1]) for s in self.query(expr, at)}

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.get("/api/v1/rules")["groups"] for r in g["rules"]]

    def targets(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/targets", state="active")["activeTargets"])

    def scrape_interval_s(self) -> float:
        config = self.get("/api/v1/status/config")["yaml"]
        m = re.search(r"scrape_interval:\s*(\d+)(ms|s|m)", config)
        if not m:
            return 15.0
        return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


@pytest.fixture(scope="session")
def prometheus(cluster: Cluster) -> Prometheus:
    """The local Prometheus (hack/prometheus.sh); started here (and stopped at the end) if needed."""
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, env=env)
    started = status.returncode != 0
    if started:
        proc = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, env=env, timeout=300)
        if proc.returncode != 0:
            pytest.fail(f"could not start Prometheus (hack/prometheus.sh up):\n{proc.stderr[-4000:]}", pytrace=False)
    url = subprocess.run([str(SCRIPT), "url"], capture_output=True, text=True, env=env).stdout.strip()
    yield Prometheus(url)
    if started and not os.environ.get("COHORT_KEEP_CLUSTER"):
        subprocess.run([str(SCRIPT), "down"], check=False, capture_output=True, env=env)


def promtool() -> str:
    """promtool, built with Prometheus by hack/build-binaries.sh."""
    cache = cache_dir()
    found = sorted(cache.glob("bin/prometheus-*/promtool"))
    assert found, f"promtool not found under {cache}/bin: run hack/build-binaries.sh prometheus"
    return str(found[-1])


# --- metric names in PromQL -------------------------------------------------------

# Words that are PromQL syntax, not metric names, when not followed by "(".
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
             "offset", "atan2", "inf", "nan", "Inf", "NaN"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_IDENT = re.compile(r"(?<![\w.:$])[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Strings, label matchers ``{...}``, ranges and subqueries ``[...]``, grouping
    clauses and ``offset`` durations are removed; what is left that is neither
    a function or aggregation (followed by ``(``) nor a keyword is a metric
    name. Grafana variables only appear inside matchers and ranges.
    """
    s = _STRING.sub('""', expr)
    s = re.sub(r"\{[^{}]*\}", " ", s)
    s = re.sub(r"\[[^\[\]]*\]", " ", s)
    s = _GROUPING.sub(" ", s)
    s = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", s)
    names = set()
    for m in _IDENT.finditer(s):
        word = m.group()
        if word in _KEYWORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(word)
    return names


def exported_names(metrics_text: str) -> set[str]:
    """Sample names in a /metrics page (``x_bucket``, ``x_sum``, ``x_count``, ``x_total``... as exposed)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name for fam in text_string_to_metric_families(metrics_text) for s in fam.samples}


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows included."""
    out = []

    def walk(panels: Iterable[dict[str, Any]]) -> None:
        for p in panels:
            for t in p.get("targets") or []:
                if t.get("expr"):
                    out.append((p.get("title", ""), t["expr"]))
            walk(p.get("panels") or [])

    walk(dashboard.get("panels") or [])
    return out


def substitute_grafana_variables(expr: str) -> str:
    """What Grafana would send: variables replaced by values that select everything."""
    for var, value in (("$__rate_interval", "1m"), ("$__interval", "15s"), ("$__range", "5m"),
                       ("$namespace", ".*"), ("$trainingjob", ".*")):
        expr = expr.replace(var, value)
    return expr


def wait_query(prom: Prometheus, expr: str, predicate: Any, timeout_s: float, what: str) -> list[dict[str, Any]]:
    """Poll an instant query until predicate(result) holds; return the result."""
    result: list[dict[str, Any]] = []

    def holds() -> bool:
        nonlocal result
        result = prom.query(expr)
        return bool(predicate(result))
    wait_for(holds, timeout_s, 0.5, what=f"{what}: {expr}")
    return result
