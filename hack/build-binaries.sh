#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy, once per
# version, into $COHORT_CACHE/bin/<component>-<version>/ (outside the repo).
# A warm cache makes this a no-op. Prints the directory of each component.
#
#   kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
#               kubelet and kube-proxy (a wrapper module pins every k8s.io staging module, because
#               k8s.io/kubernetes's own go.mod replaces them with ./staging paths)
#   etcd:       a two-line main over go.etcd.io/etcd/server/v3/etcdmain
#   kwok:       kwok (the simulated kubelets) via go install; kwokctl, its cluster manager, is not used
#   helm:       helm via go install
#   containerd: containerd, its runc v2 shim and ctr via go install (real nodes)
#   crictl:     the CRI client (cri-tools) via go install (real nodes)
#   local-path-provisioner: PersistentVolumes on real nodes, via go install
#   kube-router: the NetworkPolicy enforcer of the real nodes, via go install
#   kueue:      the kueue manager via go install, plus its CRDs and RBAC role
#               copied from the module into the cache (hack/kueue.sh applies them)
#   prometheus: prometheus + promtool via go install, with only the Kubernetes
#               service discovery compiled in (Prometheus's own build tags)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# Every binary is linked stripped (-ldflags "-s -w"), so the debug information (DWARF) the compiler writes
# for each package is thrown away at the link: -dwarf=false stops it writing it, which takes about 12 % off a
# cold build (crictl with a fresh build cache, 3 runs each in turn: 57.3 s against 67.1 s wall, the binary
# the same size; docs/benchmarks.md#setup-times).
GCFLAGS="all=-dwarf=false"
# A build cache of our own, removed once every binary is built: it grows to
# several GB over these modules and is of no use until a version changes (the
# binaries themselves are the cache). The module cache is Go's default.
export GOCACHE="$COHORT_CACHE/go-build"
SRC_CACHE="$COHORT_CACHE/src"
mkdir -p "$SRC_CACHE"

# Serialise concurrent builds (e.g. `make demo` and `make test` started together).
exec 9>"$COHORT_CACHE/build.lock"
flock 9

k8s_staging_modules() {
  # The authoritative list is the replace block of k8s.io/kubernetes's go.mod.
  local gomod
  gomod=$(go_module "k8s.io/kubernetes@$K8S_VERSION" GoMod)
  sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod"
}

build_kubernetes() {
  local out="$BIN_CACHE/kubernetes-$K8S_VERSION"
  local b ok=1
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    [[ -x "$out/$b" ]] || ok=0
  done
  [[ $ok == 1 ]] && return 0
  log "building kubernetes $K8S_VERSION (cold: 6-19 min on 2 cores; cached afterwards)"
  local mod="$SRC_CACHE/kubernetes-$K8S_VERSION" staging_ver="v0${K8S_VERSION#v1}"
  mkdir -p "$mod"
  {
    echo "module cohort.dev/hack/kubernetes"
    echo
    echo "go 1.24.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    k8s_staging_modules | while read -r m; do echo "	$m => $m $staging_ver"; done
    echo ")"
  } > "$mod/go.mod"
  cat > "$mod/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  (
    cd "$mod"
    log "resolving modules for kubernetes $K8S_VERSION"
    go mod tidy
    local tmp; tmp=$(mktemp -d "$BIN_CACHE/.kubernetes.XXXX")
    log "compiling kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy"
    go build -trimpath -tags selinux,notest -gcflags "$GCFLAGS" -ldflags "$ld" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
    rm -rf "$out"; mv "$tmp" "$out"
  )
}

build_etcd() {
  local out="$BIN_CACHE/etcd-$ETCD_VERSION"
  [[ -x "$out/etcd" ]] && return 0
  log "building etcd $ETCD_VERSION"
  local mod="$SRC_CACHE/etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  printf 'module cohort.dev/hack/etcd\n\ngo 1.24.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$mod/go.mod"
  cat > "$mod/main.go" <<'GO'
// Command etcd is etcd's own server main, built from the module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (
    cd "$mod"
    go mod tidy
    local tmp; tmp=$(mktemp -d "$BIN_CACHE/.etcd.XXXX")
    go build -trimpath -gcflags "$GCFLAGS" -ldflags "-s -w" -o "$tmp/etcd" .
    rm -rf "$out"; mv "$tmp" "$out"
  )
}

