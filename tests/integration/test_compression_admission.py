"""The API server refuses sync x compression pairs that make no sense, naming both fields.

PowerSGD compresses gradients inside DDP's allreduce, so it has no meaning for
gossip's parameter exchange; local SGD averages whole models, for which only
the casts apply. The CRD's CEL rule refuses those pairs at ``kubectl apply``;
every supported pair is accepted (dry run: no pods).
"""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from tests.support.kube import GROUP, PLURAL, VERSION
from tests.support.specs import with_workload

pytestmark = pytest.mark.k8s

REFUSED = [("gossip", "powersgd"), ("localsgd", "topk"), ("localsgd", "randomk"), ("localsgd", "qsgd"),
           ("localsgd", "terngrad"), ("localsgd", "signsgd"), ("localsgd", "powersgd")]
ACCEPTED = [("allreduce", m) for m in ("none", "fp16", "bf16", "powersgd", "topk", "randomk", "qsgd", "terngrad",
                                       "signsgd")] + \
           [("gossip", m) for m in ("none", "fp16", "bf16", "topk", "randomk", "qsgd", "terngrad", "signsgd")] + \
           [("localsgd", m) for m in ("none", "fp16", "bf16")]


def job(name: str, sync: str, method: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": with_workload({"sync": {"algorithm": sync}, "compression": {"method": method}})}


@pytest.mark.parametrize(("sync", "method"), REFUSED, ids=[f"{s}-{m}" for s, m in REFUSED])
def test_unsupported_pair_is_refused_naming_both_fields(cluster, namespace, sync, method):
    with pytest.raises(ApiException) as err:
        cluster.create_job(namespace, job(f"{sync}-{method}", sync, method))
    assert err.value.status == 422, err.value.body
    assert "spec.compression.method" in err.value.body and "spec.sync.algorithm" in err.value.body, err.value.body


def test_every_supported_pair_is_accepted(cluster, namespace):
    for sync, method in ACCEPTED:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                       job(f"{sync}-{method}", sync, method), dry_run="All")
