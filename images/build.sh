#!/usr/bin/env bash
# Builds Cohort's images with docker (BuildKit), or prints the commands when
# docker cannot build here (no CLI or no daemon). The build context is the repository root.
#
#   images/build.sh [operator|trainer-cpu|trainer-cuda]...   (default: all three)
#
# Environment:
#   IMAGE_REGISTRY  prefix for the image names, e.g. <your registry>/<org> (default: none,
#                   plain names such as cohort-operator:0.1.0)
#   IMAGE_TAG       default: the chart's appVersion (helm/cohort/Chart.yaml)
#   DOCKER          the docker CLI (default: docker)
#   PUSH=1          push after building
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TAG=${IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$REPO_ROOT/helm/cohort/Chart.yaml")}
PREFIX=${IMAGE_REGISTRY:+${IMAGE_REGISTRY%/}/}
DOCKER=${DOCKER:-docker}

image_name() {  # variant -> name:tag
  case $1 in
    operator) echo "${PREFIX}cohort-operator:$TAG" ;;
    trainer-cpu) echo "${PREFIX}cohort-trainer:$TAG" ;;
    trainer-cuda) echo "${PREFIX}cohort-trainer:$TAG-cuda" ;;
    *) echo "unknown image '$1' (operator, trainer-cpu, trainer-cuda)" >&2; exit 2 ;;
  esac
}

variants=("$@")
[[ ${#variants[@]} -gt 0 ]] || variants=(operator trainer-cpu trainer-cuda)
have_docker=0
# A docker CLI alone is not enough: it needs a daemon (and BuildKit, for the per-Dockerfile ignore files).
"$DOCKER" info >/dev/null 2>&1 && have_docker=1
[[ $have_docker == 1 ]] || echo "# no working $DOCKER here: the build commands are (run them from $REPO_ROOT):"
for v in "${variants[@]}"; do
  name=$(image_name "$v")
  cmd=(env DOCKER_BUILDKIT=1 "$DOCKER" build -f "images/$v.Dockerfile" -t "$name" .)
  if [[ $have_docker == 1 ]]; then
    echo "+ ${cmd[*]}" >&2
    (cd "$REPO_ROOT" && "${cmd[@]}")
    [[ ${PUSH:-0} == 1 ]] && "$DOCKER" push "$name"
  else
    echo "${cmd[*]}"
    [[ ${PUSH:-0} == 1 ]] && echo "$DOCKER push $name"
  fi
done
exit 0
