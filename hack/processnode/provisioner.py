"""A StorageClass whose volumes are local directories, so PVC-backed pods schedule.

The scheduler will not place a pod whose PersistentVolumeClaim is unbound, so
the daemon provisions like an external provisioner would: for each pending
claim of the ``process-local`` class (the default class unless another one
is) it creates a hostPath PersistentVolume pre-bound to the claim, pointing at
``<cluster dir>/processnodes/pvc/<namespace>/<claim>`` (the directory pods
see, whatever node runs them). When the claim is deleted, the volume and the
directory go too (reclaim policy Delete).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

from . import kube
from .volumes import pvc_dir

log = logging.getLogger("processnode.provisioner")
Obj = dict[str, Any]
CLASS = "process-local"
PROVISIONER = "cohort.dev/process-node"
DEFAULT_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
# WaitForFirstConsumer: with Immediate, a pod created in the same breath as its
# claim is found "unschedulable" before the claim is bound, and may wait minutes
# to be retried. With it, the scheduler picks a node and waits for the binding.
# Claims are provisioned at once either way.
BINDING = "WaitForFirstConsumer"


class Provisioner:
    def __init__(self, api: kube.Kube, cluster_dir: Path):
        self.api, self.cluster_dir = api, cluster_dir
        self.root = cluster_dir / "processnodes" / "pvc"

    def ensure_class(self) -> None:
        classes = self.api.get("/apis/storage.k8s.io/v1/storageclasses").get("items", [])
        mine = [c for c in classes if c["metadata"]["name"] == CLASS]
        if mine and mine[0].get("volumeBindingMode") == BINDING and mine[0].get("provisioner") == PROVISIONER:
            return
        if mine:  # an older definition: the fields are immutable, so replace it (volumes keep working)
            self.api.delete(f"/apis/storage.k8s.io/v1/storageclasses/{CLASS}")
        other_default = any(c["metadata"].get("annotations", {}).get(DEFAULT_ANNOTATION) == "true"
                            for c in classes if c["metadata"]["name"] != CLASS)
        body = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": CLASS, "annotations": {DEFAULT_ANNOTATION: "false" if other_default else "true"}},
                "provisioner": PROVISIONER, "reclaimPolicy": "Delete", "volumeBindingMode": BINDING}
        try:
            self.api.create("/apis/storage.k8s.io/v1/storageclasses", body)
            log.info("created StorageClass %s", CLASS)
        except kube.ApiError as e:
            if e.status != 409:
                raise

    def clean_released(self) -> None:
        """Delete our volumes whose claims went away while no daemon was running."""
        for pv in self.api.get("/api/v1/persistentvolumes").get("items", []):
            if self._ours(pv) and (pv.get("status") or {}).get("phase") == "Released":
                self._delete_volume(pv)

    def on_claim(self, etype: str, pvc: Obj) -> None:
        if not self._our_claim(pvc):
            return
        md = pvc["metadata"]
        if etype == "DELETED":
            try:
                pv = self.api.get(f"/api/v1/persistentvolumes/pvc-{md['uid']}")
                self._delete_volume(pv)
            except kube.ApiError as e:
                if e.status != 404:
                    log.warning("volume of %s/%s not deleted: %s", md["namespace"], md["name"], e)
            return
        if pvc["spec"].get("volumeName") or (pvc.get("status") or {}).get("phase") != "Pending":
            return
        try:
            self.api.get(f"/api/v1/persistentvolumes/pvc-{md['uid']}")
            return  # provisioned already; the PV controller binds it
        except kube.ApiError as e:
            if e.status != 404:
                raise
        path = pvc_dir(self.cluster_dir, md["namespace"], md["name"])
        if path.exists() and any(path.iterdir()):
            # Left by an earlier claim of the same name (a cluster recreated, or a claim
            # deleted while no daemon ran): a new claim is a new, empty volume, or a job
            # would "resume" from another run's checkpoints.
            log.info("claim %s/%s is new: removing the stale contents of %s", md["namespace"], md["name"], path)
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        size = ((pvc["spec"].get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        pv = {"apiVersion": "v1", "kind": "PersistentVolume",
              "metadata": {"name": f"pvc-{md['uid']}", "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
                           "labels": {"cohort.dev/node-kind": "process"}},
              "spec": {"capacity": {"storage": size}, "accessModes": pvc["spec"].get("accessModes") or ["ReadWriteOnce"],
                       "persistentVolumeReclaimPolicy": "Delete", "storageClassName": CLASS,
                       "volumeMode": pvc["spec"].get("volumeMode", "Filesystem"),
                       "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                       "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": md["namespace"],
                                    "name": md["name"], "uid": md["uid"]}}}
        try:
            self.api.create("/api/v1/persistentvolumes", pv)
            log.info("provisioned %s for claim %s/%s", pv["metadata"]["name"], md["namespace"], md["name"])
        except kube.ApiError as e:
            if e.status != 409:
                log.warning("could not provision claim %s/%s: %s", md["namespace"], md["name"], e)

    def _our_claim(self, pvc: Obj) -> bool:
        ann = pvc["metadata"].get("annotations") or {}
        return pvc["spec"].get("storageClassName") == CLASS or PROVISIONER in (
            ann.get("volume.kubernetes.io/storage-provisioner"), ann.get("volume.beta.kubernetes.io/storage-provisioner"))

    def _ours(self, pv: Obj) -> bool:
        return (pv["metadata"].get("annotations") or {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER

    def _delete_volume(self, pv: Obj) -> None:
        if not self._ours(pv):
            return
        path = Path((pv["spec"].get("hostPath") or {}).get("path", ""))
        try:
            self.api.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
        except kube.ApiError as e:
            if e.status != 404:
                raise
        if path.is_relative_to(self.root) and path != self.root:  # never remove anything else
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):  # the namespace's directory, once empty
                path.parent.rmdir()
            log.info("deleted volume %s and %s", pv["metadata"]["name"], path)
