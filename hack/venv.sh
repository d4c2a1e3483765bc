#!/usr/bin/env bash
# Ensures the one cached virtualenv exists and has this checkout's four projects
# installed editable, then prints its path.
#
# The venv lives in $COHORT_CACHE/venv/<python>-<hash of requirements.txt>, so
# torch (a multi-GB CUDA build from the package index) is installed once per
# machine and reused by every clone. The editable installs are re-pointed
# cheaply when a different checkout uses the venv.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || die "python3 not found (need >= $PYTHON_MIN)"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PYTHON" -c "import sys; sys.exit(sys.version_info < tuple(map(int, '$PYTHON_MIN'.split('.'))))" \
  || die "python $pyver is too old (need >= $PYTHON_MIN)"
key=$(cat "$HACK_DIR/requirements.txt" | sha256sum | cut -c1-12)
VENV="$COHORT_CACHE/venv/py$pyver-$key"

exec 8>"$COHORT_CACHE/venv.lock"
flock 8

if [[ ! -f "$VENV/.complete" ]]; then
  log "creating virtualenv $VENV (first run: downloads torch, several GB; later runs reuse it)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel >&2
  "$VENV/bin/pip" install --progress-bar off -r "$HACK_DIR/requirements.txt" >&2 \
    || die "pip install into $VENV failed (see above)"
  touch "$VENV/.complete"
fi

# Editable installs of this checkout (no deps: those are pinned above).
# The marker names the checkout and its projects, so adding a project re-installs.
marker="$VENV/.editable-root"
editable="$REPO_ROOT (api client operator trainer)"
if [[ "$(cat "$marker" 2>/dev/null)" != "$editable" ]]; then
  log "installing cohort-api, cohort-client, cohort-operator and cohort-trainer from $REPO_ROOT (editable)"
  # setuptools' editable build cautions, ten lines per project, that a folder named like a package in the
  # working directory could shadow it on import. Here each package is under its project's src/ and no
  # folder is named cohort; those 40 lines would bury the setup's own log.
  PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/pip" install -q --no-deps --no-build-isolation \
    -e "$REPO_ROOT/api" -e "$REPO_ROOT/client" -e "$REPO_ROOT/operator" -e "$REPO_ROOT/trainer" >&2
  echo "$editable" > "$marker"
fi
echo "$VENV"
