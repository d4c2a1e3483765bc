#!/usr/bin/env bash
# Kueue (queues, quotas, priorities, preemption), built from the Go module
# proxy (hack/build-binaries.sh kueue) and run as a process on this machine
# against the local cluster, as its release would run it in kueue-system:
# its own CRDs, its webhooks (served on 127.0.0.1 with a certificate from the
# cluster CA, so the API server reaches them), and its own RBAC role.
#
#   hack/kueue.sh up       start (or reuse) it
#   hack/kueue.sh restart  stop it and start it again (a new configuration)
#   hack/kueue.sh down     stop it (by PID)
#   hack/kueue.sh status   exit 0 if it is ready
#
# TrainingJobs make their own Workloads (operator/src/cohort/operator/kueue.py),
# so no job integration is needed; Kueue insists on one and gets batch/job,
# without its webhook (only Kueue's own kinds have webhooks here). Partial
# admission (beta) is on by default. Kueue reads its metrics certificate from a
# fixed path, /etc/kueue/metrics/certs: it runs in a private mount namespace
# whose /etc is an overlay holding that path (this machine's /etc is unchanged). Its pid file is in $COHORT_CLUSTER_DIR/pids,
# so `hack/cluster.sh down` stops it too. State (config, certificates,
# kubeconfig): $COHORT_CLUSTER_DIR/kueue. Its log: $COHORT_CLUSTER_DIR/logs/kueue.log.
#
# waitForPodsReady is on, as a platform team running synchronous training would
# set it: an admitted Workload that is not PodsReady within
# COHORT_KUEUE_PODS_READY_TIMEOUT (5m) of its admission, or of losing its
# readiness, is evicted and requeued (the operator sets PodsReady, docs/kueue.md).
#
# Environment: COHORT_KUEUE_WEBHOOK_PORT (19443), COHORT_KUEUE_HEALTH_PORT (19081),
# COHORT_KUEUE_METRICS_PORT (19444), COHORT_KUEUE_PODS_READY_TIMEOUT (5m).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${COHORT_CLUSTER_DIR:-$COHORT_CACHE/cluster}
PIDS="$CLUSTER_DIR/pids" LOGS="$CLUSTER_DIR/logs"
PIDFILE="$PIDS/kueue.pid"
STATE="$CLUSTER_DIR/kueue"
PKI="$CLUSTER_DIR/pki"
WEBHOOK_PORT=${COHORT_KUEUE_WEBHOOK_PORT:-19443}
HEALTH_PORT=${COHORT_KUEUE_HEALTH_PORT:-19081}
METRICS_PORT=${COHORT_KUEUE_METRICS_PORT:-19444}
PODS_READY_TIMEOUT=${COHORT_KUEUE_PODS_READY_TIMEOUT:-5m}
KUEUE_DIR="$BIN_CACHE/kueue-$KUEUE_VERSION"
KUBECTL=("$BIN_CACHE/kubernetes-$K8S_VERSION/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig")

ready() { curl -sf "http://127.0.0.1:$HEALTH_PORT/readyz" >/dev/null; }
healthy() { pid_alive "$PIDFILE" && ready; }

render() {  # config, serving certificate, identity, CRDs and webhook configurations
  local py; py="$("$HACK_DIR/venv.sh")/bin/python"
  mkdir -p "$STATE/certs"
  [[ -f $PKI/kueue-webhook.crt ]] || sign_cert kueue-webhook "/CN=kueue-webhook" "IP:127.0.0.1"
  cp "$PKI/kueue-webhook.crt" "$STATE/certs/tls.crt"; cp "$PKI/kueue-webhook.key" "$STATE/certs/tls.key"
  local_user kueue "$STATE/kubeconfig" "$("$py" "$HACK_DIR/kueue_manifests.py" rules "$KUEUE_DIR/config")"
  # Kueue's namespace, and its Role there (its release's manager-secrets-role): it watches Secrets in it.
  "${KUBECTL[@]}" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: kueue-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: "cohort:kueue-secrets", namespace: kueue-system}
