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
