# Shared shell helpers for hack/ scripts. Sourced, never executed.
# Owns: where caches live, pinned versions, and log/fail helpers.
set -euo pipefail
HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HACK_DIR/.." && pwd)
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
COHORT_CACHE=${COHORT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cohort}
BIN_CACHE="$COHORT_CACHE/bin"
mkdir -p "$BIN_CACHE"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# --- background processes recorded in a pids dir ---------------------------------
# Each started process gets <dir>/<name>.pid and <name>.pid.cmd (its exact command
# line), so a recycled PID is never mistaken for ours. `hack/cluster.sh down`
# stops every pidfile in the cluster's pids dir.

pid_alive() {  # pidfile -> 0 if the process it names is alive and is the one we started
  local f=$1 pid exe
  [[ -f $f ]] || return 1
  pid=$(cat "$f")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
  exe=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)
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
  local f=$1 grace=${2:-10} pid i
  if pid_alive "$f"; then
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 5; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    log "stopped $(basename "$f" .pid) (pid $pid)"
  fi
  rm -f "$f" "$f.cmd"
}
