#!/usr/bin/env bash
# The local Kubernetes cluster: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and the kwok controller as plain processes on loopback, plus
# COHORT_REAL_NODES (default 2) real nodes: kubelet + containerd + runc + CNI,
# and kube-proxy (hack/nodes.sh; needs root). COHORT_REAL_NODES=0 starts only
# the plane and the kwok nodes.
#
#   hack/cluster.sh up       start (or reuse a healthy running) cluster; prints the kubeconfig path
#   hack/cluster.sh down     stop every process hack/ started for this cluster, by PID
#   hack/cluster.sh status   exit 0 if the cluster is healthy
#   hack/cluster.sh env      print `export KUBECONFIG=...` for eval
#
# State lives in $COHORT_CLUSTER_DIR (default ~/.cache/cohort/cluster): pki/, logs/,
# pids/, etcd/, and the admin kubeconfig at $COHORT_CLUSTER_DIR/kubeconfig.
# Ports (override by env): COHORT_APISERVER_PORT=16443, COHORT_ETCD_PORT=12379
# (+1 for peers), COHORT_KCM_PORT=10357, COHORT_SCHEDULER_PORT=10359, COHORT_KWOK_PORT=10347.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${COHORT_CLUSTER_DIR:-$COHORT_CACHE/cluster}
APISERVER_PORT=${COHORT_APISERVER_PORT:-16443}
ETCD_PORT=${COHORT_ETCD_PORT:-12379}
KCM_PORT=${COHORT_KCM_PORT:-10357}
SCHEDULER_PORT=${COHORT_SCHEDULER_PORT:-10359}
KWOK_PORT=${COHORT_KWOK_PORT:-10347}
KWOK_NODES=${COHORT_KWOK_NODES:-2}
KWOK_NODE_GPUS=${COHORT_KWOK_NODE_GPUS:-8}
API_IP=10.87.0.1  # where pods reach the API server (hack/nodes.sh makes the interface)
# kwok's pods take addresses here, made local to this machine (as root, kwok_route): nothing listens on them, so
# a connection is refused at once, and a test can listen on one to play a live worker
# (tests/integration/test_survivor_reports.py). Elsewhere (kwok's default) a connection would only time out.
KWOK_POD_CIDR=${COHORT_KWOK_POD_CIDR:-10.89.0.0/16}
K8S_BIN="$BIN_CACHE/kubernetes-$K8S_VERSION"
ETCD_BIN="$BIN_CACHE/etcd-$ETCD_VERSION/etcd"
KWOK_BIN="$BIN_CACHE/kwok-$KWOK_VERSION/kwok"
PKI="$CLUSTER_DIR/pki" LOGS="$CLUSTER_DIR/logs" PIDS="$CLUSTER_DIR/pids"
KUBECONFIG_PATH="$CLUSTER_DIR/kubeconfig"
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH")
# Start order; `down` stops in reverse. Other hack/ tools (real nodes,
# Prometheus, a dev operator) add their own pid files to $PIDS.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

healthy() {
  [[ -f $KUBECONFIG_PATH ]] || return 1
  local c; for c in "${COMPONENTS[@]}"; do pid_alive "$PIDS/$c.pid" || return 1; done
  [[ $REAL_NODES == 0 ]] || "$HACK_DIR/nodes.sh" status >/dev/null || return 1
  "${KUBECTL[@]}" get --raw /readyz >/dev/null 2>&1
}

start() {  # name cmd... : background it, record pid + command line, log to $LOGS/name.log
  local name=$1; shift
  : > "$LOGS/$name.log"
  start_recorded "$PIDS/$name.pid" "$LOGS/$name.log" "$@"
}

fail_component() {  # name reason
  printf 'error: cluster-up: %s %s; its log: %s\n' "$1" "$2" "$LOGS/$1.log" >&2
  [[ -f $LOGS/$1.log ]] && tail -n 15 "$LOGS/$1.log" | sed 's/^/    /' >&2
  down_all >/dev/null 2>&1 || true
  exit 1
}

