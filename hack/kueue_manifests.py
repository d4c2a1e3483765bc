"""Renders Kueue's own manifests for a Kueue manager that runs as a process on this machine.

hack/kueue.sh calls it with the directory of manifests that hack/build-binaries.sh
copied from the kueue module (CRDs, the manager's ClusterRole, the webhook
configurations). In Kueue's release they point at a Service in kueue-system;
here the API server reaches the manager at https://127.0.0.1:<port> instead,
with a serving certificate signed by the local cluster's CA. So:

- ``crds``: the CRDs, with the conversion webhook Kueue's kustomization adds
  (localqueues, clusterqueues, cohorts, workloads, multikueueclusters) pointed
  at the URL;
- ``webhooks``: the webhook configurations, keeping only the webhooks for
  Kueue's own kinds (kueue.x-k8s.io): no job integration runs here, and a
  webhook for batch Jobs or pods would refuse them while nothing serves it;
- ``rules``: the rules of the manager's ClusterRole, for hack/lib.sh local_user.

Usage: python hack/kueue_manifests.py crds|webhooks|rules <dir> <url> <ca.crt>
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import yaml

CONVERTED = {"localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters"}
PREFIX = "cohort-kueue-"  # names of the webhook configurations


def crds(src: Path, url: str, ca: str) -> list[dict]:
    out = []
    for path in sorted(src.glob("kueue.x-k8s.io_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {"clientConfig": {"url": f"{url}/convert", "caBundle": ca},
                            "conversionReviewVersions": ["v1"]}}
        out.append(crd)
    return out


def webhooks(src: Path, url: str, ca: str) -> list[dict]:
    out = []
    for doc in yaml.safe_load_all((src / "manifests.yaml").read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or []:
            if not all(g == "kueue.x-k8s.io" for rule in hook["rules"] for g in rule["apiGroups"]):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": ca}
            kept.append(hook)
        kind = doc["kind"]
        doc["metadata"] = {"name": PREFIX + ("mutating" if kind.startswith("Mutating") else "validating")}
        doc["webhooks"] = kept
        out.append(doc)
    return out


def rules(src: Path) -> list[dict]:
    return list(yaml.safe_load((src / "role.yaml").read_text())["rules"])


def main(argv: list[str]) -> int:
    what, src = argv[1], Path(argv[2])
    if what == "rules":
        sys.stdout.write(yaml.safe_dump(rules(src), sort_keys=False))
        return 0
    url, ca = argv[3].rstrip("/"), base64.b64encode(Path(argv[4]).read_bytes()).decode()
    docs = crds(src, url, ca) if what == "crds" else webhooks(src, url, ca)
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
