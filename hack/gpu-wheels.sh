#!/usr/bin/env bash
# Downloads, with this machine's pip, the wheels that hack/gpu-proof.sh installs on a GPU machine
# that reaches no package index: the pure-Python (or small) packages api/ and trainer/ import
# besides torch, numpy and scikit-learn, at this project's pins, for that machine's Python 3.12 on
# manylinux x86-64. Never committed (.whl/ is ignored); at most 64 MiB in all.
#   hack/gpu-wheels.sh [DIR]        # default .whl (what hack/gpu-proof.sh looks for)
#
# On 2026-11-17 the GPU machine's image already held every one of them (pyyaml, prometheus-client,
# fsspec; torch, numpy, scikit-learn too): the proof installs a wheel only when its package is
# missing there, so these are the fallback for an image that lost one, not an upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
pyver=${COHORT_WHEELS_PYTHON:-3.12}
pip=${PIP:-}
if [[ -z $pip ]]; then
  if python3 -m pip --version >/dev/null 2>&1; then pip="python3 -m pip"; else pip="$(hack/venv.sh)/bin/pip"; fi
fi
pin() {  # the version hack/requirements.txt pins, else the one given
  local v; v=$(sed -n "s/^$1==\([^ #]*\).*/\1/p" hack/requirements.txt | head -n1)
  echo "$1==${v:-$2}"
}
wanted=("$(pin pyyaml 6.0.4)" "$(pin prometheus-client 0.26.0)" "$(pin fsspec 2026.9.0)")
mkdir -p "$dir"
# shellcheck disable=SC2086  # $pip may be "python3 -m pip"
$pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "${wanted[@]}"
total=$(du -cb "$dir"/*.whl | tail -n1 | cut -f1)
ls -l "$dir"/*.whl
echo "$(ls "$dir"/*.whl | wc -l) wheels, $((total / 1024)) KiB in $dir"
(( total <= 64 * 1024 * 1024 )) || { echo "error: over 64 MiB" >&2; exit 1; }
