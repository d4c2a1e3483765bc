#!/usr/bin/env bash
# The trainer's tests on another torch than the one hack/requirements.txt pins: the GPU machines lent so far
# had torch 2.11.0+cu130 of their own, which the GPU proof runs on (docs/gpu.md, "Which torch"). A virtualenv
# with that torch and every other pin, cached in $COHORT_CACHE/venv-torch/<version>, this checkout installed
# editable in it, then the unit tier and the trainer's dist tier (about 20 min here). Not part of make test.
#   hack/torch-compat.sh 2.11.0 [pytest arguments]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

version=${1:?usage: hack/torch-compat.sh TORCH_VERSION [pytest arguments]}
shift
PYTHON=${PYTHON:-python3}
VENV="$COHORT_CACHE/venv-torch/$version"
if [[ ! -f "$VENV/.complete" ]]; then
  log "creating virtualenv $VENV: torch $version and the project's other pins (downloads several GB)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools wheel >&2
  sed "s/^torch==.*/torch==$version/" "$HACK_DIR/requirements.txt" > "$VENV/requirements.txt"
  "$VENV/bin/pip" install --progress-bar off -r "$VENV/requirements.txt" >&2 \
    || die "pip install into $VENV failed (see above)"
  touch "$VENV/.complete"
fi
log "installing this checkout's four projects into $VENV (editable)"
PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/pip" install -q --no-deps --no-build-isolation \
  -e "$REPO_ROOT/api" -e "$REPO_ROOT/client" -e "$REPO_ROOT/operator" -e "$REPO_ROOT/trainer" >&2
"$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'
cd "$REPO_ROOT"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q trainer/tests operator/tests client/tests tests/unit \
  -m "not k8s and not e2e" "$@"
