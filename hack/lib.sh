# Shared shell helpers for hack/ scripts. Sourced, never executed.
# Owns: where caches live, pinned versions, log/fail helpers, recorded background
# processes, and the local cluster's client certificates and kubeconfigs.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HACK_DIR/.." && pwd)
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
COHORT_CACHE=${COHORT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cohort}
BIN_CACHE="$COHORT_CACHE/bin"
# Real nodes the local cluster runs (hack/cluster.sh, hack/nodes.sh; `make test` builds their
# images only when there are some). 0: the control plane and kwok nodes only.
REAL_NODES=${COHORT_REAL_NODES:-2}
mkdir -p "$BIN_CACHE"

# go_module module@version field: a field of a module in Go's module cache (Dir, GoMod, ...), downloaded
# first if missing. Go locks its module cache, so builds running side by side may call this together.
go_module() {
  go mod download -json "$1" | sed -n "s/.*\"$2\": \"\(.*\)\".*/\1/p"
}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
wait_all() {  # pid...: wait for every one of these background jobs; fails if any failed, once all have ended
  local p rc=0
  for p; do wait "$p" || rc=1; done
  return "$rc"
}

# --- background processes recorded in a pids dir ---------------------------------
# Each started process gets <dir>/<name>.pid and <name>.pid.cmd (its exact command
# line), so a recycled PID is never mistaken for ours. `hack/cluster.sh down`
# stops every pidfile in the cluster's pids dir.

pid_alive() {  # pidfile -> 0 if the process it names is alive and is the one we started
  local f=$1 pid exe
  [[ -f $f ]] || return 1
  pid=$(cat "$f")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
  exe=$({ tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null || true)  # gone meanwhile: empty
  # Contains, not starts with: a script started through its shebang shows the interpreter first.
  [[ $exe == *"$(cat "$f.cmd" 2>/dev/null)"* ]]
}

start_recorded() {  # pidfile logfile cmd... : start in its own session, record pid and command line
  local pidfile=$1 logfile=$2; shift 2
  # Fds 8 and 9 are the scripts' flock locks: the daemon must not keep holding them.
  setsid "$@" >>"$logfile" 2>&1 < /dev/null 8>&- 9>&- &
  echo "$!" > "$pidfile"
  printf '%s ' "$@" > "$pidfile.cmd"
}

stop_pidfile() {  # pidfile [grace_s]: TERM, wait, then KILL; by PID only
  GRACE=${2:-10} stop_pidfiles "$1"
}

stop_pidfiles() {  # pidfile...: TERM them all, wait up to $GRACE s (10) for all, KILL the rest; by PID only
  # Together: each of the cluster's daemons takes about 2 s to exit after TERM.
  local f p pids=() names=() i alive
  for f in "$@"; do
    if pid_alive "$f"; then
      pids+=("$(cat "$f")"); names+=("$(basename "$f" .pid)")
      kill -TERM "${pids[-1]}" 2>/dev/null || true
    fi
  done
  for ((i = 0; i < ${GRACE:-10} * 5; i++)); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1 && break; done
    ((alive)) || break
    sleep 0.2
  done
  for i in "${!pids[@]}"; do
    kill -0 "${pids[$i]}" 2>/dev/null && kill -KILL "${pids[$i]}" 2>/dev/null || true
    log "stopped ${names[$i]} (pid ${pids[$i]})"
  done
  for f in "$@"; do rm -f "$f" "$f.cmd"; done
}

# --- the local cluster's certificates and kubeconfigs ------------------------------
# $PKI is the cluster's pki dir (ca.crt, ca.key: hack/cluster.sh makes them).

sign_cert() {  # name subject [san]: $PKI/<name>.key and a certificate signed by the cluster CA
  local ext; ext=$(mktemp)
  openssl req -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -out "$PKI/$1.csr" -subj "$2" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' > "$ext"
  [[ -n ${3:-} ]] && echo "subjectAltName=$3" >> "$ext"
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -out "$PKI/$1.crt" -days 3650 -extfile "$ext" 2>/dev/null
  rm -f "$PKI/$1.csr" "$ext"
}

write_kubeconfig() {  # out user: a kubeconfig for the local API server, as <user> ($PKI/<user>.crt)
  local b64="base64 -w0"
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: cohort-local
  cluster:
    server: https://127.0.0.1:${COHORT_APISERVER_PORT:-16443}
    certificate-authority-data: $($b64 < "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $($b64 < "$PKI/$2.crt")
    client-key-data: $($b64 < "$PKI/$2.key")
contexts:
- name: cohort-local
  context: {cluster: cohort-local, user: $2}
current-context: cohort-local
KC
  chmod 600 "$1"
}

local_user() {  # name kubeconfig rules-yaml: the identity cohort:<name> for a component of the local
  # cluster: a client certificate (signed once), a kubeconfig, and a ClusterRole with these rules
  # bound to it. Applied with the caller's admin "${KUBECTL[@]}".
  [[ -f $PKI/$1.crt ]] || sign_cert "$1" "/CN=cohort:$1"
  write_kubeconfig "$2" "$1"
  "${KUBECTL[@]}" apply -f - >/dev/null <<YAML
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "cohort:$1"}
rules:
$3
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "cohort:$1"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "cohort:$1"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "cohort:$1"}
YAML
}

# Polls `command...` every 0.2 s until it succeeds (returns 0), the process in
# pidfile exits (1; kill -0, not pid_alive: until the child has exec'd, its
# command line is still bash's), or timeout_s passes (2). The callers say why.
poll_ready() {  # timeout_s pidfile command...
  local timeout=$1 pidfile=$2 i; shift 2
  for ((i = 0; i < timeout * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$pidfile")" 2>/dev/null || return 1
    sleep 0.2
  done
  return 2
}