wait_for() {  # name timeout_s command...
  local name=$1 timeout=$2 rc=0; shift 2
  poll_ready "$timeout" "$PIDS/$name.pid" "$@" || rc=$?
  case $rc in
    0) ;;
    1) fail_component "$name" "exited during start-up" ;;
    *) fail_component "$name" "did not become ready within ${timeout}s" ;;
  esac
}

gen_pki() {
  [[ -f $PKI/done && -f $PKI/apiserver-kubelet-client.crt ]] && return 0
  rm -rf "$PKI"
  log "generating certificates in $PKI"
  mkdir -p "$PKI"; cd "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=cohort-local-ca" 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  sign_cert apiserver "/CN=kube-apiserver" \
    "IP:127.0.0.1,IP:10.96.0.1,IP:$API_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  sign_cert admin "/O=system:masters/CN=cohort-admin"
  sign_cert controller-manager "/CN=system:kube-controller-manager"
  sign_cert scheduler "/CN=system:kube-scheduler"
  sign_cert kwok "/O=system:masters/CN=kwok-controller"
  sign_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  touch done
  cd - >/dev/null
}

create_kwok_nodes() {
  local i
  for ((i = 0; i < KWOK_NODES; i++)); do
    cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    kubernetes.io/hostname: kwok-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    cohort.dev/node-kind: kwok
spec:
  taints: [{key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}]
status:
  capacity: {cpu: "64", memory: 512Gi, pods: "220", nvidia.com/gpu: "$KWOK_NODE_GPUS"}
  allocatable: {cpu: "64", memory: 512Gi, pods: "220", nvidia.com/gpu: "$KWOK_NODE_GPUS"}
NODE
  done | "${KUBECTL[@]}" apply -f - >/dev/null
}

# Only the cluster that made the route removes it: another cluster on this machine may share it
# (`ip route add` fails if the route exists, and then this one does not own it).
kwok_route() {
  if [[ $EUID != 0 ]]; then
    log "not root: kwok's pod addresses ($KWOK_POD_CIDR) are not made local"
  elif ip route add local "$KWOK_POD_CIDR" dev lo 2>/dev/null; then
    touch "$CLUSTER_DIR/kwok-route"
  fi
}

