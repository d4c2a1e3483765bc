"""The operator starts watching only once the API server serves its CRD.

kopf reads API discovery at its start and again on each CRD event; a CRD
created just before the operator (a fresh `helm install` with crds.enabled,
`make demo` on a new cluster) may be served only after its last event, and
kopf would never watch it. The operator therefore waits for discovery first.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from cohort.operator.kubeapi import ApiError, Kube
from cohort.operator.main import wait_until_served

pytestmark = pytest.mark.k8s


def test_waits_until_a_crd_created_later_is_served(cluster):
    group = f"t{uuid.uuid4().hex[:6]}.cohort.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"probes.{group}", "labels": {"cohort.dev/test": "true"}},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"kind": "Probe", "listKind": "ProbeList", "plural": "probes", "singular": "probe"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }
    cfg = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=cfg)

    async def scenario() -> None:
        kube = Kube(cfg)
        try:
            waiter = asyncio.create_task(wait_until_served(kube, group=group, version="v1", plural="probes",
                                                           poll_s=0.1))
            await asyncio.sleep(1.5)
            assert not waiter.done(), "returned before the CRD existed"
            await asyncio.to_thread(cluster.ext.create_custom_resource_definition, crd)
            await asyncio.wait_for(waiter, 30)
            # Served: the resource can be listed (its storage may take a moment more: 429 until then,
            # which kopf's watches retry).
            for _ in range(100):
                try:
                    assert await kube.list(f"/apis/{group}/v1/namespaces/default/probes") == []
                    break
                except ApiError as e:
                    assert e.status == 429, e
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("probes never listable")
        finally:
            await kube.close()

    try:
        asyncio.run(scenario())
    finally:
        with contextlib.suppress(ApiException):  # not there if the test failed before creating it
            cluster.ext.delete_custom_resource_definition(crd["metadata"]["name"])


def test_readyz_says_leader_only_once_kopfs_watches_run(cluster, namespace, monkeypatch):
    """``/readyz`` said ``leader`` as soon as the operator could lead, before kopf ran its watches: a
    rolling upgrade took it for acting while it acted on nothing. kopf starts its watches once its startup
    handlers end (its ready flag), so a startup handler held here keeps them from starting: the real
    operator, against the real API server, must answer 503 meanwhile (it answered 200 ``leader``)."""
    import json
    import time
    import urllib.error
    import urllib.request

    import kopf

    from cohort.operator import main as operator_main
    from cohort.operator.settings import load_settings
    from cohort.trainer.runtime.ports import free_ports

    held: list[asyncio.Event] = []
    build = operator_main.build_registry

    def build_held(rec, *, kueue=False):  # the operator's own registry, plus one startup handler that waits
        registry = build(rec, kueue=kueue)

        @kopf.on.startup(registry=registry)
        async def hold(**_kwargs):
            await held[0].wait()

        return registry

    monkeypatch.setattr(operator_main, "build_registry", build_held)
    # the client library reads $KUBECONFIG when it is imported: its default location instead
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", cluster.kubeconfig)
    health_port, metrics_port = free_ports(2)
    settings = load_settings(["--standalone", "--namespace", namespace, "--instance", "readyz-test",
                              "--metrics-port", str(metrics_port), "--health-port", str(health_port)], {})

    def readyz() -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return 0, {}

    async def scenario() -> list[tuple[int, dict]]:
        held.append(asyncio.Event())
        operator = asyncio.create_task(operator_main.run(settings))
        seen = []
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not held[0].is_set():
                seen.append(await asyncio.to_thread(readyz))
                if len(seen) >= 10 and all(code == 503 for code, _ in seen[-10:]):
                    held[0].set()  # 10 answers (about 2 s) while kopf waits for its startup handler
                await asyncio.sleep(0.2)
            for _ in range(100):
                seen.append(await asyncio.to_thread(readyz))
                if seen[-1] == (200, {"role": "leader"}):
                    break
                await asyncio.sleep(0.1)
        finally:
            operator.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await operator
        return seen

    seen = asyncio.run(scenario())
    answered = [s for s in seen if s[0]]
    assert answered[-1] == (200, {"role": "leader"}), answered
    held_back = answered[:answered.index((200, {"role": "leader"}))]
    assert len(held_back) >= 10 and all(s == (503, {"role": "starting"}) for s in held_back), answered
