#!/usr/bin/env bash
# Builds Cohort's images on this machine with no Docker and no registry, and
# imports them into the local cluster's container runtimes.
#
#   hack/images.sh build [base|pause|operator|trainer]...  build what is missing (default: all)
#   hack/images.sh import SOCKET MARKDIR                   import the built images a containerd lacks
#   hack/images.sh archive NAME                            print the docker-archive path of one image
#   hack/images.sh list                                    name, archive and size of each image
#
# - base: a Debian bookworm root file system with Python, made by mmdebstrap
#   from Debian's packages (no base image is pulled), committed as
#   cohort.local/debian-python:bookworm. The Dockerfiles take it through
#   their BASE_IMAGE build argument; users with Docker build them unchanged
#   from the public python image.
# - pause: the sandbox image, built static from the pause.c that ships in the
#   pinned k8s.io/kubernetes module.
# - operator, trainer: images/operator.Dockerfile and images/trainer-cpu.Dockerfile,
#   built by buildah with chroot isolation (daemonless).
#
# Each image is cached as a docker-archive in $COHORT_CACHE/images/, keyed by a
# hash of everything that went into it (Dockerfile, build context files, base),
# so an unchanged tree rebuilds nothing; the images nodes import are kept
# zstd-compressed (the trainer's 4.4 GB archive is 2.5 GB so) and decompressed
# on their way into containerd. Buildah's own storage lives there too.
source "$(dirname "${BASH_SOURCE[0]}")/image-store.sh"

BASE_REF="cohort.local/debian-python:bookworm"
PAUSE_REF="cohort.local/pause:$PAUSE_VERSION"

# What building an image adds to the disk at its peak, in GiB. The trainer's
# 4.4 GB of dependencies are there several times over while buildah commits them
# (the build container, its staging copy, the stored layer, the archive): the
# disk's use rose by 16 GiB during a build here, and fell back to 2.5 after.
need_gib() { case $1 in trainer) echo 17 ;; operator) echo 3 ;; *) echo 1 ;; esac; }

check_space() {  # image: fail early, naming the directory, when the disk cannot hold the build
  local need avail
  need=$(need_gib "$1")
  avail=$(( $(df --output=avail -k "$IMAGES_DIR" | tail -n 1) / 1048576 ))
  (( avail >= need )) || die "building the $1 image needs about $need GiB free on the disk of $IMAGES_DIR; it has $avail GiB (free some, or point COHORT_CACHE at a larger disk)"
}

scratch_clean() {  # remove what an interrupted build left: working containers, staged layers
  buildah_ rm --all >/dev/null 2>&1 || true
  rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
}

need_tools() {
  local missing=() t
  for t in buildah mmdebstrap zstd; do command -v "$t" >/dev/null || missing+=("$t"); done
  [[ ${#missing[@]} == 0 ]] && return 0
  "$HACK_DIR/host-packages.sh" >&2
}

ref_of() {  # image -> the name pods use
  case $1 in
    base) echo "$BASE_REF" ;;
    pause) echo "$PAUSE_REF" ;;
    operator) echo "cohort-operator:$TAG" ;;
    trainer) echo "cohort-trainer:$TAG" ;;
    *) die "unknown image '$1' (base, pause, operator, trainer)" ;;
  esac
}

dockerfile_of() { case $1 in operator) echo images/operator.Dockerfile ;; trainer) echo images/trainer-cpu.Dockerfile ;; esac; }

key_of() {  # image -> hash of its inputs
  local img=$1
  case $img in
    base) printf '%s\n' "$BASE_PACKAGES" "$BASE_SUITE" "$(sed -n '/^build_base()/,/^}/p' "$0")" | sha256sum | cut -c1-12 ;;
    pause) printf '%s\n' "$K8S_VERSION" "$PAUSE_VERSION" "$(sed -n '/^build_pause()/,/^}/p' "$0")" | sha256sum | cut -c1-12 ;;
    *)
      local df; df=$(dockerfile_of "$img")
      {
        echo "base $(key_of base)"
        cat "$REPO_ROOT/$df" "$REPO_ROOT/$df.dockerignore"
        # The context the .dockerignore lets in: tracked and untracked (not ignored) files.
        (cd "$REPO_ROOT" && git ls-files -co --exclude-standard hack/requirements.txt api/ "${img}/" \
          | grep -v -e '/tests/' -e '__pycache__' | sort | xargs sha256sum)
      } | sha256sum | cut -c1-12 ;;
  esac
}