rules:
- {apiGroups: [""], resources: [secrets], verbs: [get, list, update, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: "cohort:kueue-secrets", namespace: kueue-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: "cohort:kueue-secrets"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "cohort:kueue"}
YAML
  # Server-side: Kueue's CRDs are larger than client-side apply's annotation allows.
  "$py" "$HACK_DIR/kueue_manifests.py" crds "$KUEUE_DIR/config" "https://127.0.0.1:$WEBHOOK_PORT" "$PKI/ca.crt" \
    | "${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager cohort-hack -f - >/dev/null
  # Kueue maps its kinds once at start-up: on a new cluster its CRDs must be served before it starts.
  "${KUBECTL[@]}" wait --for=condition=Established --timeout=60s \
    $("${KUBECTL[@]}" get crd -o name | grep '\.kueue\.x-k8s\.io$') >/dev/null
  local i
  for ((i = 0; i < 150; i++)); do
    "${KUBECTL[@]}" get --raw /apis/kueue.x-k8s.io/v1beta2 2>/dev/null | grep -q '"name":"workloads"' && break
    sleep 0.2
  done
  "$py" "$HACK_DIR/kueue_manifests.py" webhooks "$KUEUE_DIR/config" "https://127.0.0.1:$WEBHOOK_PORT" "$PKI/ca.crt" \
    | "${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager cohort-hack -f - >/dev/null
  cat > "$STATE/config.yaml" <<YAML
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:$HEALTH_PORT
metrics:
  bindAddress: 127.0.0.1:$METRICS_PORT
webhook:
  host: 127.0.0.1
  port: $WEBHOOK_PORT
  certDir: $STATE/certs
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
waitForPodsReady:
  timeout: $PODS_READY_TIMEOUT
  blockAdmission: false
  requeuingStrategy:
    timestamp: Eviction
    backoffBaseSeconds: 1
    backoffMaxSeconds: 10
integrations:
  frameworks: [batch/job]
# Kueue's on-demand visibility API is an aggregated API server with its own
# certificate and APIService; pending workloads are read from the Workloads here.
# ElasticJobsViaWorkloadSlices (alpha) lets a TrainingJob follow its quota in place:
# an admitted Workload may shrink, and a bigger one may replace it (docs/kueue.md).
featureGates:
  VisibilityOnDemand: false
  ElasticJobsViaWorkloadSlices: true
YAML
}

up() {
  if healthy; then log "reusing the running Kueue (pid $(cat "$PIDFILE"))"; return 0; fi
  "$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || die "the local cluster is not running: hack/cluster.sh up"
  stop_pidfile "$PIDFILE" 2>/dev/null || true
  ready && die "port $HEALTH_PORT is taken by another process (set COHORT_KUEUE_HEALTH_PORT)"
  "$HACK_DIR/build-binaries.sh" kueue >&2
  log "applying Kueue $KUEUE_VERSION's CRDs, webhooks and RBAC"
  render
  mkdir -p "$PIDS" "$LOGS"
  : > "$LOGS/kueue.log"
  local cmd=("$KUEUE_DIR/kueue" --config "$STATE/config.yaml")
  KUBECONFIG="$STATE/kubeconfig" start_recorded "$PIDFILE" "$LOGS/kueue.log" \
    unshare --mount --propagation private -- "$HACK_DIR/kueue.sh" exec-in-namespace "${cmd[@]}"
  printf '%s ' "${cmd[@]}" > "$PIDFILE.cmd"  # what runs once the wrapper has exec'd
  local rc=0
  poll_ready 120 "$PIDFILE" ready || rc=$?
  if [[ $rc == 0 ]]; then
    log "Kueue $KUEUE_VERSION up (pid $(cat "$PIDFILE")); webhooks at https://127.0.0.1:$WEBHOOK_PORT"
    return 0
  fi
  printf 'error: Kueue did not become ready (%s); the end of %s:\n' \
    "$([[ $rc == 1 ]] && echo exited || echo 'timed out after 120 s')" "$LOGS/kueue.log" >&2
  tail -n 20 "$LOGS/kueue.log" | sed 's/^/    /' >&2
  down
  exit 1
}

down() {
  stop_pidfile "$PIDFILE"
}

exec_in_namespace() {  # cmd...: in the private mount namespace, give /etc/kueue/metrics/certs, exec cmd
  local ovl="$STATE/etc-overlay"
  mkdir -p "$ovl"
  mount -t tmpfs tmpfs "$ovl"  # overlayfs wants its upper dir on a plain filesystem
  mkdir -p "$ovl/upper" "$ovl/work"
  mount -t overlay overlay -o "lowerdir=/etc,upperdir=$ovl/upper,workdir=$ovl/work" /etc
  mkdir -p /etc/kueue/metrics
  ln -sfn "$STATE/certs" /etc/kueue/metrics/certs
  exec "$@"
}

case ${1:-} in
  up) up ;;
  restart) down 2>/dev/null || true; up ;;
  exec-in-namespace) shift; exec_in_namespace "$@" ;;
  down) down ;;
  status) healthy && echo "healthy" || { echo "not running"; exit 1; } ;;
  *) echo "usage: $0 up|restart|down|status" >&2; exit 2 ;;
esac
