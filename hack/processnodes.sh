#!/usr/bin/env bash
# Process nodes: a development kubelet that runs pods bound to its nodes as local
# processes (see docs/processnodes.md). Needs the local cluster (hack/cluster.sh up).
#
#   hack/processnodes.sh up [--nodes N]   start (or reuse a healthy) daemon with N nodes
#                                         (default 2: process-0, process-1); waits until Ready
#   hack/processnodes.sh down             stop it: its pods' processes are killed, its Nodes deleted
#   hack/processnodes.sh status           exit 0 if the daemon is healthy
#   hack/processnodes.sh logs NAMESPACE POD [-c CONTAINER] [-f]
#                                         print a container's stdout/stderr (-f follows)
#
# The daemon's pid is recorded in $COHORT_CLUSTER_DIR/pids/processnodes.pid the way
# cluster.sh records its own, so `hack/cluster.sh down` stops it too. Its log is
# $COHORT_CLUSTER_DIR/logs/processnodes.log; pod logs are in logs/pods/.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${COHORT_CLUSTER_DIR:-$COHORT_CACHE/cluster}
PIDS="$CLUSTER_DIR/pids" LOGS="$CLUSTER_DIR/logs"
PIDFILE="$PIDS/processnodes.pid"
STATE="$CLUSTER_DIR/processnodes"
KUBECONFIG_PATH="$CLUSTER_DIR/kubeconfig"
HEARTBEAT_MAX_AGE_S=35

running_nodes() {  # the node count of the running daemon
  python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["nodes"]))' "$STATE/daemon.json" 2>/dev/null
}

healthy() {
  pid_alive "$PIDFILE" && [[ -f $STATE/daemon.json && -f $STATE/heartbeat ]] || return 1
  local age=$(( $(date +%s) - $(stat -c %Y "$STATE/heartbeat") ))
  (( age < HEARTBEAT_MAX_AGE_S ))
}

stop_daemon() { stop_pidfile "$PIDFILE" 15; }  # it stops its pods first, so a longer grace

up() {
  local nodes=""
  while (($#)); do
    case $1 in
      --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
      --nodes=*) nodes=${1#*=}; shift ;;
      *) die "processnodes up: unknown argument $1" ;;
    esac
  done
  if healthy; then
    local have; have=$(running_nodes)
    if [[ -n $nodes && $nodes != "$have" ]]; then
      die "process nodes already run with $have nodes; run 'hack/processnodes.sh down' first to change to $nodes"
    fi
    log "reusing the healthy process-node daemon (pid $(cat "$PIDFILE"), $have nodes)"
    return 0
  fi
  "$HACK_DIR/cluster.sh" status >/dev/null 2>&1 \
    || die "the local cluster is not running: start it with hack/cluster.sh up"
  stop_daemon >/dev/null 2>&1 || true
  local venv; venv=$("$HACK_DIR/venv.sh")
  mkdir -p "$PIDS" "$LOGS" "$STATE"
  rm -f "$STATE/daemon.json"
  local cmd=("$venv/bin/python" -m processnode --kubeconfig "$KUBECONFIG_PATH" --cluster-dir "$CLUSTER_DIR"
             --nodes "${nodes:-2}" --path "$venv/bin")
  # Run from hack/ so `-m processnode` finds the package without touching PYTHONPATH
  # (which the pods would inherit).
  cd "$HACK_DIR"
  start_recorded "$PIDFILE" "$LOGS/processnodes.log" "${cmd[@]}"
  local pid i
  pid=$(cat "$PIDFILE")
  # Plain kill -0 here: until the child has exec'd, its cmdline is still bash's.
  for ((i = 0; i < 150; i++)); do
    [[ -f $STATE/daemon.json ]] && { log "process nodes up: $(running_nodes) nodes (pid $pid)"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  printf 'error: process nodes did not start; the end of %s:\n' "$LOGS/processnodes.log" >&2
  tail -n 20 "$LOGS/processnodes.log" | sed 's/^/    /' >&2
  kill -TERM "$pid" 2>/dev/null || true
  rm -f "$PIDFILE" "$PIDFILE.cmd"
  exit 1
}

show_logs() {
  local ns=${1:-} pod=${2:-} container="" follow=()
  [[ -n $ns && -n $pod ]] || die "usage: $0 logs NAMESPACE POD [-c CONTAINER] [-f]"
  shift 2
  while (($#)); do
    case $1 in
      -f|--follow) follow=(-F); shift ;;
      -c|--container) container=${2:?-c needs a name}; shift 2 ;;
      *) die "processnodes logs: unknown argument $1" ;;
    esac
  done
  local files=()
  if [[ -n $container ]]; then
    files=("$LOGS/pods/${ns}_${pod}_${container}.log")
    [[ -f ${files[0]} ]] || die "no log for container $container of $ns/$pod (${files[0]})"
  else
    shopt -s nullglob
    files=("$LOGS/pods/${ns}_${pod}_"*.log)
    shopt -u nullglob
    ((${#files[@]})) || die "no logs for pod $ns/$pod in $LOGS/pods"
    if ((${#files[@]} > 1)); then
      local names=("${files[@]##*/${ns}_${pod}_}")
      die "pod $ns/$pod has several containers; choose one with -c: ${names[*]%.log}"
    fi
  fi
  exec tail -n +1 "${follow[@]}" "${files[0]}"
}

lock() {  # one up/down at a time (two test sessions may start together)
  mkdir -p "$STATE"
  exec 9>"$STATE/script.lock"
  flock 9
}

case ${1:-} in
  up) shift; lock; up "$@" ;;
  down) lock; stop_daemon; log "process nodes down" ;;
  status) healthy && echo "healthy ($(running_nodes) nodes)" || { echo "not running"; exit 1; } ;;
  logs) shift; show_logs "$@" ;;
  *) echo "usage: $0 up [--nodes N]|down|status|logs NAMESPACE POD [-c CONTAINER] [-f]" >&2; exit 2 ;;
esac