archive_of() {  # image -> its archive: the base stays plain, a build input buildah pulls
  case $1 in base) echo "$IMAGES_DIR/base-$(key_of base).tar" ;; *) echo "$IMAGES_DIR/$1-$(key_of "$1").tar.zst" ;; esac
}

# Debian packages in the base: Python, venv (ensurepip), `python` on PATH, CA certificates.
BASE_SUITE=bookworm
BASE_PACKAGES="python3,python3-venv,python-is-python3,ca-certificates,passwd"

push_archive() {  # ref out: a docker-archive of ref, compressed with zstd into out
  buildah_ push --quiet "$1" "docker-archive:$2.tar:$1" >&2
  zstd -q -T0 --rm -f "$2.tar" -o "$2" || die "zstd of $2.tar failed"
}

build_base() {
  local out=$1 tmp
  tmp=$(mktemp -d "$IMAGES_DIR/.base.XXXX")
  log "base: mmdebstrap $BASE_SUITE minbase + $BASE_PACKAGES (cold: about 1-2 min)"
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    "$BASE_SUITE" "$tmp/rootfs.tar" >&2 || { rm -rf "$tmp"; die "mmdebstrap failed (Debian packages reachable? apt-get update?)"; }
  local ctr; ctr=$(buildah_ from scratch)
  buildah_ add "$ctr" "$tmp/rootfs.tar" / >/dev/null
  buildah_ config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /bin/bash \
    --label org.opencontainers.image.description="Debian $BASE_SUITE with Python, from Debian's packages" "$ctr"
  buildah_ commit --quiet --rm "$ctr" "$BASE_REF" >/dev/null
  buildah_ push --quiet "$BASE_REF" "docker-archive:$out:$BASE_REF" >&2
  rm -rf "$tmp"
}

build_pause() {
  local out=$1 tmp src
  tmp=$(mktemp -d "$IMAGES_DIR/.pause.XXXX")
  # From the module itself, not from the binaries' build: hack/setup.sh builds the images beside it.
  src=$(go_module "k8s.io/kubernetes@$K8S_VERSION" Dir)
  [[ -f $src/build/pause/linux/pause.c ]] || die "no pause.c in the k8s.io/kubernetes module ($src): is the Go module proxy reachable?"
  log "pause: compiling $src/build/pause/linux/pause.c (static)"
  gcc -Os -static -Wall -Werror -DVERSION="v$PAUSE_VERSION-cohort" -o "$tmp/pause" "$src/build/pause/linux/pause.c"
  strip "$tmp/pause"
  local ctr; ctr=$(buildah_ from scratch)
  buildah_ copy "$ctr" "$tmp/pause" /pause >/dev/null
  buildah_ config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah_ commit --quiet --rm "$ctr" "$PAUSE_REF" >/dev/null
  push_archive "$PAUSE_REF" "$out"
  rm -rf "$tmp"
}

build_dockerfile() {  # image out
  local img=$1 out=$2 df ref
  df=$(dockerfile_of "$img"); ref=$(ref_of "$img")
  # The base may be only in its archive (buildah's storage is a scratch area).
  buildah_ inspect --type image "$BASE_REF" >/dev/null 2>&1 \
    || buildah_ pull --quiet "docker-archive:$(archive_of base)" >/dev/null
  log "$img: buildah build -f $df (base $BASE_REF)"
  # The whole build output goes to a log; its STEP lines show progress.
  local blog="$IMAGES_DIR/$img.build.log"
  scratch_clean
  check_space "$img"
  (cd "$REPO_ROOT" && buildah_ build --isolation chroot --layers=false --pull=never \
    --build-arg "BASE_IMAGE=$BASE_REF" "${RUN_MOUNTS[@]}" \
    --ignorefile "$df.dockerignore" -f "$df" -t "$ref" . > "$blog" 2>&1 &
    pid=$!; tail -n +1 -f --pid "$pid" "$blog" | grep --line-buffered -o '\[[0-9/]*\] STEP [0-9].\{0,100\}' | sed -u 's/^/  /' >&2
    wait "$pid") || { tail -n 40 "$blog" >&2; scratch_clean; die "building $img failed (the build log: $blog)"; }
  push_archive "$ref" "$out"
  # The archive is the cache: drop the image and its build stages from buildah's
  # storage (only the base stays), or every build would keep gigabytes.
  buildah_ rmi -f "$ref" >/dev/null 2>&1 || true
  buildah_ rmi --prune >/dev/null 2>&1 || true
  scratch_clean
}

