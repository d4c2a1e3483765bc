#!/usr/bin/env bash
# A development operator: `cohort-operator` as a local process against the local
# cluster (admin credentials, single replica). The Helm chart runs it in-cluster instead.
#
#   hack/operator.sh up      start (or reuse) it; log: $COHORT_CLUSTER_DIR/logs/operator.log
#   hack/operator.sh down    stop it (by PID)
#   hack/operator.sh status  exit 0 if it answers /healthz
#
# Ports: COHORT_OPERATOR_METRICS_PORT (default 18080), COHORT_OPERATOR_HEALTH_PORT (18081).
# Extra flags for cohort-operator: COHORT_OPERATOR_ARGS (e.g. "--progress-seconds 1").
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${COHORT_CLUSTER_DIR:-$COHORT_CACHE/cluster}
PIDS="$CLUSTER_DIR/pids" LOGS="$CLUSTER_DIR/logs"
PIDFILE="$PIDS/operator.pid"
METRICS_PORT=${COHORT_OPERATOR_METRICS_PORT:-18080}
HEALTH_PORT=${COHORT_OPERATOR_HEALTH_PORT:-18081}

healthy() { pid_alive "$PIDFILE" && curl -sf "http://127.0.0.1:$HEALTH_PORT/healthz" >/dev/null; }

up() {
  if healthy; then log "reusing the running operator (pid $(cat "$PIDFILE"))"; return 0; fi
  "$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || die "the local cluster is not running: hack/cluster.sh up"
  stop_pidfile "$PIDFILE" 2>/dev/null || true
  local venv; venv=$("$HACK_DIR/venv.sh")
  mkdir -p "$PIDS" "$LOGS"
  # shellcheck disable=SC2086 # COHORT_OPERATOR_ARGS is a list of flags
  KUBECONFIG="$CLUSTER_DIR/kubeconfig" start_recorded "$PIDFILE" "$LOGS/operator.log" \
    "$venv/bin/cohort-operator" --standalone --metrics-port "$METRICS_PORT" --health-port "$HEALTH_PORT" \
    ${COHORT_OPERATOR_ARGS:-}
  local i
  for ((i = 0; i < 150; i++)); do
    curl -sf "http://127.0.0.1:$HEALTH_PORT/healthz" >/dev/null && { log "operator up (pid $(cat "$PIDFILE"), metrics :$METRICS_PORT)"; return 0; }
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break
    sleep 0.2
  done
  printf 'error: the operator did not start; the end of %s:\n' "$LOGS/operator.log" >&2
  tail -n 20 "$LOGS/operator.log" | sed 's/^/    /' >&2
  stop_pidfile "$PIDFILE"
  exit 1
}

case ${1:-} in
  up) up ;;
  down) stop_pidfile "$PIDFILE" ;;
  status) healthy && echo healthy || { echo "not running"; exit 1; } ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
