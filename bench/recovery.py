"""Recovery after a worker is killed: Cohort in place vs torchrun elastic restart (a benchmark).

    python bench/recovery.py [--workers 4] [--every 50] [--kill-steps 110,125,140]

The same model (MLP on digits, 4 ranks, gloo on CPU) is killed at the same
step under both systems:
- Cohort: `cohort run --local`; the launcher (the membership authority, as the
  operator is on Kubernetes) publishes a world without the dead rank and the
  survivors re-form their process group in place, continuing from the step
  they hold.
- torchrun elastic (c10d rendezvous, --max-restarts): every worker is
  restarted, re-imports torch, re-rendezvouses and reloads the newest
  checkpoint, taken every K steps.
- Cohort on the local Kubernetes cluster (unless --no-cluster): the real
  operator on real nodes (containers), with one spare that the operator promotes into
  the next world as soon as the killed pod is reported failed.
Recovery time is from the kill to the first completed step of the new world;
steps lost are the completed steps that must be computed again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support.wait import wait_for  # noqa: E402


def _ts(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=None).timestamp() - time.timezone


def cohort_once(tmp: Path, workers: int, kill_step: int, steps: int) -> tuple[float, int]:
    manifest = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    manifest["metadata"]["name"] = "recovery"
    manifest["spec"]["workload"].update({"epochs": 0, "maxSteps": steps})
    manifest["spec"]["checkpoint"] = {"everySteps": 0}
    mf = tmp / "job.yaml"
    mf.write_text(yaml.safe_dump(manifest))
    subprocess.run([sys.executable, "-m", "cohort.trainer.cli", "run", str(mf), "--local", "--workers",
                    str(workers), "--run-dir", str(tmp / "run"), "--no-replace"], check=True,
                   env={**os.environ, "COHORT_FAULT_KILL": f"rank=2,step={kill_step}"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_kill, recovered, resumed = None, [], []
    for log in (tmp / "run").glob("*.log"):
        for line in log.read_text().splitlines():
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if rec["msg"] == "fault injection: SIGKILL self":
                t_kill = rec["t"]
            elif rec["msg"] == "recovered":
                recovered.append(rec["t"])
            elif rec["msg"] == "joined world" and rec.get("world_version") == 2:
                resumed.append(rec["step"])
    assert t_kill is not None and recovered and resumed, f"no recovery seen in {tmp / 'run'}"
    return max(recovered) - t_kill, kill_step - min(resumed)


def cluster_once(kill_step: int, steps: int, run: int) -> tuple[float, int]:
    """One job on the local cluster's real nodes (cluster and operator started by hack/ scripts)."""
    import importlib.util

    from kubernetes import client, config

    spec = importlib.util.spec_from_file_location("podlogs", REPO / "hack/podlogs.py")
    assert spec and spec.loader
    podlogs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(podlogs)

    env = {**os.environ, "COHORT_OPERATOR_ARGS": os.environ.get(
        "COHORT_OPERATOR_ARGS", "--namespace cohort-demo --namespace cohort-bench --progress-seconds 1 "
                                "--resync-seconds 10")}
    kubeconfig = subprocess.run([str(REPO / "hack/cluster.sh"), "up"], check=True, capture_output=True,
                                text=True, env=env).stdout.strip().splitlines()[-1]
    env["KUBECONFIG"] = kubeconfig
    subprocess.run([str(REPO / "hack/operator.sh"), "up"], check=True, capture_output=True, env=env)
    api = config.new_client_from_config(kubeconfig)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    ns, name = "cohort-bench", f"recovery-{run}-{int(time.time())}"
    try:
        core.create_namespace({"metadata": {"name": ns, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    except client.ApiException as e:
        if e.status != 409:
            raise
    job = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"]["workload"].update({"epochs": 0, "maxSteps": steps, "evalEveryEpochs": 0})
    job["spec"]["replicas"] = {"min": 2, "max": 6, "target": 4, "spares": 1}
    job["spec"]["checkpoint"] = {"everySteps": 0}
    job["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "COHORT_FAULT_KILL", "value": f"rank=2,step={kill_step}"}]}]}}
    logs = Path(os.environ.get("COHORT_CLUSTER_DIR", Path.home() / ".cache/cohort/cluster")) / "logs/pods"
    # The killed worker's pod is deleted at once: follow the logs while the job runs.
    with podlogs.PodLogs(core, ns, f"cohort.dev/job={name}", logs):
        custom.create_namespaced_custom_object("cohort.dev", "v1alpha1", ns, "trainingjobs", job)
        def finished() -> str | None:
            phase = custom.get_namespaced_custom_object("cohort.dev", "v1alpha1", ns, "trainingjobs", name) \
                .get("status", {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None
        phase = wait_for(finished, 300, 1, what=f"{ns}/{name} to finish")
        time.sleep(2)  # the last lines of the logs
    assert phase == "Succeeded", f"{ns}/{name} ended {phase}"
    records = []
    for path in logs.glob(f"{ns}_{name}-worker-*_trainer.log"):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    t_kill = next(r["t"] for r in records if r["msg"] == "fault injection: SIGKILL self")
    first = min(r["t"] for r in records if r["msg"] == "recovered" and r["t"] > t_kill)
    resumed = min(r["step"] for r in records if r["msg"] == "joined world" and r["t"] > t_kill)
    custom.delete_namespaced_custom_object("cohort.dev", "v1alpha1", ns, "trainingjobs", name)
    return first - t_kill, max(0, kill_step - resumed)


def torchrun_once(tmp: Path, workers: int, kill_step: int, steps: int, every: int, port: int) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(workers),
           "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--monitor-interval", "0.1", str(REPO / "bench/torchrun_worker.py"), "--ckpt-dir", str(tmp),
           "--every", str(every), "--kill-step", str(kill_step), "--steps", str(steps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    kill = next(e for e in events if e["event"] == "kill")
    first = next(e for e in events if e["event"] == "first_step")
    resumed = next((e["step"] for e in events if e["event"] == "resumed" and e["incarnation"] > 0), 0)
    return first["t"] - kill["t"], kill["step"] - resumed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--every", type=int, default=50, help="torchrun checkpoint interval K (steps)")
    ap.add_argument("--kill-steps", default="110,125,140")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--no-cluster", action="store_true", help="skip the run on the local Kubernetes cluster")
    args = ap.parse_args()
    rows, cluster_rows = [], []
    for i, s in enumerate(int(x) for x in args.kill_steps.split(",")):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            c_time, c_lost = cohort_once(Path(a), args.workers, s, args.steps)
            t_time, t_lost = torchrun_once(Path(b), args.workers, s, args.steps, args.every, 29850 + i)
        rows.append((s, c_time, c_lost, t_time, t_lost))
        if not args.no_cluster:
            cluster_rows.append((s, *cluster_once(s, max(args.steps, 3 * s), i)))
    print(f"{args.workers} ranks, MLP on digits, gloo/CPU; torchrun checkpoints every K={args.every} steps")
    print("| kill at step | Cohort recovery (s) | Cohort steps lost | torchrun recovery (s) | torchrun steps lost |"
          " Cohort / torchrun time |")
    print("|---|---|---|---|---|---|")
    for s, ct, cl, tt, tl in rows:
        print(f"| {s} | {ct:.3f} | {cl} | {tt:.3f} | {tl} | {ct / tt:.3f} |")
    ct = statistics.mean(r[1] for r in rows)
    tt = statistics.mean(r[3] for r in rows)
    print(f"| mean | {ct:.3f} | {statistics.mean(r[2] for r in rows):.1f} | {tt:.3f} | "
          f"{statistics.mean(r[4] for r in rows):.1f} | **{ct / tt:.3f}** |")
    if cluster_rows:
        print("\nOn the local Kubernetes cluster (operator, real nodes: containers, 4 workers + 1 spare "
              "promoted at once):")
        print("| kill at step | recovery, kill -> first step of the new world (s) | steps lost |")
        print("|---|---|---|")
        for s, secs, lost in cluster_rows:
            print(f"| {s} | {secs:.3f} | {lost} |")
        print(f"| mean | **{statistics.mean(r[1] for r in cluster_rows):.3f}** | "
              f"{statistics.mean(r[2] for r in cluster_rows):.1f} |")


if __name__ == "__main__":
    main()