build_go_install() {  # name version binaries... -- packages...
  local name=$1 version=$2; shift 2
  local bins=() pkgs=()
  while [[ $1 != -- ]]; do bins+=("$1"); shift; done; shift
  pkgs=("$@")
  local out="$BIN_CACHE/$name-$version" ok=1
  for b in "${bins[@]}"; do [[ -e "$out/$b" ]] || ok=0; done
  [[ $ok == 1 ]] && return 0
  log "building $name $version"
  local tmp; tmp=$(mktemp -d "$BIN_CACHE/.$name.XXXX")
  local ld="-s -w" tags=""
  [[ $name == helm ]] && ld+=" -X helm.sh/helm/v3/internal/version.version=$version"
  [[ $name == crictl ]] && ld+=" -X sigs.k8s.io/cri-tools/pkg/version.Version=$version"
  [[ $name == containerd ]] && ld+=" -X github.com/containerd/containerd/v2/version.Version=$version"
  [[ $name == kwok ]] && ld+=" -X sigs.k8s.io/kwok/pkg/consts.Version=$version -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$K8S_VERSION"
  [[ $name == kube-router ]] && ld+=" -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$version"
  if [[ $name == prometheus ]]; then
    local v=${version#v0.}  # the module's v0.MMMPP.x is Prometheus M.PP.x
    v="$((${v%%.*} / 100)).$((10#${v%%.*} % 100)).${v#*.}"
    ld+=" -X github.com/prometheus/common/version.Version=$v"
    tags=remove_all_sd,enable_kubernetes_sd
  fi
  GOBIN="$tmp" go install -trimpath -tags "$tags" -gcflags "$GCFLAGS" -ldflags "$ld" "${pkgs[@]/%/@$version}"
  if [[ $name == kueue ]]; then  # the manifests hack/kueue.sh applies, from the same module
    local src; src=$(go_module "sigs.k8s.io/kueue@$version" Dir)
    mkdir -p "$tmp/config"
    cp "$src"/config/components/crd/bases/*.yaml "$src/config/components/rbac/role.yaml" \
       "$src/config/components/webhook/manifests.yaml" "$tmp/config/"
  fi
  rm -rf "$out"; mv "$tmp" "$out"
}

want=${1:-all}
case $want in
  all|kubernetes) build_kubernetes ;;& 
  all|etcd) build_etcd ;;&
  all|kwok) build_go_install kwok "$KWOK_VERSION" kwok -- sigs.k8s.io/kwok/cmd/kwok ;;&
  all|helm) build_go_install helm "$HELM_VERSION" helm -- helm.sh/helm/v3/cmd/helm ;;&
  all|containerd) build_go_install containerd "$CONTAINERD_VERSION" containerd containerd-shim-runc-v2 ctr -- \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr ;;&
  all|crictl) build_go_install crictl "$CRICTL_VERSION" crictl -- sigs.k8s.io/cri-tools/cmd/crictl ;;&
  all|local-path-provisioner) build_go_install local-path-provisioner "$LOCAL_PATH_PROVISIONER_VERSION" \
    local-path-provisioner -- github.com/rancher/local-path-provisioner ;;&
  all|kube-router) build_go_install kube-router "$KUBE_ROUTER_VERSION" kube-router -- \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router ;;&
  all|kueue) build_go_install kueue "$KUEUE_VERSION" kueue config/role.yaml -- sigs.k8s.io/kueue/cmd/kueue ;;&
  all|prometheus) build_go_install prometheus "$PROMETHEUS_VERSION" prometheus promtool -- \
    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool ;;&
  all|kubernetes|etcd|kwok|helm|containerd|crictl|local-path-provisioner|kube-router|kueue|prometheus) ;;
  *) die "unknown component '$want' (all|kubernetes|etcd|kwok|helm|containerd|crictl|local-path-provisioner|kube-router|kueue|prometheus)" ;;
esac
rm -rf "$GOCACHE"
log "binaries ready under $BIN_CACHE"
