#!/usr/bin/env bash
# A real Prometheus (Debian's package, unpacked into the cache: no root, no
# system install) that scrapes the operator and the workers on the local cluster.
#
#   hack/prometheus.sh up       start (or reuse) it; prints its URL
#   hack/prometheus.sh down     stop it (by PID)
#   hack/prometheus.sh status   exit 0 if it answers /-/ready
#   hack/prometheus.sh reload   re-render config and rules, and reload them
#   hack/prometheus.sh url      print its URL
#
# Targets come from the local API server: worker pods (label cohort.dev/role=worker,
# port "metrics"), operator pods installed with the chart, and the dev operator
# (hack/operator.sh) at 127.0.0.1:$COHORT_OPERATOR_METRICS_PORT. Debian builds
# Prometheus without the Kubernetes service discovery, so a small discovery
# process (written below, run from the project venv with the admin kubeconfig)
# watches those pods and writes file_sd target files. The alert rules are the
# chart's (helm/cohort/rules/alerts.yaml, with the chart's default thresholds).
# Both processes have pid files in $COHORT_CLUSTER_DIR/pids, so `hack/cluster.sh
# down` stops them too. State (config, rules, targets, TSDB): $COHORT_CLUSTER_DIR/prometheus.
#
# Environment: COHORT_PROMETHEUS_PORT (19090), COHORT_PROMETHEUS_SCRAPE_INTERVAL (2s),
# COHORT_PROMETHEUS_DEB_VERSION (the pinned Debian package version below).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${COHORT_CLUSTER_DIR:-$COHORT_CACHE/cluster}
PIDS="$CLUSTER_DIR/pids" LOGS="$CLUSTER_DIR/logs"
PIDFILE="$PIDS/prometheus.pid"
SD_PIDFILE="$PIDS/prometheus-discovery.pid"
STATE="$CLUSTER_DIR/prometheus"
PORT=${COHORT_PROMETHEUS_PORT:-19090}
INTERVAL=${COHORT_PROMETHEUS_SCRAPE_INTERVAL:-2s}
DEB_VERSION=${COHORT_PROMETHEUS_DEB_VERSION:-2.42.0+ds-5+deb12u1}
PROM_DIR="$COHORT_CACHE/prometheus-$DEB_VERSION"
PROMETHEUS="$PROM_DIR/root/usr/bin/prometheus"
URL="http://127.0.0.1:$PORT"

ready() { curl -sf "$URL/-/ready" >/dev/null; }
healthy() { pid_alive "$PIDFILE" && pid_alive "$SD_PIDFILE" && ready; }

install() {  # download the pinned .deb once and unpack it into the cache
  [[ -x $PROMETHEUS ]] && return 0
  command -v apt-get >/dev/null || die "apt-get not found: install Prometheus $DEB_VERSION and put it at $PROMETHEUS"
  log "fetching Debian's prometheus $DEB_VERSION into $PROM_DIR"
  local tmp; tmp=$(mktemp -d "$COHORT_CACHE/prometheus-dl.XXXXXX")
  # apt-get download writes into the current directory; unsandboxed is fine for a download.
  (cd "$tmp" && apt-get download -q "prometheus=$DEB_VERSION" >&2) \
    || { rm -rf "$tmp"; die "apt-get download prometheus=$DEB_VERSION failed (apt-get update? other version: COHORT_PROMETHEUS_DEB_VERSION)"; }
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
  "$tmp/root/usr/bin/prometheus" --version >/dev/null || { rm -rf "$tmp"; die "the unpacked prometheus does not run"; }
  rm -rf "$PROM_DIR"
  mkdir -p "$PROM_DIR"
  mv "$tmp/root" "$PROM_DIR/root"
  rm -rf "$tmp"
}

render() {  # the config and the rules file, into $STATE
  local venv helm
  venv=$("$HACK_DIR/venv.sh")
  helm="$BIN_CACHE/helm-$HELM_VERSION/helm"
  [[ -x $helm ]] || die "helm not found at $helm: hack/build-binaries.sh"
  mkdir -p "$STATE"
  # The chart's PrometheusRule, rendered as a plain rule file.
  "$helm" template cohort "$REPO_ROOT/helm/cohort" --show-only templates/prometheusrule.yaml \
      --api-versions monitoring.coreos.com/v1/PrometheusRule \
    | "$venv/bin/python" -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(sys.stdin)["spec"], sys.stdout, sort_keys=False)' \
    > "$STATE/rules.yml.tmp"
  mv "$STATE/rules.yml.tmp" "$STATE/rules.yml"
  sed -e "s|@SCRAPE_INTERVAL@|$INTERVAL|g" -e "s|@RULES_FILE@|$STATE/rules.yml|g" \
      -e "s|@TARGETS_DIR@|$STATE/targets|g" -e "s|@DEV_OPERATOR_PORT@|${COHORT_OPERATOR_METRICS_PORT:-18080}|g" \
      "$HACK_DIR/prometheus.yml.tmpl" > "$STATE/prometheus.yml"
  write_discovery > "$STATE/discover.py"
  mkdir -p "$STATE/targets"
  local kind
  for kind in workers operators; do [[ -f $STATE/targets/$kind.json ]] || echo '[]' > "$STATE/targets/$kind.json"; done
  "$PROM_DIR/root/usr/bin/promtool" check config "$STATE/prometheus.yml" >&2 \
    || die "the rendered $STATE/prometheus.yml is invalid"
}

