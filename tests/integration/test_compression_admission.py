"""The API server refuses sync x compression pairs that make no sense, naming both fields.

PowerSGD compresses gradients inside DDP's allreduce, so it has no meaning for
gossip's parameter exchange; local SGD averages whole models, for which only
the casts apply. The CRD's CEL rule refuses those pairs at ``kubectl apply``;
every supported pair is accepted (dry run: no pods).
"""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from cohort.api.models import OWN_MOMENTUM
from tests.support.kube import GROUP, PLURAL, VERSION
from tests.support.specs import with_workload

pytestmark = pytest.mark.k8s

NEW = ("dgc", "threshold", "natural", "onebit", "signum")  # allreduce only
REFUSED = [("gossip", "powersgd"), ("localsgd", "topk"), ("localsgd", "randomk"), ("localsgd", "qsgd"),
           ("localsgd", "terngrad"), ("localsgd", "signsgd"), ("localsgd", "powersgd")] + \
          [(sync, m) for sync in ("gossip", "localsgd") for m in NEW]
ACCEPTED = [("allreduce", m) for m in ("none", "fp16", "bf16", "powersgd", "topk", "randomk", "qsgd", "terngrad",
                                       "signsgd") + NEW] + \
           [("gossip", m) for m in ("none", "fp16", "bf16", "topk", "randomk", "qsgd", "terngrad", "signsgd")] + \
           [("localsgd", m) for m in ("none", "fp16", "bf16")]


def job(name: str, sync: str, method: str, momentum: float | None = None, optimizer: str = "sgd") -> dict:
    # dgc and signum keep their own momentum: the optimizer must be sgd at 0 (separate rules, tested below).
    if momentum is None:
        momentum = 0.0 if method in OWN_MOMENTUM else 0.9
    spec = {"workload": {"optimizer": {"name": optimizer, "momentum": momentum}},
            "sync": {"algorithm": sync}, "compression": {"method": method}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": with_workload(spec)}


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


@pytest.mark.parametrize("method", OWN_MOMENTUM)
def test_own_momentum_method_with_optimizer_momentum_is_refused_naming_the_field(cluster, namespace, method):
    with pytest.raises(ApiException) as err:
        cluster.create_job(namespace, job(f"momentum-{method}", "allreduce", method, momentum=0.9))
    assert err.value.status == 422, err.value.body
    assert "spec.workload.optimizer.momentum" in err.value.body, err.value.body


@pytest.mark.parametrize("method", OWN_MOMENTUM)
def test_own_momentum_method_with_adamw_is_refused_naming_the_optimizer(cluster, namespace, method):
    with pytest.raises(ApiException) as err:
        cluster.create_job(namespace, job(f"adamw-{method}", "allreduce", method, momentum=0.0, optimizer="adamw"))
    assert err.value.status == 422, err.value.body
    assert "spec.workload.optimizer.name sgd" in err.value.body, err.value.body
