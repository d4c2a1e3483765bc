#!/usr/bin/env bash
# Your own image on the local cluster's real nodes, as `kind load` does for kind.
#
#   hack/user-image.sh build NAME DOCKERFILE [CONTEXT]   build NAME with buildah (FROM cohort-trainer:<tag>
#                                                        works as written), then load it
#   hack/user-image.sh load NAME|ARCHIVE                 import an image into every real node
#   hack/user-image.sh remove NAME                       remove it from every node and Cohort's buildah storage
#
# (make user-image IMAGE=NAME DOCKERFILE=... [CONTEXT=...] and make load-image IMAGE=NAME|ARCHIVE.)
#
# load takes NAME from buildah's storage (Cohort's, where `build` puts it, then
# the default one, where a plain `buildah build` does), or ARCHIVE: a file a user
# built elsewhere (`docker save`, `podman save`, `buildah push NAME
# docker-archive:FILE:NAME`, an OCI archive), plain or compressed (.zst, .gz).
# A NAME travels without the layers every node has already unpacked (an image
# FROM the trainer: only its own layers); an ARCHIVE is imported whole.
# Each node's containerd imports it under the names it carries, as pods name
# them (my-team-trainer:1 is docker.io/library/my-team-trainer:1), and keeps it
# across cluster restarts. Pods pull a :latest (or untagged) image always, and
# these nodes reach no registry: tag it, or set spec.imagePullPolicy: IfNotPresent.
#
# build runs buildah as hack/images.sh does (chroot isolation, no daemon, the
# host's pip configuration mounted for RUN steps), in Cohort's buildah storage,
# where the trainer and base images are put first (once per trainer build).
source "$(dirname "${BASH_SOURCE[0]}")/image-store.sh"

TRAINER_REF="cohort-trainer:$TAG"
WORK=""
trap '[[ -z $WORK ]] || rm -rf "$WORK"' EXIT

nodes() {  # "socket markdir" of every running real node, or die saying how to start them
  "$HACK_DIR/nodes.sh" status >/dev/null 2>&1 || die "the local cluster's real nodes are not running: make cluster-up"
  "$HACK_DIR/nodes.sh" runtimes
}

names_in() {  # archive (plain tar) -> the image names it carries, one a line
  python3 - "$1" <<'EOF'
import json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    members = set(t.getnames())
    if "manifest.json" in members:  # docker-archive
        for m in json.load(t.extractfile("manifest.json")):
            print(*(m.get("RepoTags") or []), sep="\n")
    elif "index.json" in members:  # OCI archive
        for m in json.load(t.extractfile("index.json")).get("manifests", []):
            a = m.get("annotations") or {}
            n = a.get("io.containerd.image.name") or a.get("org.opencontainers.image.ref.name")
            if n:
                print(n)
    else:
        sys.exit(f"{sys.argv[1]}: neither a docker-archive (manifest.json) nor an OCI archive (index.json)")
EOF
}

plain_tar() {  # archive out: decompress a .zst/.gz archive into out, or link a plain one
  case $(head -c 4 "$1" | od -An -tx1 | tr -d ' \n') in  # the magic numbers
    28b52ffd) log "decompressing $1"; zstd -q -d -f "$1" -o "$2" ;;
    1f8b*) log "decompressing $1"; gzip -d -c "$1" > "$2" ;;
    *) ln -sf "$(realpath "$1")" "$2" ;;
  esac
}

