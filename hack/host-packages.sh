#!/usr/bin/env bash
# Installs the Debian packages that real nodes and image builds need
# ($HOST_PACKAGES in hack/versions.env), once: runc, the CNI plugins, iptables,
# conntrack, mmdebstrap, buildah and zstd. Needs root and apt-get; a machine that has
# them already is left alone.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

missing=()
for p in $HOST_PACKAGES; do
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
done
[[ ${#missing[@]} == 0 ]] && exit 0
[[ $(id -u) == 0 ]] || die "real nodes need these Debian packages, and installing them needs root: ${missing[*]}"
command -v apt-get >/dev/null || die "apt-get not found: install ${missing[*]} (Debian bookworm versions in hack/versions.env)"
log "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
  || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; } \
  || die "apt-get install ${missing[*]} failed"
