# Cohort's image store, for hack/images.sh and hack/user-image.sh. Sourced, never executed.
# Owns: where images and buildah's storage live, the images' tag, buildah and ctr
# invoked on them, and the host files a build's RUN steps see.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGES_DIR="$COHORT_CACHE/images"
STORAGE=(--root "$IMAGES_DIR/storage" --runroot "/run/cohort-buildah")
TAG=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$REPO_ROOT/helm/cohort/Chart.yaml")
mkdir -p "$IMAGES_DIR"

# Buildah stages each committed layer in TMPDIR (/var/tmp by default): here, so
# that it is on the disk the free-space check measures and a killed build's
# gigabytes are found and removed by the next one.
export TMPDIR="$IMAGES_DIR/tmp"
mkdir -p "$TMPDIR"

buildah_() { buildah "${STORAGE[@]}" "$@"; }

ctr_() {  # socket args...: ctr on one node's containerd, in the namespace the kubelet uses
  local sock=$1; shift
  "$BIN_CACHE/containerd-$CONTAINERD_VERSION/ctr" --address "$sock" -n k8s.io "$@" 2> >(grep -v DEPRECATION >&2)
}

# The host's pip configuration and CA bundle, mounted for a build's RUN steps
# only (never committed), so pip inside reaches the package index as the host does.
RUN_MOUNTS=()
for _f in /etc/pip.conf /etc/ssl/certs/ca-certificates.crt; do
  if [[ -f $_f ]]; then RUN_MOUNTS+=(-v "$_f:$_f:ro"); fi
done
unset _f