write_discovery() {  # the file_sd discovery process (Python, project venv)
  cat <<'PY'
"""file_sd targets for the local Prometheus, from pod watches (written by hack/prometheus.sh).

Each kind of target is a label selector; a pod is a target while it is
Running with an IP of the real nodes' pod network (10.88.0.0/16) -- kwok pods
have no process behind their address -- and has a container port named "metrics". Every change
rewrites <dir>/<kind>.json atomically; Prometheus picks it up at once.
"""
import json, os, sys, threading, time
from kubernetes import client, config, watch

KINDS = {"workers": "cohort.dev/role=worker",
         "operators": "app.kubernetes.io/name=cohort,app.kubernetes.io/component=operator"}
out_dir, kubeconfig = sys.argv[1], sys.argv[2]
core = client.CoreV1Api(config.new_client_from_config(kubeconfig))
lock = threading.Lock()


def target(pod):
    ip = pod.status.pod_ip or ""
    if pod.status.phase != "Running" or not ip.startswith("10.88.") or pod.metadata.deletion_timestamp:
        return None
    for c in pod.spec.containers:
        for port in c.ports or []:
            if port.name == "metrics":
                labels = {"namespace": pod.metadata.namespace, "pod": pod.metadata.name}
                job = (pod.metadata.labels or {}).get("cohort.dev/job")
                if job:
                    labels["trainingjob"] = job
                return {"targets": [f"{ip}:{port.container_port}"], "labels": labels}
    return None


def write(kind, pods):
    groups = sorted((t for t in pods.values() if t), key=lambda t: t["targets"][0])
    path = os.path.join(out_dir, f"{kind}.json")
    with lock:
        with open(path + ".tmp", "w") as f:
            json.dump(groups, f, indent=1)
        os.replace(path + ".tmp", path)


def follow(kind, selector):
    while True:
        try:
            listed = core.list_pod_for_all_namespaces(label_selector=selector, _request_timeout=30)
            pods = {p.metadata.uid: target(p) for p in listed.items}
            write(kind, pods)
            stream = watch.Watch().stream(core.list_pod_for_all_namespaces, label_selector=selector,
                                          resource_version=listed.metadata.resource_version,
                                          timeout_seconds=300, _request_timeout=330)
            for event in stream:
                pod = event["object"]
                before = pods.get(pod.metadata.uid)
                pods[pod.metadata.uid] = None if event["type"] == "DELETED" else target(pod)
                if pods[pod.metadata.uid] != before:
                    write(kind, pods)
        except Exception as e:  # API server restarts, expired resourceVersions: list again
            print(f"discovery {kind}: {e}", file=sys.stderr, flush=True)
            time.sleep(2)


os.makedirs(out_dir, exist_ok=True)
for kind, selector in KINDS.items():
    threading.Thread(target=follow, args=(kind, selector), daemon=True).start()
while True:
    time.sleep(3600)
PY
}

up() {
  if healthy; then log "reusing the running Prometheus (pid $(cat "$PIDFILE")) at $URL"; echo "$URL"; return 0; fi
  "$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || die "the local cluster is not running: hack/cluster.sh up"
  stop_pidfile "$PIDFILE" 2>/dev/null || true
  stop_pidfile "$SD_PIDFILE" 2>/dev/null || true
  ready && die "port $PORT is taken by another process (set COHORT_PROMETHEUS_PORT)"
  install
  render
  mkdir -p "$PIDS" "$LOGS" "$STATE/data" "$STATE/targets"
  : > "$LOGS/prometheus.log"
  local i venv; venv=$("$HACK_DIR/venv.sh")
  : > "$LOGS/prometheus-discovery.log"
  start_recorded "$SD_PIDFILE" "$LOGS/prometheus-discovery.log" "$venv/bin/python" "$STATE/discover.py" \
    "$STATE/targets" "$CLUSTER_DIR/kubeconfig"
  start_recorded "$PIDFILE" "$LOGS/prometheus.log" "$PROMETHEUS" \
    --config.file="$STATE/prometheus.yml" --storage.tsdb.path="$STATE/data" \
    --storage.tsdb.retention.time=1d --web.listen-address="127.0.0.1:$PORT" \
    --web.enable-lifecycle --log.level=warn
  for ((i = 0; i < 150; i++)); do
    ready && { log "Prometheus up (pid $(cat "$PIDFILE")) at $URL; scrape interval $INTERVAL"; echo "$URL"; return 0; }
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
    sleep 0.2
  done
  printf 'error: Prometheus did not start; the end of %s:\n' "$LOGS/prometheus.log" >&2
  tail -n 20 "$LOGS/prometheus.log" | sed 's/^/    /' >&2
  down
  exit 1
}

down() {
  stop_pidfile "$PIDFILE"
  stop_pidfile "$SD_PIDFILE"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) healthy && echo "healthy ($URL)" || { echo "not running"; exit 1; } ;;
  reload) healthy || die "Prometheus is not running"; install; render; curl -sf -X POST "$URL/-/reload" && log "reloaded" ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 up|down|status|reload|url" >&2; exit 2 ;;
esac