from_storage() {  # name out runtimes: an OCI archive of name from buildah's storage (Cohort's, else the default)
  local b
  if buildah_ inspect --type image "$1" >/dev/null 2>&1; then b=buildah_
  elif buildah inspect --type image "$1" >/dev/null 2>&1; then b=buildah
  else
    die "no image '$1' in buildah's storage ($IMAGES_DIR/storage, nor buildah's default) and no such file; build it (hack/user-image.sh build), or pass an archive"
  fi
  # A layer that every node has already unpacked (the trainer's, under a user
  # image built FROM it: 4.7 GB) is not exported: its blob in the OCI layout is a
  # sparse placeholder of the right size, which buildah's push takes as present
  # and skips, and which the archive leaves out. containerd's import then finds
  # the layer's snapshot by its chain ID and does not ask for the blob.
  local layout="$WORK/layout" sock marks
  mkdir -p "$layout/blobs/sha256"
  while read -r sock marks; do
    ctr_ "$sock" snapshots ls | awk 'NR > 1 && $NF == "Committed" { print $1 }' > "$WORK/unpacked.$(basename "$(dirname "$sock")")"
  done <<<"$3"
  "$b" inspect --type image "$1" | python3 -c "$PLACEHOLDERS" "$layout" "$WORK"/unpacked.* > "$WORK/skipped" \
    || die "cannot read the layers of $1"
  log "exporting $1 from buildah's storage: $(skipped_summary "$WORK/skipped")"
  "$b" push --quiet -D "$1" "oci:$layout:$1" >&2 || die "buildah push of $1 failed"
  (cd "$layout" && find . -type f -printf '%P\n' | grep -v -x -F -f <(cut -d' ' -f1 "$WORK/skipped") | tar -cf "$2" -T -) || die "cannot write $2"
}

skipped_summary() {  # file of "path size" lines -> words
  awk '{ n++; b += $2 } END { if (n) printf "%d layer(s), %.1f GB, already on every node, left out", n, b / 1e9; else printf "every layer" }' "$1"
}

# stdin: buildah inspect's JSON; argv: the layout, then one file per node of its
# committed snapshots. Writes a sparse placeholder for each layer whose chain ID
# every node has, and prints "blobs/sha256/HEX SIZE" for each.
PLACEHOLDERS='
import hashlib, json, os, sys
image = json.load(sys.stdin)
layout, nodes = sys.argv[1], [set(open(f).read().split()) for f in sys.argv[2:]]
layers = json.loads(image["Manifest"])["layers"]
diff_ids = image["OCIv1"]["rootfs"]["diff_ids"]
assert len(layers) == len(diff_ids), "the manifest and the config disagree on the layers"
chain = None
for layer, diff_id in zip(layers, diff_ids):
    chain = diff_id if chain is None else "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    if nodes and all(chain in n for n in nodes):
        path = "blobs/sha256/" + layer["digest"].removeprefix("sha256:")
        with open(os.path.join(layout, path), "wb") as f:
            f.truncate(layer["size"])
        print(path, layer["size"])
'

load() {  # name|archive
  local src=$1 tar names n sock marks
  [[ -n $src ]] || die "which image? hack/user-image.sh load NAME|ARCHIVE"
  local runtimes; runtimes=$(nodes)
  WORK=$(mktemp -d "$TMPDIR/load.XXXX")  # removed on exit, also by a failure
  tar="$WORK/image.tar"
  if [[ -f $src ]]; then plain_tar "$src" "$tar"; else from_storage "$src" "$tar" "$runtimes"; fi
  names=$(names_in "$tar") || die "cannot read the image names in $src"
  [[ -n $names ]] || die "$src names no image (a docker-archive's RepoTags, an OCI archive's ref.name): tag it and save it again"
  for n in $names; do
    local last=${n##*/}
    [[ $last == *:* && $last != *:latest ]] && continue
    log "warning: $n is :latest (or untagged): pods pull it always and fail here; tag it, or set spec.imagePullPolicy: IfNotPresent"
  done
  local pids=()
  while read -r sock marks; do import_one "$sock" "$marks" "$tar" "$names" & pids+=($!); done <<<"$runtimes"
  wait_all "${pids[@]}" || die "loading $src failed (above)"
  log "loaded $(tr '\n' ' ' <<<"$names")into $(wc -l <<<"$runtimes") node(s)"
}

import_one() {  # socket markdir tar names: import the archive into one node's containerd
  local sock=$1 marks=$2 tar=$3 names=$4 n have
  log "importing $(tr '\n' ' ' <<<"$names")into $sock"
  ctr_ "$sock" images import --local --discard-unpacked-layers "$tar" >/dev/null || die "ctr import into $sock failed"
  have=$(ctr_ "$sock" images ls -q)
  mkdir -p "$marks"
  for n in $names; do
    local full; full=$(normalized "$n")
    # An OCI archive's ref.name is imported as written (my-image:1); the kubelet asks for the full name.
    if ! grep -qxF "$full" <<<"$have" && grep -qxF "$n" <<<"$have"; then
      ctr_ "$sock" images tag --force "$n" "$full" >/dev/null && ctr_ "$sock" images rm "$n" >/dev/null
      have=$(ctr_ "$sock" images ls -q)
    fi
    grep -qxF "$full" <<<"$have" || die "$sock holds no $full after the import"
    # hack/images.sh, re-importing Cohort's images, removes names it does not know; not these.
    grep -qxF "$full" "$marks/user-images" 2>/dev/null || echo "$full" >> "$marks/user-images"
  done
}

normalized() {  # name -> as pods' images resolve: my-image:1 -> docker.io/library/my-image:1
  local first=${1%%/*}
  if [[ $1 != */* ]]; then echo "docker.io/library/$1"
  elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then echo "$1"
  else echo "docker.io/$1"; fi
}