build_one() {
  local img=$1 out
  out=$(archive_of "$img")
  [[ -s $out ]] && return 0
  local t0=$SECONDS tmp="$out.partial"
  rm -f "$tmp" "$tmp.tar"
  case $img in
    base) build_base "$tmp" ;;
    pause) build_pause "$tmp" ;;
    operator|trainer) build_one base; build_dockerfile "$img" "$tmp" ;;
    *) die "unknown image '$img' (base, pause, operator, trainer)" ;;
  esac
  # Older archives of this image are stale now.
  find "$IMAGES_DIR" -maxdepth 1 \( -name "$img-*.tar" -o -name "$img-*.tar.zst" \) ! -name "$(basename "$out")" -delete
  mv "$tmp" "$out"
  log "$img: $(ref_of "$img") built in $((SECONDS - t0))s ($(du -h "$out" | cut -f1))"
}

import_mark() {  # image -> the name of the record an import of its current build leaves in the runtime's markdir
  echo "imported-$1-$(basename "$(archive_of "$1")" .tar.zst)"
}

user_refs() {  # markdir: the names users loaded into this runtime (hack/user-image.sh records them in full)
  cat "$1/user-images" 2>/dev/null || true
}

import_all() {  # socket markdir: import every image this runtime does not hold yet
  local sock=$1 marks=$2 img out mark changed=0
  mkdir -p "$marks"
  for img in pause operator trainer; do
    out=$(archive_of "$img")
    [[ -s $out ]] || die "$img is not built: hack/images.sh build"
    # The runtime keeps its images across cluster restarts: import only a new build.
    mark="$marks/$(import_mark "$img")"
    [[ -f $mark ]] && continue
    log "importing $(ref_of "$img") into $sock"
    # An import that was killed leaves its content held by ctr's 24-hour lease
    # (gigabytes, for the trainer): let it go, the import below redoes the work.
    local lease
    for lease in $(ctr_ "$sock" leases ls -q 2>/dev/null || true); do ctr_ "$sock" leases rm "$lease" >/dev/null 2>&1 || true; done
    # Unpacked layers are dropped from the content store (the snapshots hold them).
    zstd -q -d -c "$out" | ctr_ "$sock" images import --local --discard-unpacked-layers - >/dev/null || true
    # The whole list first: `ls | grep -q` under pipefail fails when grep stops reading early
    # and ctr dies of SIGPIPE (it did, once the node held enough image names).
    local names; names=$(ctr_ "$sock" images ls -q 2>/dev/null || true)
    grep -q -e "/$(ref_of "$img")\$" -e "^$(ref_of "$img")\$" <<<"$names" \
      || die "ctr import of $out into $sock failed"
    rm -f "$marks/imported-$img-"*
    touch "$mark"
    changed=1
  done
  [[ $changed == 1 ]] || return 0
  # Only the names pods use stay (an import also records the archive's own
  # names); what they replaced is garbage, and a synchronous removal runs
  # containerd's collector over it.
  # Images users loaded (hack/user-image.sh) stay too.
  local keep name
  keep="^($(ref_of pause)|.*/library/$(ref_of operator)|.*/library/$(ref_of trainer))\$"
  for name in $(ctr_ "$sock" images ls -q | grep -E -v "$keep" | grep -v -x -F -f <(user_refs "$marks")); do
    ctr_ "$sock" images rm --sync "$name" >/dev/null || true
  done
}

cmd=${1:-build}; shift || true
case $cmd in
  build)
    need_tools
    # One build at a time (make demo and make test started together share the cache).
    exec 7>"$IMAGES_DIR/build.lock"
    flock 7
    imgs=("$@"); [[ ${#imgs[@]} -gt 0 ]] || imgs=(base pause operator trainer)
    for i in "${imgs[@]}"; do build_one "$i"; done ;;
  import) import_all "$@" ;;
  archive) archive_of "$1" ;;
  mark) import_mark "$1" ;;
  list) for i in base pause operator trainer; do a=$(archive_of "$i"); printf '%-9s %-36s %s\n' "$i" "$(ref_of "$i")" \
          "$([[ -s $a ]] && du -h "$a" | cut -f1 || echo 'not built')"; done ;;
  *) echo "usage: $0 build [image...] | import SOCKET MARKDIR | archive NAME | mark NAME | list" >&2; exit 2 ;;
esac
