#!/usr/bin/env bash
# The GPU proof (docs/benchmarks.md#gpu-proof): Cohort's trainer on one NVIDIA GPU, phase by phase,
# in at most 8 minutes. Not part of make test (CI has no GPU).
#   hack/gpu-proof.sh OUTDIR            # on the GPU machine: its own python3 (a CUDA torch)
#   hack/gpu-proof.sh --smoke OUTDIR    # anywhere: a tiny model on the CPU over gloo (about 3 min)
# OUTDIR gets results.jsonl (one JSON line per phase, written as each ends), proof.log,
# plain_kernels.txt and logs.tar.gz; hack/gpu_proof.py says what each phase measures.
#
# Python: $PYTHON, else python3; in --smoke, the project's virtualenv when python3 has no torch.
# The machine may reach no package index: wheels in $COHORT_WHEELS (default .whl, made by
# hack/gpu-wheels.sh) are installed, with --no-index into a temporary directory, for the packages
# this python lacks. Extra arguments go to hack/gpu_proof.py (--deadline S, --phases a,b, --workdir D).
set -uo pipefail
smoke=()
if [[ ${1:-} == --smoke ]]; then smoke=(--smoke); shift; fi
out=${1:?usage: hack/gpu-proof.sh [--smoke] OUTDIR [gpu_proof.py options]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
wheels=${COHORT_WHEELS:-}
[[ -n $wheels && -d $wheels ]] && wheels=$(cd "$wheels" && pwd)
cd "$(dirname "$0")/.."
wheels=${wheels:-$PWD/.whl}
py=${PYTHON:-python3}
if [[ ${#smoke[@]} -gt 0 && -z ${PYTHON:-} ]] && ! "$py" -c 'import torch' 2>/dev/null; then
  py="$(hack/venv.sh)/bin/python"
fi
export PYTHONPATH=$PWD/api/src:$PWD/trainer/src PYTHONUNBUFFERED=1
if compgen -G "$wheels/*.whl" >/dev/null; then
  missing=()
  for whl in "$wheels"/*.whl; do
    dist=$(basename "$whl" | cut -d- -f1)
    "$py" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null || missing+=("$whl")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    site=$(mktemp -d /tmp/cohort-proof-site.XXXXXX)
    echo "installing ${#missing[@]} wheels this python lacks into $site: ${missing[*]##*/}"
    PIP_ROOT_USER_ACTION=ignore "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${missing[@]}" \
      && PYTHONPATH=$PYTHONPATH:$site || echo "warning: installing the wheels failed; going on without them" >&2
  else
    echo "every package in $wheels is already installed here: none installed"
  fi
fi
exec "$py" hack/gpu_proof.py "${smoke[@]}" "$@" "$out"
