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
