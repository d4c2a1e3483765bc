#!/usr/bin/env bash
# Builds (or, warm, checks) everything `make test` and `make demo` need before their first test or
# job, in two lanes side by side:
#   binaries: hack/build-binaries.sh (the pinned Go binaries)
#   images:   hack/venv.sh, then the real nodes' images (hack/images.sh build; imported too when the
#             nodes run), unless the cluster has no real nodes (COHORT_REAL_NODES=0)
# Why two lanes: cold, the binaries' build kept both cores 90 % busy for 24 min, while the virtualenv
# (1 min 40 s) and the images (7 min 23 s) used 0.9 and 0.7 of one core, mostly waiting on downloads
# and the disk (docs/benchmarks.md#setup-times). The images are built here, not by the first cluster
# test: a cold build is longer than any test's timeout.
# Each lane's lines are prefixed with its name; the script fails if either lane failed.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

lane() {  # name cmd...: cmd's output, stdout and stderr, on stderr, each line prefixed with the lane's name
  local name=$1; shift
  "$@" 2>&1 | sed -u "s/^/$name | /" >&2
}

images_lane() {
  "$HACK_DIR/venv.sh" >/dev/null
  [[ $("$HACK_DIR/nodes.sh" count) != 0 ]] || return 0
  "$HACK_DIR/nodes.sh" images  # running nodes hold the binaries already (ctr, for the import)
}

lane binaries "$HACK_DIR/build-binaries.sh" & binaries=$!
lane images images_lane & images=$!
failed=()
wait "$binaries" || failed+=("binaries (hack/build-binaries.sh)")
wait "$images" || failed+=("virtualenv or images (hack/venv.sh, hack/images.sh build)")
if ((${#failed[@]})); then
  IFS=";"; die "setup failed: ${failed[*]}; the lines above prefixed with its lane say why"
fi
