"""Recovery after a killed worker: Cohort against torchrun elastic, equal end states (a benchmark).

    python bench/recovery.py [--workers 4] [--kills 5] [--every 1,10,50] [--steps 1200] [--no-cluster]
                              [--systems spare,torchrun] [--loader-workers 2]

The same model (MLP on digits, 4 ranks, gloo on CPU, examples/digits.yaml's
optimizer and batch) loses rank 2 to a SIGKILL at the same step under every
system, in one invocation, interleaved, ``--kills`` times (kill steps 110,
117, 124, ...: never a multiple of a checkpoint interval). Every system ends
back at 4 ranks, and recovery ends at one event everywhere: the slowest
rank's first completed step in the first world of 4 after the kill.

- Cohort, spare: ``cohort run --local`` with ``replicas.spares: 1``. The
  launcher (the membership authority, as the operator is on Kubernetes)
  publishes a world with the ready spare in the dead rank's place; the
  survivors re-form their process group in place and hand their state to the
  spare. Checkpoints on as the example ships them (every 100 steps).
- Cohort, replacement: no spare. The survivors continue at 3 at once; a new
  process is started and joins when ready (a second world change, back at 4).
- torchrun elastic (c10d rendezvous, ``--max-restarts 3``, ``--monitor-interval
  0.1``, its default in torch 2.13; bench/torchrun_elastic.py): every worker is restarted, re-imports torch,
  re-rendezvouses and reloads the newest checkpoint, which rank 0 writes every
  K steps (``--every``; torch.save and an atomic rename, bench/torchrun_worker.py).

Phases, each to the slowest rank, from the processes' own timestamped logs:
detect (kill to the launcher's new world, or to the first restarted process),
process start and imports (restarted processes; Cohort's replacement),
rendezvous (the process group formed; torchft: its quorum and the heal, which
fetches the state from a peer), data, model and state (torchrun: the dataset,
the model and the checkpoint load; Cohort: agreeing on the state and a peer's
hand-over; torchft: the dataset and the model), first step. Steps lost are
completed steps computed again (torchft: steps its survivors did not commit).
Each cell is the mean [min-max] over the kills.

- torchft 0.2.0 (if ``hack/torchft.sh`` installed it): its fault-tolerant DDP
  with one replica group per process (bench/torchft_worker.py), its Rust
  lighthouse with ``min_replicas`` 3 and its other settings as shipped; the
  killed replica is restarted at once by this script (torchft leaves restarts
  to the scheduler) and heals from a peer. Its survivors keep training at 3.

Unless ``--no-cluster``: after each kill's round, the same job on the local
cluster's real nodes (the operator, 4 worker containers and a spare) twice,
interleaved: with the operator acting on survivors' reports (the default), and
restarted with ``--ignore-reports``, where the killed worker leaves the world
only once its kubelet reports the container dead. Each row says which it was.

``--loader-workers N``: Cohort's jobs (local and on the cluster) fetch their
batches in N DataLoader worker processes per rank (``workload.dataLoaderWorkers``);
torchrun's and torchft's workers go on fetching in their training process.
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
from bench import torchrun_elastic  # noqa: E402
from bench.stats import host  # noqa: E402
from tests.support.wait import wait_for  # noqa: E402

PHASES = ("detect", "start+imports", "rendezvous", "data, model, state", "first step")


def _records(run: Path) -> list[dict]:
    out = []
    for log in run.glob("*.log"):
        out += [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return out


def cohort_once(tmp: Path, workers: int, kill_step: int, steps: int, spares: int, loader_workers: int = 0) -> dict:
    """One Cohort run; recovery time, phases and steps lost, back at ``workers`` ranks."""
    manifest = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    manifest["metadata"]["name"] = "recovery"
    manifest["spec"]["workload"].update({"epochs": 0, "maxSteps": steps, "evalEveryEpochs": 0,
                                         "dataLoaderWorkers": loader_workers})
    manifest["spec"]["replicas"]["spares"] = spares
    mf = tmp / "job.yaml"
    mf.write_text(yaml.safe_dump(manifest))
    summary = tmp / "summary.json"
    subprocess.run([sys.executable, "-m", "cohort.trainer.cli", "run", str(mf), "--local", "--workers",
                    str(workers), "--run-dir", str(tmp / "run"), "--summary-json", str(summary)], check=True,
                   env={**os.environ, "COHORT_FAULT_KILL": f"rank=2,step={kill_step}"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worlds = json.loads(summary.read_text())["worlds"]
    recs = _records(tmp / "run")
    t_kill = next(r["t"] for r in recs if r["msg"] == "fault injection: SIGKILL self")
    after = [w for w in worlds if w["t"] > t_kill]
    full = next(w for w in after if w["size"] == workers)  # the first world of 4 again
    v = full["version"]

    def last(msg: str) -> float:
        return max(r["t"] if "t" in r else _ts(r["ts"]) for r in recs if r["msg"] == msg
                   and r.get("world_version") == v)

    out = {"detect": after[0]["t"] - t_kill}
    if v != after[0]["version"]:  # a replacement, started when the first world without the dead rank was out,
        # admitted once its health endpoint answers (before its trainer has finished starting: the rest of
        # its start-up falls in "rendezvous")
        out["start+imports"] = full["t"] - after[0]["t"]
        resumed_at_3 = max(r["t"] for r in recs if r["msg"] == "first step in world" and r.get("world_version") ==
                           after[0]["version"])
        out["survivors continue"] = resumed_at_3 - t_kill
    formed = last("process group formed")
    joined = last("joined world")
    first = last("first step in world")
    out.update({"rendezvous": formed - full["t"], "data, model, state": joined - formed,
                "first step": first - joined,
                "total": first - t_kill,
                "lost": kill_step - min(r["step"] for r in recs if r["msg"] == "joined world"
                                        and r.get("world_version") == after[0]["version"])})
    return out


def _ts(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=None).timestamp() - time.timezone


def cluster_once(kill_step: int, steps: int, run: int, reports: bool, loader_workers: int = 0) -> tuple[float, int, str]:
    """One job on the local cluster's real nodes (cluster and operator started by hack/ scripts): seconds from
    the kill to the slowest rank's first step of the next world (4 ranks: the spare), steps lost, and what took
    the killed worker out of the world (its peers' report, checked, or its kubelet's). ``reports``: the operator
    acts on survivors' reports (docs/contracts.md §3); off, it is restarted with --ignore-reports."""
    from kubernetes import client, config

    sys.path.insert(0, str(REPO / "hack"))
    import demo  # make demo's helpers: its CRD install
    import podlogs

    args = os.environ.get("COHORT_OPERATOR_ARGS", "--namespace cohort-demo --namespace cohort-bench "
                                                  "--progress-seconds 1 --resync-seconds 10")
    env = {**os.environ, "COHORT_OPERATOR_ARGS": args + ("" if reports else " --ignore-reports")}
    kubeconfig = subprocess.run([str(REPO / "hack/cluster.sh"), "up"], check=True, capture_output=True,
                                text=True, env=env).stdout.strip().splitlines()[-1]
    env["KUBECONFIG"] = kubeconfig
    subprocess.run([str(REPO / "hack/operator.sh"), "down"], check=True, capture_output=True, env=env)
    subprocess.run([str(REPO / "hack/operator.sh"), "up"], check=True, capture_output=True, env=env)
    api = config.new_client_from_config(kubeconfig)
    demo.apply_crds(api)  # as make demo does: the CRD from crds/, created or replaced
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
    job["spec"]["workload"].update({"epochs": 0, "maxSteps": steps, "evalEveryEpochs": 0,
                                    "dataLoaderWorkers": loader_workers})
    job["spec"]["replicas"] = {"min": 2, "max": 6, "target": 4, "spares": 1}
    job["spec"]["checkpoint"] = {"everySteps": 0}
    job["spec"]["podTemplate"] = {"spec": {"containers": [{"name": "trainer", "env": [
        {"name": "COHORT_FAULT_KILL", "value": f"rank=2,step={kill_step}"}]}]}}
    logs = Path(os.environ.get("COHORT_CLUSTER_DIR", Path.home() / ".cache/cohort/cluster")) / "logs/pods"
    # The killed worker's pod is deleted at once: follow the logs while the job runs.
    with podlogs.PodLogs(core, ns, name, logs):
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
    # The slowest rank, the promoted spare included (images older than "first step in world": the survivors).
    first = max(r["t"] for r in records if r["msg"] in ("first step in world", "recovered") and r["t"] > t_kill
                and r.get("world_version") == min(x.get("world_version", 0) for x in records
                                                  if x["msg"] == "joined world" and x["t"] > t_kill))
    resumed = min(r["step"] for r in records if r["msg"] == "joined world" and r["t"] > t_kill)
    killed = next(r["pod"] for r in records if r["msg"] == "fault injection: SIGKILL self")
    events = core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    lost = [e.message for e in events if e.reason == "WorkerLost" and killed in e.message]
    custom.delete_namespaced_custom_object("cohort.dev", "v1alpha1", ns, "trainingjobs", name)
    return first - t_kill, max(0, kill_step - resumed), "report" if any("unreachable" in m for m in lost) else "kubelet"