remove() {  # name: from every real node and Cohort's buildah storage
  local name=$1 sock marks n
  [[ -n $name ]] || die "which image? hack/user-image.sh remove NAME"
  while read -r sock marks; do
    for n in $(ctr_ "$sock" images ls -q | grep -x -F -e "$name" -e "$(normalized "$name")" -e "localhost/$name" || true); do
      ctr_ "$sock" images rm --sync "$n" >/dev/null
      log "removed $n from $sock"
    done
    if [[ -f $marks/user-images ]]; then
      grep -v -x -F -e "$name" -e "$(normalized "$name")" -e "localhost/$name" "$marks/user-images" > "$marks/user-images.new" || true
      mv "$marks/user-images.new" "$marks/user-images"
    fi
  done < <(nodes)
  if buildah_ rmi -f "$name" >/dev/null 2>&1; then log "removed $name from $IMAGES_DIR/storage"; fi
}

trainer_in_storage() {  # put Cohort's trainer image (and base) into Cohort's buildah storage, once per build
  "$HACK_DIR/images.sh" build base trainer
  local archive mark; archive=$("$HACK_DIR/images.sh" archive trainer)
  mark="$IMAGES_DIR/storage-has-$(basename "$archive" .tar.zst)"
  [[ -f $mark ]] && buildah_ inspect --type image "$TRAINER_REF" >/dev/null 2>&1 && return 0
  log "putting $TRAINER_REF into buildah's storage ($IMAGES_DIR/storage; once per trainer build)"
  buildah_ rmi -f "$TRAINER_REF" >/dev/null 2>&1 || true
  local tar; tar="$TMPDIR/trainer-pull.tar"
  zstd -q -d -f "$archive" -o "$tar"
  buildah_ pull --quiet "docker-archive:$tar" >/dev/null || { rm -f "$tar"; die "buildah pull of $archive failed"; }
  rm -f "$tar" "$IMAGES_DIR"/storage-has-trainer-*
  buildah_ tag "$(buildah_ images -q --filter reference="*cohort-trainer:$TAG" | head -n 1)" "$TRAINER_REF"
  touch "$mark"
}

build() {  # name dockerfile [context]
  local name=$1 df=$2 ctx=${3:-}
  [[ -n $name && -n $df ]] || die "usage: hack/user-image.sh build NAME DOCKERFILE [CONTEXT]"
  [[ -f $df ]] || die "no Dockerfile at $df"
  ctx=${ctx:-$(dirname "$df")}
  [[ -d $ctx ]] || die "no build context directory at $ctx"
  trainer_in_storage
  log "$name: buildah build -f $df $ctx"
  buildah_ build --isolation chroot --pull=never "${RUN_MOUNTS[@]}" -f "$df" -t "$name" "$ctx" >&2 \
    || die "building $name failed (the build's output is above)"
  load "$name"
}

cmd=${1:-}; shift || true
case $cmd in
  build) build "$@" ;;
  load) load "${1:-}" ;;
  remove) remove "${1:-}" ;;
  *) echo "usage: $0 build NAME DOCKERFILE [CONTEXT] | load NAME|ARCHIVE | remove NAME" >&2; exit 2 ;;
esac
