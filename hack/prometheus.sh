#!/usr/bin/env bash
# A real Prometheus (3.16, built from the Go module proxy with only its
# Kubernetes service discovery: hack/build-binaries.sh) that scrapes the
# operator and the workers on the local cluster, as a user's Prometheus would.
#
#   hack/prometheus.sh up       start (or reuse) it; prints its URL
#   hack/prometheus.sh down     stop it (by PID)
#   hack/prometheus.sh status   exit 0 if it answers /-/ready
#   hack/prometheus.sh reload   re-render config and rules, and reload them
#   hack/prometheus.sh url      print its URL
#
# Targets come from kubernetes_sd_configs (hack/prometheus.yml.tmpl): worker
# pods (label cohort.dev/role=worker, port "metrics") and operator pods
# installed with the chart, on the real nodes; plus the dev operator
# (hack/operator.sh) at 127.0.0.1:$COHORT_OPERATOR_METRICS_PORT. Prometheus
# watches pods with its own identity, cohort:prometheus (a client certificate
# from the cluster CA), which may only get, list and watch pods and nodes.
# It runs on this machine, outside the pods' network: NetworkPolicy admits it
# as node-local traffic (hack/nodes.sh). The alert rules are the chart's
# (helm/cohort/rules/alerts.yaml, with the chart's default thresholds). Its pid
# file is in $COHORT_CLUSTER_DIR/pids, so `hack/cluster.sh down` stops it too.
# State (config, rules, kubeconfig, TSDB): $COHORT_CLUSTER_DIR/prometheus.
#
# Environment: COHORT_PROMETHEUS_PORT (19090), COHORT_PROMETHEUS_SCRAPE_INTERVAL (2s).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${COHORT_CLUSTER_DIR:-$COHORT_CACHE/cluster}
PIDS="$CLUSTER_DIR/pids" LOGS="$CLUSTER_DIR/logs"
PIDFILE="$PIDS/prometheus.pid"
STATE="$CLUSTER_DIR/prometheus"
PORT=${COHORT_PROMETHEUS_PORT:-19090}
INTERVAL=${COHORT_PROMETHEUS_SCRAPE_INTERVAL:-2s}
PKI="$CLUSTER_DIR/pki"
PROM_DIR="$BIN_CACHE/prometheus-$PROMETHEUS_VERSION"
PROMETHEUS="$PROM_DIR/prometheus"
KUBECTL=("$BIN_CACHE/kubernetes-$K8S_VERSION/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig")
URL="http://127.0.0.1:$PORT"

ready() { curl -sf "$URL/-/ready" >/dev/null; }
healthy() { pid_alive "$PIDFILE" && ready; }

identity() {  # cohort:prometheus, with a kubeconfig in $STATE
  mkdir -p "$STATE"
  local_user prometheus "$STATE/kubeconfig" '- apiGroups: [""]
  resources: [pods, nodes]
  verbs: [get, list, watch]'
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
      -e "s|@KUBECONFIG@|$STATE/kubeconfig|g" -e "s|@DEV_OPERATOR_PORT@|${COHORT_OPERATOR_METRICS_PORT:-18080}|g" \
      "$HACK_DIR/prometheus.yml.tmpl" > "$STATE/prometheus.yml"
  "$PROM_DIR/promtool" check config "$STATE/prometheus.yml" >&2 \
    || die "the rendered $STATE/prometheus.yml is invalid"
}

up() {
  if healthy; then log "reusing the running Prometheus (pid $(cat "$PIDFILE")) at $URL"; echo "$URL"; return 0; fi
  "$HACK_DIR/cluster.sh" status >/dev/null 2>&1 || die "the local cluster is not running: hack/cluster.sh up"
  stop_pidfile "$PIDFILE" 2>/dev/null || true
  ready && die "port $PORT is taken by another process (set COHORT_PROMETHEUS_PORT)"
  "$HACK_DIR/build-binaries.sh" prometheus >&2
  identity
  render
  mkdir -p "$PIDS" "$LOGS" "$STATE/data"
  : > "$LOGS/prometheus.log"
  local i
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
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) healthy && echo "healthy ($URL)" || { echo "not running"; exit 1; } ;;
  reload) healthy || die "Prometheus is not running"; render; curl -sf -X POST "$URL/-/reload" && log "reloaded" ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 up|down|status|reload|url" >&2; exit 2 ;;
esac
