"""The demo's driver (run by hack/demo.sh once the cluster, its real nodes and the operator are up).

Applies examples/demo.yaml in namespace ``cohort-demo`` (which enforces the
restricted Pod Security Standard), prints live progress from the TrainingJob's
status while following the workers' logs, and finishes with a report read from
the job's status, Events and those logs: accuracy, recovery times,
replacements, and the nodes the workers ran on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from podlogs import PodLogs

from cohort.client.client import event_order

REPO = Path(__file__).resolve().parents[1]
CLUSTER_DIR = Path(os.environ.get("COHORT_CLUSTER_DIR", Path.home() / ".cache/cohort/cluster"))
GROUP, VERSION, PLURAL = "cohort.dev", "v1alpha1", "trainingjobs"


def apply_crds(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    for path in (REPO / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        try:
            cur = ext.read_custom_resource_definition(crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = cur.metadata.resource_version
            ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
        except ApiException as e:
            if e.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
    time.sleep(1)


def fresh_namespace(core: client.CoreV1Api, ns: str) -> None:
    try:
        core.delete_namespace(ns)
        print(f"deleting the previous demo namespace {ns} ...", flush=True)
        while True:
            core.read_namespace(ns)
            time.sleep(0.5)
    except ApiException as e:
        if e.status != 404:
            raise
    core.create_namespace({"metadata": {"name": ns, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})


def line(job: dict, t0: float) -> str:
    s = job.get("status", {})
    p, r, w = s.get("progress", {}), s.get("replicas", {}), s.get("world", {})
    loss = p.get("loss")
    acc = p.get("accuracy")
    rep = s.get("replacements", {})
    return (f"[{time.monotonic() - t0:5.1f}s] {s.get('phase', '-'):<10} ready {r.get('summary', '-'):<5} "
            f"step {p.get('step', 0):>5}  loss {'-' if loss is None else f'{loss:.4f}'}"
            f"  acc {'-' if acc is None else f'{acc:.3f}'}  world v{w.get('version', 0)}x{w.get('size', 0)}"
            f"  replaced {rep.get('failure', 0)} failed / {rep.get('straggler', 0)} slow")


def worker_logs(ns: str, job: str) -> list[dict]:
    out = []
    for path in sorted((CLUSTER_DIR / "logs/pods").glob(f"{ns}_{job}-worker-*_trainer.log")):
        for raw in path.read_text(errors="replace").splitlines():
            if raw.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(raw))
    return out


def report(ns: str, name: str, job: dict, events: list, nodes: dict[str, str]) -> None:
    s = job.get("status", {})
    p = s.get("progress", {})
    logs = worker_logs(ns, name)
    kills = [r["t"] for r in logs if r.get("msg") == "fault injection: SIGKILL self"]
    recovered = sorted(r["t"] for r in logs if r.get("msg") == "recovered")
    print("\n== result ==")
    print(f"phase          {s.get('phase')}  ({next((c['message'] for c in s.get('conditions', []) if c['type'] == 'Succeeded'), '')})")
    print(f"final accuracy {p.get('accuracy')}   loss {p.get('loss')}   steps {p.get('step')}")
    print(f"replacements   failure {s.get('replacements', {}).get('failure', 0)}, "
          f"straggler {s.get('replacements', {}).get('straggler', 0)}; restarts {s.get('restarts', 0)}")
    print(f"world versions {s.get('world', {}).get('version')}; last checkpoint {s.get('lastCheckpoint', {}).get('location')}")
    for k in kills:
        after = [t for t in recovered if t > k]
        if after:
            print(f"recovery       worker killed -> first step of the new world: {after[0] - k:.3f} s "
                  "(in place, from a live peer; steps lost 0)")
    in_place = [r for r in logs if r.get("msg") == "recovered"]
    if in_place:
        secs = sorted(r["seconds"] for r in in_place)
        print(f"               in-process re-form + state agreement per worker: median {secs[len(secs) // 2]:.3f} s "
              f"over {len(secs)} recoveries")
    for e in events:
        if e.reason == "StragglerReplaced":
            slow = e.message.split()[1]
            by = e.message.rsplit(" by ", 1)[-1]
            print(f"straggler      {slow} on {nodes.get(slow, '?')} replaced by {by} on {nodes.get(by, '?')}")
    print("events:")
    ours = [e for e in events if (e.source and e.source.component == "cohort-operator")
            or e.reporting_component == "cohort-operator"]
    for e in ours[-14:]:
        print(f"  {e.reason:<16} {e.message}")


def main() -> int:
    ap = argparse.ArgumentParser(description="Cohort demo")
    ap.add_argument("--namespace", default="cohort-demo")
    ap.add_argument("--manifest", default=str(REPO / "examples/demo.yaml"))
    ap.add_argument("--timeout", type=float, default=420)
    args = ap.parse_args()
    api = config.new_client_from_config(os.environ["KUBECONFIG"])
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    apply_crds(api)
    fresh_namespace(core, args.namespace)
    kubectl = Path(os.environ.get("COHORT_CACHE", Path.home() / ".cache/cohort")) / "bin"
    kubectl = next(kubectl.glob("kubernetes-*/kubectl"))
    subprocess.run([str(kubectl), "apply", "-n", args.namespace, "-f", args.manifest], check=True)
    name = next(d["metadata"]["name"] for d in yaml.safe_load_all(Path(args.manifest).read_text())
                if d and d.get("kind") == "TrainingJob")
    t0 = time.monotonic()
    job: dict = {}
    last = ""
    logs = PodLogs(core, args.namespace, name, CLUSTER_DIR / "logs/pods")
    logs.clear(f"{name}-worker-")
    with logs:
        while time.monotonic() - t0 < args.timeout:
            job = custom.get_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL, name)
            text = line(job, t0)
            if text.split("]", 1)[1] != last:
                print(text, flush=True)
                last = text.split("]", 1)[1]
            if job.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        time.sleep(2)  # the last lines of the workers' logs
    print("\n$ kubectl get pods -n", args.namespace, "-o wide")
    subprocess.run([str(kubectl), "get", "pods", "-n", args.namespace, "-o", "wide"], check=False)
    events = sorted(core.list_namespaced_event(args.namespace, field_selector=f"involvedObject.name={name}").items,
                    key=event_order)
    report(args.namespace, name, job, events, logs.nodes)
    ok = job.get("status", {}).get("phase") == "Succeeded"
    print("\nThe cluster keeps running: kubectl --kubeconfig", os.environ["KUBECONFIG"], "get tj -A;"
          " stop it with make cluster-down.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