up() {
  if healthy; then
    log "reusing the healthy cluster in $CLUSTER_DIR"
    kwok_route
    [[ $REAL_NODES == 0 ]] || "$HACK_DIR/nodes.sh" images || exit 1
    echo "$KUBECONFIG_PATH"
    return 0
  fi
  local t0=$SECONDS
  "$HACK_DIR/build-binaries.sh" >&2
  down_all >/dev/null 2>&1 || true
  mkdir -p "$LOGS" "$PIDS"
  local name port
  for name in etcd:$ETCD_PORT etcd-peer:$((ETCD_PORT + 1)) kube-apiserver:$APISERVER_PORT \
              kube-controller-manager:$KCM_PORT kube-scheduler:$SCHEDULER_PORT kwok:$KWOK_PORT; do
    port=${name#*:}
    port_busy "$port" && { printf 'error: cluster-up: port %s for %s is already in use (set COHORT_*_PORT to move it); logs would be in %s\n' \
      "$port" "${name%%:*}" "$LOGS/${name%%:*}.log" >&2; exit 1; }
  done
  gen_pki
  [[ $REAL_NODES == 0 ]] || "$HACK_DIR/nodes.sh" net-up || exit 1
  rm -rf "$CLUSTER_DIR/etcd"
  log "starting etcd $ETCD_VERSION"
  start etcd "$ETCD_BIN" --name cohort --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "cohort=http://127.0.0.1:$((ETCD_PORT + 1))" --unsafe-no-fsync --log-level warn
  wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

  # With real nodes, pods reach the API server at $API_IP (the `kubernetes`
  # Service's endpoint): it listens on every address, and nodes.sh lets only
  # loopback and the cluster's own interfaces connect.
  local bind=127.0.0.1 reconciler=none
  [[ $REAL_NODES == 0 ]] || bind=0.0.0.0 reconciler=lease
  log "starting kube-apiserver $K8S_VERSION on https://127.0.0.1:$APISERVER_PORT"
  start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" --bind-address "$bind" --advertise-address "$API_IP" \
    --secure-port "$APISERVER_PORT" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --authorization-mode Node,RBAC --allow-privileged=true \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
    --endpoint-reconciler-type "$reconciler" --profiling=false
  write_kubeconfig "$KUBECONFIG_PATH" admin
  wait_for kube-apiserver 60 "${KUBECTL[@]}" get --raw /readyz

  local kc
  for kc in controller-manager scheduler kwok; do write_kubeconfig "$PKI/$kc.kubeconfig" "$kc"; done
  log "starting kube-controller-manager, kube-scheduler, kwok"
  start kube-controller-manager "$K8S_BIN/kube-controller-manager" --kubeconfig "$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$PKI/controller-manager.kubeconfig" --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --controllers '*' --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" --use-service-account-credentials \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" --profiling=false
  start kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig "$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig "$PKI/scheduler.kubeconfig" --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" --leader-elect=false --profiling=false
  kwok_route
  start kwok "$KWOK_BIN" --kubeconfig "$PKI/kwok.kubeconfig" --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --server-address "127.0.0.1:$KWOK_PORT" \
    --node-lease-duration-seconds 40 --cidr "$KWOK_POD_CIDR" --config "$HACK_DIR/kwok/stages.yaml"
  wait_for kube-controller-manager 60 curl -skf "https://127.0.0.1:$KCM_PORT/healthz"
  wait_for kube-scheduler 60 curl -skf "https://127.0.0.1:$SCHEDULER_PORT/healthz"
  wait_for kwok 60 curl -sf "http://127.0.0.1:$KWOK_PORT/healthz"
  # The default ServiceAccount appears once the controller-manager runs.
  wait_for kube-controller-manager 60 "${KUBECTL[@]}" get serviceaccount default -n default
  create_kwok_nodes
  [[ $REAL_NODES == 0 ]] || "$HACK_DIR/nodes.sh" up || { down_all >/dev/null 2>&1 || true; die "cluster-up: the real nodes did not come up (above; logs in $LOGS)"; }
  log "cluster up in $((SECONDS - t0))s; export KUBECONFIG=$KUBECONFIG_PATH"
  echo "$KUBECONFIG_PATH"
}

down_all() {
  # Real nodes first: their pods, containers, mounts and network go with them.
  "$HACK_DIR/nodes.sh" down
  [[ -d $PIDS ]] || return 0
  local f extras=()
  # Extra tools first (they talk to the API server), then the API server's
  # clients, the API server, etcd.
  for f in "$PIDS"/*.pid; do
    if [[ -e $f && " ${COMPONENTS[*]} " != *" $(basename "$f" .pid) "* ]]; then extras+=("$f"); fi
  done
  stop_pidfiles "${extras[@]}"
  stop_pidfiles "$PIDS/kwok.pid" "$PIDS/kube-scheduler.pid" "$PIDS/kube-controller-manager.pid"
  stop_pidfiles "$PIDS/kube-apiserver.pid"
  stop_pidfiles "$PIDS/etcd.pid"
  if [[ -e $CLUSTER_DIR/kwok-route ]]; then
    ip route del local "$KWOK_POD_CIDR" dev lo 2>/dev/null || true
    rm -f "$CLUSTER_DIR/kwok-route"
  fi
  rm -rf "$CLUSTER_DIR/etcd"
}

case ${1:-} in
  up) up ;;
  down) down_all; log "cluster down" ;;
  status) healthy && echo healthy || { echo "not running"; exit 1; } ;;
  env) echo "export KUBECONFIG=$KUBECONFIG_PATH" ;;
  kubeconfig) echo "$KUBECONFIG_PATH" ;;
  *) echo "usage: $0 up|down|status|env|kubeconfig" >&2; exit 2 ;;
esac