def torchrun_once(tmp: Path, workers: int, kill_step: int, steps: int, every: int, port: int) -> dict:
    cmd = torchrun_elastic.command(workers, port, 3, "--ckpt-dir", str(tmp), "--every", str(every),
                                   "--kill-step", str(kill_step), "--steps", str(steps))
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return torchrun_elastic.restart_phases(torchrun_elastic.events(tmp), workers)


TORCHFT = Path(os.environ.get("COHORT_TORCHFT", Path.home() / ".cache/cohort/torchft-0.2.0"))
LIGHTHOUSE = """
import sys, time
from torchft._torchft import LighthouseServer
server = LighthouseServer(bind="[::]:0", min_replicas=int(sys.argv[1]))
print(server.address(), flush=True)
time.sleep(3600)
"""


def torchft_once(tmp: Path, workers: int, kill_step: int, steps: int, port: int) -> dict:
    """torchft's fault-tolerant DDP, one replica group per process; the killed replica is restarted at once."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TORCHFT), str(TORCHFT / "deps"), os.environ.get("PYTHONPATH", "")])}
    lighthouse = subprocess.Popen([sys.executable, "-c", LIGHTHOUSE, str(workers - 1)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs: dict[tuple[int, int], subprocess.Popen] = {}
    spawned: dict[tuple[int, int], float] = {}
    try:
        assert lighthouse.stdout is not None
        address = lighthouse.stdout.readline().strip()

        def spawn(replica: int, incarnation: int) -> None:
            out = open(tmp / f"r{replica}-{incarnation}.log", "w")  # noqa: SIM115 - the child's stdout
            spawned[replica, incarnation] = time.time()
            procs[replica, incarnation] = subprocess.Popen(
                [sys.executable, str(REPO / "bench/torchft_worker.py"), "--replica", str(replica), "--incarnation",
                 str(incarnation), "--lighthouse", address, "--store-port", str(port + 10 * incarnation + replica),
                 "--replicas", str(workers), "--kill-step", str(kill_step), "--steps", str(steps)],
                env=env, stdout=out, stderr=subprocess.STDOUT)
            out.close()
        for r in range(workers):
            spawn(r, 0)
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in procs.values()):
            victim = procs.get((2, 0))
            if victim is not None and victim.poll() is not None and (2, 1) not in procs:
                spawn(2, 1)  # the scheduler's part: torchft leaves restarts to it
            if time.monotonic() > deadline:
                raise TimeoutError(f"torchft run did not finish; logs in {tmp}")
            time.sleep(0.05)
        failed = {k: p.returncode for k, p in procs.items() if p.returncode != 0 and k != (2, 0)}
        assert not failed, f"torchft replicas failed: {failed}; logs in {tmp}"
    finally:
        for p in [*procs.values(), lighthouse]:
            if p.poll() is None:
                p.kill()
                p.wait()
    events = []
    for log in tmp.glob("r*.log"):
        events += [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    kill = next(e for e in events if e["event"] == "kill")
    new = [e for e in events if e["incarnation"] == 1]
    imported = next(e["t"] for e in new if e["event"] == "imported")
    built = next(e["t"] for e in new if e["event"] == "manager")
    loaded = next(e["t"] for e in new if e["event"] == "loaded")
    full = [e for e in events if e["event"] == "step" and e["t"] > kill["t"] and e["participants"] == workers
            and e["committed"]]
    firsts = {}
    for e in sorted(full, key=lambda e: e["t"]):
        firsts.setdefault((e["replica"], e["incarnation"]), e["t"])
    assert len(firsts) == workers, (firsts, tmp)
    first = max(firsts.values())
    survivors = [e for e in events if e["event"] == "step" and e["t"] > kill["t"] and e["incarnation"] == 0
                 and e["participants"] < workers]
    at3 = {}
    for e in sorted((e for e in survivors if e["committed"]), key=lambda e: e["t"]):
        at3.setdefault(e["replica"], e["t"])
    lost = sum(1 for e in survivors if not e["committed"]) / max(1, workers - 1)
    # torchft's quorum and its peer-to-peer state transfer happen together (the heal): both in "rendezvous".
    out = {"detect": spawned[2, 1] - kill["t"], "start+imports": imported - spawned[2, 1],
           "data, model, state": built - imported, "rendezvous": loaded - built, "first step": first - loaded,
           "total": first - kill["t"], "lost": lost}
    if at3:
        out["survivors continue"] = max(at3.values()) - kill["t"]
    return out


def cell(values: list[float], fmt: str = ".3f") -> str:
    if not values:
        return "—"
    return f"{statistics.fmean(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--every", default="1,10,50", help="torchrun checkpoint intervals K (steps)")
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1200, help="long enough for a replacement to start and join")
    ap.add_argument("--no-cluster", action="store_true", help="skip the run on the local Kubernetes cluster")
    ap.add_argument("--systems", default="", help="only the systems whose names contain one of these (comma list)")
    ap.add_argument("--loader-workers", type=int, default=0,
                    help="Cohort's workload.dataLoaderWorkers (the others fetch in their training process)")
    args = ap.parse_args()
    started = host()
    systems = ["Cohort, spare", "Cohort, replacement"] + [f"torchrun, K={k}" for k in args.every.split(",")]
    if (TORCHFT / "torchft").is_dir():
        systems.append("torchft 0.2.0")
    else:
        print(f"torchft not measured: no {TORCHFT}/torchft (hack/torchft.sh installs it)", file=sys.stderr)
    if args.systems:
        systems = [n for n in systems if any(part in n for part in args.systems.split(","))]
    results: dict[str, list[dict]] = {name: [] for name in systems}
    cluster_rows = []
    for i in range(args.kills):
        s = 110 + 7 * i
        for name in systems:
            with tempfile.TemporaryDirectory() as d:
                if name == "Cohort, spare":
                    r = cohort_once(Path(d), args.workers, s, args.steps, spares=1, loader_workers=args.loader_workers)
                elif name == "Cohort, replacement":
                    r = cohort_once(Path(d), args.workers, s, args.steps, spares=0, loader_workers=args.loader_workers)
                elif name.startswith("torchft"):
                    r = torchft_once(Path(d), args.workers, s, args.steps, 29700 + 40 * i)
                else:
                    r = torchrun_once(Path(d), args.workers, s, args.steps, int(name.split("=")[1]), 29850 + i)
            results[name].append(r)
            print(f"kill {i + 1}/{args.kills} at step {s}: {name}: {r['total']:.3f} s, {r['lost']} lost",
                  file=sys.stderr, flush=True)
        if not args.no_cluster:
            for reports in (True, False):  # interleaved, so both see the same host
                cluster_rows.append((s, reports, *cluster_once(s, max(args.steps, 3 * s), i, reports,
                                                                 args.loader_workers)))
    loaders = f", Cohort's loader with {args.loader_workers} worker processes per rank" if args.loader_workers else ""
    print(f"{args.workers} ranks, MLP on digits{loaders}, gloo/CPU; {args.kills} kills (rank 2, SIGKILL, steps "
          f"{', '.join(str(110 + 7 * i) for i in range(args.kills))}); started {started}; ended {host()}")
    print("Every system ends back at 4 ranks; each cell: mean [min-max] over the kills, seconds.\n")
    print("| system | kill → slowest rank's first step at 4 ranks | steps lost | " + " | ".join(PHASES)
          + " | survivors train again at 3 |")
    print("|---|---|---|" + "---|" * len(PHASES) + "---|")
    for name in systems:
        rs = results[name]
        print(f"| {name} | **{cell([r['total'] for r in rs])}** | {cell([r['lost'] for r in rs], '.1f')} | "
              + " | ".join(cell([r[p] for r in rs if p in r]) for p in PHASES)
              + f" | {cell([r['survivors continue'] for r in rs if 'survivors continue' in r])} |")
    if "Cohort, spare" in results:
        spare = statistics.fmean(r["total"] for r in results["Cohort, spare"])
        print("\nCohort (spare) against the others: " + ", ".join(
            f"{n}: {spare / statistics.fmean(r['total'] for r in results[n]):.3f}x"
            for n in systems if not n.startswith("Cohort")))
    if cluster_rows:
        print("\nOn the local Kubernetes cluster (operator, real nodes: containers, 4 workers + 1 spare "
              "promoted at once; kill → slowest rank's first step of the new world):")
        print("| kill at step | operator | recovery (s) | steps lost | the killed worker left on |")
        print("|---|---|---|---|---|")
        for s, reports, secs, lost, cause in cluster_rows:
            print(f"| {s} | {'reports' if reports else '--ignore-reports'} | {secs:.3f} | {lost} | {cause} |")
        for reports in (True, False):
            rows = [r for r in cluster_rows if r[1] == reports]
            print(f"| mean | {'reports' if reports else '--ignore-reports'} | "
                  f"**{cell([r[2] for r in rows])}** | {statistics.mean(r[3] for r in rows):.1f} | |")


if __name__ == "__main__":
    main()
