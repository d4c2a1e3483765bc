"""Small helpers for tests against the real API server: clients, waits, CRDs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from cohort.operator.naming import LABEL_JOB
from tests.support import wait

T = TypeVar("T")

GROUP, VERSION, PLURAL = "cohort.dev", "v1alpha1", "trainingjobs"


def reachable(kubeconfig: str) -> bool:
    try:
        api = client.ApiClient(config.new_client_from_config(kubeconfig).configuration)
        client.VersionApi(api).get_code(_request_timeout=3)
        return True
    except Exception:
        return False


def wait_for(predicate: Callable[[], T], timeout_s: float = 30, interval_s: float = 0.2, what: str = "") -> T:
    """support.wait.wait_for, with the API server's errors counted as "not yet"."""
    return wait.wait_for(predicate, timeout_s, interval_s, what, retry_on=(ApiException,))


class Cluster:
    """API clients bound to one kubeconfig."""

    def __init__(self, kubeconfig: str):
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)
        self.authz = client.AuthorizationV1Api(self.api)
        self.policy = client.PolicyV1Api(self.api)
        self.networking = client.NetworkingV1Api(self.api)

    # --- CRDs ---------------------------------------------------------------
    def ensure_crds(self, directory: Path) -> None:
        for path in sorted(directory.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            name = crd["metadata"]["name"]
            try:
                current = self.ext.read_custom_resource_definition(name)
                crd["metadata"]["resourceVersion"] = current.metadata.resource_version
                self.ext.replace_custom_resource_definition(name, crd)
            except ApiException as e:
                if e.status != 404:
                    raise
                self.ext.create_custom_resource_definition(crd)
            wait_for(lambda n=name: _established(self.ext.read_custom_resource_definition(n)), 30,
                     what=f"CRD {name} Established")

    # --- namespaces ---------------------------------------------------------
    def delete_namespace(self, name: str) -> None:
        try:
            self.core.delete_namespace(name, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise

    # --- TrainingJobs -------------------------------------------------------
    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body,
                                                           field_validation="Strict")

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch)

    def delete_job(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def job_pods(self, namespace: str, name: str) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(namespace, label_selector=f"{LABEL_JOB}={name}").items

    def events(self, namespace: str, name: str) -> list[client.CoreV1Event]:
        return self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items


class PodsCreated:
    """Every pod of one job that the API server shows while this runs, by name, with the uids it had.

    A watch from the resourceVersion of a first list: a pod created and deleted
    between two looks is counted too, and one name created twice shows two uids.
    A context manager: the watch ends with the block (after one more list).
    """

    def __init__(self, cluster: Cluster, namespace: str, job: str):
        self.core, self.namespace, self.selector = cluster.core, namespace, f"{LABEL_JOB}={job}"
        self.uids: dict[str, set[str]] = {}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._rv = self._list()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _list(self) -> str:
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        for pod in listed.items:
            self.uids.setdefault(pod.metadata.name, set()).add(pod.metadata.uid)
        return str(listed.metadata.resource_version)

    def _follow(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace,
                                                      label_selector=self.selector, resource_version=self._rv,
                                                      timeout_seconds=2):
                        pod = event["object"]
                        self._rv = pod.metadata.resource_version
                        self.uids.setdefault(pod.metadata.name, set()).add(pod.metadata.uid)
                except ApiException as e:
                    if e.status != 410:
                        raise
                    self._rv = self._list()  # our resourceVersion is too old: what is there now, then on
        except BaseException as e:  # surfaced when the block ends
            self._error = e

    def __enter__(self) -> PodsCreated:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        if kind is not None:
            return  # the block's own error is the one to see
        if self._thread.is_alive():
            raise AssertionError("the pod watch did not end within 10 s")
        if self._error is not None:
            raise AssertionError(f"the pod watch failed: {self._error!r}")
        self._list()


def _established(crd: Any) -> bool:
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


def condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in job.get("status", {}).get("conditions", []):
        if c["type"] == type_:
            return c
    return None
