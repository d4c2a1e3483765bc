#!/usr/bin/env bash
# Real nodes for the local cluster: per node a kubelet with its own containerd
# (runc, CNI bridge), plus one kube-proxy and one NetworkPolicy enforcer
# (kube-router's firewall controller) for the host's network namespace.
# hack/cluster.sh calls this; see docs/local-cluster.md.
#
#   hack/nodes.sh net-up    host network for pods (before the API server starts)
#   hack/nodes.sh up        start (or reuse) the nodes; waits until every Node is Ready
#   hack/nodes.sh down      stop every pod, container, process, mount and network it made
#   hack/nodes.sh status    exit 0 if every node's processes are alive
#   hack/nodes.sh images    build the images that changed and import them into every node
#   hack/nodes.sh count     print how many real nodes the cluster runs (COHORT_REAL_NODES, default 2)
#   hack/nodes.sh runtimes  print each node's containerd socket and its image marks directory
#
# Node i is `cohort-node-i`: pods get 10.88.i.0/24 on the bridge cohort-br<i>
# (gateway 10.88.i.1). The API server is advertised to pods at 10.87.0.1 (on
# cohort-api, a bridge with no ports), which is what the `kubernetes` Service
# points at. Every node is this machine, so every node's InternalIP is that
# same address (the kubelets differ by port); one enforcer then sees every
# real node's pods as its own. Nothing is routed off this machine: forwarded
# pod traffic may only go to another cohort bridge.
#
# NetworkPolicy is enforced by kube-router (hack/versions.env) with only its firewall
# controller on (iptables + ipset; no service proxy, BGP router or CNI): it
# keeps a chain per pod that policies select, and rejects what none admits.
# Like most enforcers it admits traffic from the node itself (addrtype LOCAL):
# kubelet probes, and here the host-run Prometheus and development operator.
# It runs as its own identity (cohort:kube-router), which may only read pods,
# namespaces, nodes, services, endpoints and NetworkPolicies. (kube-network-policies would be the
# smaller choice, but it needs the nftables queue, which this kernel lacks.)
#
# Security is a real cluster's: each kubelet has its own client certificate
# (system:node:<name>, so the Node authorizer and NodeRestriction apply),
# a serving certificate from the cluster CA, anonymous auth off and webhook
# authentication and authorization on; the API server reaches kubelets with a
# client certificate and verifies theirs.
#
# PersistentVolumeClaims are served by local-path-provisioner (the default
# StorageClass `local-path`), with one directory on this machine shared by
# both nodes, so claims are ReadWriteMany; its helper pods run on the nodes.
#
# Environment: COHORT_REAL_NODES (2), COHORT_KUBELET_PORT (12250: node i uses +i).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${COHORT_CLUSTER_DIR:-$COHORT_CACHE/cluster}
PIDS="$CLUSTER_DIR/pids" LOGS="$CLUSTER_DIR/logs" PKI="$CLUSTER_DIR/pki"
NODES_DIR="$CLUSTER_DIR/nodes"
# Each containerd's root (its images and snapshots) outlives the cluster, like a
# machine's image store: a warm cluster-up imports only images that changed.
CTRD_ROOTS="$COHORT_CACHE/containerd"
RUN_DIR=/run/cohort
N=$REAL_NODES
KUBELET_PORT=${COHORT_KUBELET_PORT:-12250}
K8S_BIN="$BIN_CACHE/kubernetes-$K8S_VERSION"
CTRD_BIN="$BIN_CACHE/containerd-$CONTAINERD_VERSION"
CRICTL="$BIN_CACHE/crictl-$CRICTL_VERSION/crictl"
LPP="$BIN_CACHE/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION/local-path-provisioner"
KUBE_ROUTER="$BIN_CACHE/kube-router-$KUBE_ROUTER_VERSION/kube-router"
VOLUMES="$CLUSTER_DIR/volumes"
KUBECTL=("$K8S_BIN/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig")
API_IP=10.87.0.1
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.96.0.0/16
CNI_BIN=/usr/lib/cni
CGROUP_CONTROLLERS=(cpu cpuacct cpuset memory pids blkio devices freezer systemd)

# Bridges, iptables chains and $RUN_DIR are the machine's: one cluster at a
# time may have real nodes. The owner file names its cluster directory.
OWNER="/run/cohort-nodes.owner"

owner() { cat "$OWNER" 2>/dev/null || true; }

mine() {  # 0 if no other cluster's real nodes run here
  local o; o=$(owner)
  [[ -z $o || $o == "$CLUSTER_DIR" ]] && return 0
  # The other cluster's kubelets are gone: its nodes are leftovers we may clean.
  ! ls "$o"/pids/kubelet-*.pid >/dev/null 2>&1 || ! kill -0 $(cat "$o"/pids/kubelet-*.pid) 2>/dev/null
}

node_name() { echo "cohort-node-$1"; }
gateway_ip() { echo "10.88.$1.1"; }  # node i's bridge address
NODE_IP=$API_IP  # every node's InternalIP (see above)
sock_of() { echo "$RUN_DIR/node-$1/containerd.sock"; }

# --- host network --------------------------------------------------------------

net_up() {
  [[ $(id -u) == 0 ]] || die "real nodes need root (network namespaces, cgroups, mounts)"
  mine || die "the real nodes of the cluster in $(owner) run on this machine: stop it first (its hack/cluster.sh down), or start this one with COHORT_REAL_NODES=0"
  echo "$CLUSTER_DIR" > "$OWNER"
  "$HACK_DIR/host-packages.sh"
  mkdir -p "$CLUSTER_DIR"
  [[ -f $CLUSTER_DIR/host-sysctls ]] || sysctl -n net.ipv4.ip_forward vm.overcommit_memory kernel.panic \
    kernel.panic_on_oops | paste -sd' ' > "$CLUSTER_DIR/host-sysctls"
  # A port-less bridge: this kernel has no dummy interfaces.
  ip link show cohort-api >/dev/null 2>&1 || ip link add cohort-api type bridge
  ip addr replace "$API_IP/32" dev cohort-api
  ip link set cohort-api up
  local i
  for ((i = 0; i < N; i++)); do
    ip link show "cohort-br$i" >/dev/null 2>&1 || ip link add "cohort-br$i" type bridge
    ip addr replace "$(gateway_ip "$i")/24" dev "cohort-br$i"
    ip link set "cohort-br$i" up
  done
  sysctl -qw net.ipv4.ip_forward=1
  # The API server listens on every address (pods reach it at $API_IP):
  # only loopback and the cohort interfaces may connect to it.
  local port=${COHORT_APISERVER_PORT:-16443}
  iptables -N COHORT-INPUT 2>/dev/null || iptables -F COHORT-INPUT
  iptables -A COHORT-INPUT -i lo -j RETURN
  iptables -A COHORT-INPUT -i cohort+ -j RETURN
  iptables -A COHORT-INPUT -p tcp --dport "$port" -j DROP
  iptables -C INPUT -j COHORT-INPUT 2>/dev/null || iptables -I INPUT -j COHORT-INPUT
  # Pod traffic is forwarded only between the cohort bridges, never off the machine.
  iptables -N COHORT-FORWARD 2>/dev/null || iptables -F COHORT-FORWARD
  iptables -A COHORT-FORWARD -s "$POD_CIDR" -o cohort+ -j RETURN
  iptables -A COHORT-FORWARD -d "$POD_CIDR" -o cohort+ -j RETURN
  iptables -A COHORT-FORWARD -s "$POD_CIDR" -j DROP
  iptables -C FORWARD -j COHORT-FORWARD 2>/dev/null || iptables -I FORWARD -j COHORT-FORWARD
}

net_down() {
  local i
  for ((i = 0; i < 16; i++)); do ip link del "cohort-br$i" 2>/dev/null || true; done
  ip link del cohort-api 2>/dev/null || true
  local c
  for c in INPUT:COHORT-INPUT FORWARD:COHORT-FORWARD; do
    while iptables -D "${c%%:*}" -j "${c#*:}" 2>/dev/null; do :; done
    iptables -F "${c#*:}" 2>/dev/null || true
    iptables -X "${c#*:}" 2>/dev/null || true
  done
  # The kubelets', kube-proxy's and kube-router's chains (they leave them behind): unhook them
  # from the built-in chains, then flush all, then delete all.
  local t chain rule chains
  for t in filter nat mangle; do
    chains=$(iptables -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[A-Z0-9-]*\)$/\1/p' || true)
    [[ -n $chains ]] || continue
    iptables -t "$t" -S | { grep -E -- '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j KUBE-' || true; } \
      | sed 's/^-A/-D/' | while read -r rule; do eval "iptables -t $t $rule" 2>/dev/null || true; done
    for chain in $chains; do iptables -t "$t" -F "$chain" 2>/dev/null || true; done
    for chain in $chains; do iptables -t "$t" -X "$chain" 2>/dev/null || true; done
  done
  # kube-router's ipsets (named KUBE-*), once no rule refers to them.
  local set
  for set in $(ipset list -n 2>/dev/null | grep '^KUBE-' || true); do ipset destroy "$set" 2>/dev/null || true; done
  if [[ -f $CLUSTER_DIR/host-sysctls ]]; then
    read -r fwd ovc panic oops < "$CLUSTER_DIR/host-sysctls"
    sysctl -qw net.ipv4.ip_forward="$fwd" vm.overcommit_memory="$ovc" kernel.panic="$panic" \
      kernel.panic_on_oops="$oops" || true
    rm -f "$CLUSTER_DIR/host-sysctls"
  fi
}

# --- certificates and configs --------------------------------------------------

write_node_files() {  # i
  local i=$1 name dir ip port
  name=$(node_name "$i"); dir="$NODES_DIR/$name"; ip=$(gateway_ip "$i"); port=$((KUBELET_PORT + i))
  mkdir -p "$dir"/{kubelet,pod-logs,cni/net.d,cni/ipam} "$RUN_DIR/node-$i" "$CTRD_ROOTS/$name"
  grep -q "IP Address:$NODE_IP\b" <<<"$(openssl x509 -noout -ext subjectAltName -in "$PKI/$name.crt" 2>/dev/null)" \
    || sign_cert "$name" "/O=system:nodes/CN=system:node:$name" "DNS:$name,IP:$NODE_IP"
  write_kubeconfig "$dir/kubeconfig" "$name"
  cat > "$dir/cni/net.d/10-cohort.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "$name",
  "plugins": [
    {"type": "bridge", "bridge": "cohort-br$i", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
              "ranges": [[{"subnet": "10.88.$i.0/24", "gateway": "$ip"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
  cat > "$dir/containerd.toml" <<TOML
version = 3
root = "$CTRD_ROOTS/$name"
state = "$RUN_DIR/node-$i/containerd"
[grpc]
  address = "$(sock_of "$i")"
[plugins.'io.containerd.internal.v1.opt']
  path = "$CTRD_ROOTS/$name/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "cohort.local/pause:$PAUSE_VERSION"
[plugins.'io.containerd.cri.v1.runtime']
  # This machine lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj.
  restrict_oom_score_adj = true
  # Pod network namespaces under our state dir, not /run/netns: down removes them with it.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$CNI_BIN"]
    conf_dir = "$dir/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        Root = "$RUN_DIR/node-$i/runc"
        SystemdCgroup = false
TOML
  cat > "$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "$NODE_IP"
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((port + 100))
tlsCertFile: "$PKI/$name.crt"
tlsPrivateKeyFile: "$PKI/$name.key"
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: "unix://$(sock_of "$i")"
cgroupDriver: cgroupfs
cgroupRoot: /$name
failSwapOn: false
failCgroupV1: false
podLogsDir: "$dir/pod-logs"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%", imagefs.inodesFree: "0%"}
serializeImagePulls: false
# No resolver in pods: nothing in the cluster needs names, and the host's
# nameservers are off the machine, where pod traffic may not go. (c10d looks up
# each peer's name; with an unreachable nameserver every lookup waited out a
# 10 s timeout, in every recovery.)
resolvConf: ""
clusterDomain: cluster.local
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
YAML
}

make_cgroup_root() {  # name: the kubelet's cgroupRoot in every v1 controller
  local c d
  for c in "${CGROUP_CONTROLLERS[@]}"; do
    d=/sys/fs/cgroup/$c/$1
    [[ -d /sys/fs/cgroup/$c ]] || continue
    mkdir -p "$d"
    if [[ $c == cpuset ]]; then
      cat /sys/fs/cgroup/cpuset/cpuset.cpus > "$d/cpuset.cpus"
      cat /sys/fs/cgroup/cpuset/cpuset.mems > "$d/cpuset.mems"
    fi
  done
}

remove_cgroup_root() {  # name: leaves first (rmdir only removes empty cgroups)
  local c
  for c in "${CGROUP_CONTROLLERS[@]}"; do
    [[ -d /sys/fs/cgroup/$c/$1 ]] || continue
    find "/sys/fs/cgroup/$c/$1" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

# --- processes -----------------------------------------------------------------

start() {  # name cmd...
  local name=$1; shift
  : > "$LOGS/$name.log"
  start_recorded "$PIDS/$name.pid" "$LOGS/$name.log" "$@"
}

DEVICE_PLUGIN_SOCK=/var/lib/kubelet/device-plugins/kubelet.sock

socket_id() {  # path: its inode and change time (ns), or "none": a re-created file differs
  stat -c '%i %z' "$1" 2>/dev/null || echo none
}

socket_replaced() {  # path id_before: a socket is there, and not the one that was
  [[ -S $1 && $(socket_id "$1") != "$2" ]]
}

wait_until() {  # what timeout_s pidfile command...
  local what=$1 timeout=$2 pidfile=$3 rc=0 logfile; shift 3
  poll_ready "$timeout" "$pidfile" "$@" || rc=$?
  [[ $rc == 0 ]] && return 0
  logfile="$LOGS/$(basename "$pidfile" .pid).log"
  tail -n 20 "$logfile" >&2 || true
  [[ $rc == 1 ]] && die "$what exited during start-up; its log: $logfile"
  die "$what was not ready within ${timeout}s; its log: $logfile"
}

healthy() {
  local i
  pid_alive "$PIDS/kube-proxy.pid" && pid_alive "$PIDS/local-path-provisioner.pid" || return 1
  pid_alive "$PIDS/kube-router.pid" || return 1
  for ((i = 0; i < N; i++)); do
    pid_alive "$PIDS/containerd-$i.pid" && pid_alive "$PIDS/kubelet-$i.pid" || return 1
  done
}

import_images() {  # import the built images each node's containerd lacks, every node at once (every containerd runs)
  # At once, not one node after the other: the trainer's import into two fresh nodes took 91 s so against
  # 140-144 s (docs/benchmarks.md#setup-times); each import is one pipe of zstd, ctr and containerd's unpack.
  local i pids=()
  for ((i = 0; i < N; i++)); do
    "$HACK_DIR/images.sh" import "$(sock_of "$i")" "$CTRD_ROOTS/$(node_name "$i")" & pids+=($!)
  done
  wait_all "${pids[@]}" || die "importing the images into the nodes failed: the lines above say which"
}

images() {  # build what changed, import it into every node when they run (stopped nodes import at start: up)
  "$HACK_DIR/images.sh" build pause operator trainer
  healthy || return 0
  import_images
}

up() {
  if healthy; then log "reusing $N real nodes"; images; return 0; fi
  "$HACK_DIR/build-binaries.sh" >&2
  mine || die "the real nodes of the cluster in $(owner) run on this machine: stop it first (its hack/cluster.sh down), or start this one with COHORT_REAL_NODES=0"
  stop_nodes >/dev/null 2>&1 || true
  net_up
  mkdir -p "$LOGS" "$PIDS" "$NODES_DIR"
  local t0=$SECONDS i name before
  "$HACK_DIR/images.sh" build pause operator trainer
  for ((i = 0; i < N; i++)); do
    name=$(node_name "$i")
    write_node_files "$i"
    make_cgroup_root "$name"
    log "starting containerd $CONTAINERD_VERSION for $name"
    PATH="$CTRD_BIN:$PATH" start "containerd-$i" "$CTRD_BIN/containerd" --config "$NODES_DIR/$name/containerd.toml"
    wait_until "containerd of $name" 30 "$PIDS/containerd-$i.pid" "$CTRD_BIN/ctr" --address "$(sock_of "$i")" version
  done
  import_images  # not images: healthy() is false until the kubelets below run
  for ((i = 0; i < N; i++)); do
    name=$(node_name "$i")
    log "starting kubelet $K8S_VERSION as $name ($NODE_IP:$((KUBELET_PORT + i)))"
    before=$(socket_id "$DEVICE_PLUGIN_SOCK")
    start "kubelet-$i" "$K8S_BIN/kubelet" --config "$NODES_DIR/$name/kubelet.yaml" \
      --kubeconfig "$NODES_DIR/$name/kubeconfig" --root-dir "$NODES_DIR/$name/kubelet" \
      --cert-dir "$NODES_DIR/$name/kubelet/pki" --hostname-override "$name" --node-ip "$NODE_IP" \
      --node-labels "cohort.dev/node-kind=real"
    # Every kubelet binds the same device-plugin socket (its path ignores --root-dir). One
    # that starts while another is creating it can fail with "address already in use", so
    # the next starts only once this one has its own socket (nothing here uses device plugins).
    wait_until "kubelet of $name (its device-plugin socket)" 60 "$PIDS/kubelet-$i.pid" \
      socket_replaced "$DEVICE_PLUGIN_SOCK" "$before"
  done
  [[ -f $PKI/kube-proxy.crt ]] || sign_cert kube-proxy "/CN=system:kube-proxy"
  write_kubeconfig "$NODES_DIR/kube-proxy.kubeconfig" kube-proxy
  log "starting kube-proxy (iptables mode; one for the host's network namespace)"
  start kube-proxy "$K8S_BIN/kube-proxy" --kubeconfig "$NODES_DIR/kube-proxy.kubeconfig" \
    --hostname-override "$(node_name 0)" --cluster-cidr "$POD_CIDR" --proxy-mode iptables \
    --bind-address 127.0.0.1 --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0
  for ((i = 0; i < N; i++)); do
    wait_until "kubelet of $(node_name "$i")" 90 "$PIDS/kubelet-$i.pid" \
      "${KUBECTL[@]}" wait --for=condition=Ready "node/$(node_name "$i")" --timeout=1s
  done
  wait_until kube-proxy 30 "$PIDS/kube-proxy.pid" curl -sf http://127.0.0.1:10256/healthz
  start_network_policy
  start_provisioner
  log "$N real nodes Ready in $((SECONDS - t0))s"
}

start_network_policy() {
  # It watches Services (and their endpoints) even with its service proxy off.
  local_user kube-router "$NODES_DIR/kube-router.kubeconfig" '- apiGroups: [""]
  resources: [pods, namespaces, nodes, services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]'
  log "starting kube-router $KUBE_ROUTER_VERSION (NetworkPolicy only: iptables + ipset)"
  start kube-router "$KUBE_ROUTER" --kubeconfig "$NODES_DIR/kube-router.kubeconfig" \
    --hostname-override "$(node_name 0)" --run-firewall=true --run-router=false --run-service-proxy=false \
    --run-loadbalancer=false --enable-cni=false --enable-ipv4=true --enable-ipv6=false \
    --service-cluster-ip-range "$SERVICE_CIDR" --health-port 0 --metrics-port 0
  # Ready once its forward chain is hooked in: policies apply from then on.
  wait_until kube-router 60 "$PIDS/kube-router.pid" netpol_hooked
}

netpol_hooked() { grep -q -- '-j KUBE-ROUTER-FORWARD' <<<"$(iptables -S FORWARD)"; }

start_provisioner() {
  local ns=local-path-storage dir="$NODES_DIR/local-path"
  mkdir -p "$dir" "$VOLUMES"
  cat > "$dir/config.json" <<JSON
{"sharedFileSystemPath": "$VOLUMES"}
JSON
  # Helper pods make and remove each volume's directory: as root, on a real node.
  cat > "$dir/helperPod.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: helper-pod}
spec:
  nodeSelector: {cohort.dev/node-kind: real}
  containers:
  - name: helper-pod
    image: cohort-operator:$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$REPO_ROOT/helm/cohort/Chart.yaml")
    imagePullPolicy: Never
    securityContext: {runAsUser: 0, runAsNonRoot: false}
YAML
  "${KUBECTL[@]}" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: $ns
  labels: {pod-security.kubernetes.io/enforce: privileged}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: local-path-provisioner-service-account, namespace: $ns}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: local-path-config, namespace: $ns}
data:
  setup: |-
    #!/bin/sh
    set -eu
    mkdir -m 0777 -p "\$VOL_DIR"
  teardown: |-
    #!/bin/sh
    set -eu
    rm -rf "\$VOL_DIR"
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local-path
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: rancher.io/local-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
YAML
  log "starting local-path-provisioner $LOCAL_PATH_PROVISIONER_VERSION (volumes in $VOLUMES)"
  start local-path-provisioner "$LPP" start --kubeconfig "$CLUSTER_DIR/kubeconfig" --namespace "$ns" \
    --config "$dir/config.json" --helper-pod-file "$dir/helperPod.yaml" --helper-image unused \
    --service-account-name local-path-provisioner-service-account
  sleep 1
  kill -0 "$(cat "$PIDS/local-path-provisioner.pid")" 2>/dev/null \
    || die "local-path-provisioner exited during start-up; its log: $LOGS/local-path-provisioner.log"
}

own_pids() {  # pids whose command line names this cluster's runtime paths (shims, pause, containers' parents)
  local p
  for p in /proc/[0-9]*; do
    grep -q -e "$RUN_DIR/node-" -e "$NODES_DIR/" -e "$CTRD_ROOTS/" <<<"$({ tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null)" \
      && echo "${p#/proc/}"
  done
}

stop_nodes() {  # every pod, container, process, cgroup and mount of the nodes (not the host network)
  local i name nodes=() kubelets=() runtimes=() rmp=()
  for ((i = 0; i < 16; i++)); do
    [[ -f $PIDS/kubelet-$i.pid || -f $PIDS/containerd-$i.pid ]] || continue
    nodes+=("$i"); kubelets+=("$PIDS/kubelet-$i.pid"); runtimes+=("$PIDS/containerd-$i.pid")
  done
  # In order on each node (kubelet, pods, containerd), every node at once.
  stop_pidfiles "${kubelets[@]}"
  for i in "${nodes[@]}"; do
    # Every pod sandbox and container through the CRI: this also tears down
    # their network namespaces and the CNI's IP allocations.
    if [[ -S $(sock_of "$i") && -x $CRICTL ]]; then
      timeout 60 "$CRICTL" --runtime-endpoint "unix://$(sock_of "$i")" --timeout 20s rmp -af >/dev/null 2>&1 &
      rmp+=($!)
    fi
  done
  for i in "${rmp[@]}"; do wait "$i" || true; done
  stop_pidfiles "${runtimes[@]}"
  stop_pidfiles "$PIDS/kube-proxy.pid" "$PIDS/kube-router.pid" "$PIDS/local-path-provisioner.pid"
  # Shims outlive containerd by design: stop ours (found by our paths), then their containers' cgroups.
  local p
  for p in $(own_pids); do kill -KILL "$p" 2>/dev/null || true; done
  # Container processes left behind (a kubelet or runtime that was killed) are in the nodes' cgroups.
  for ((i = 0; i < 16; i++)); do
    [[ -d /sys/fs/cgroup/pids/$(node_name "$i") ]] || continue
    for p in $(find "/sys/fs/cgroup/pids/$(node_name "$i")" -name cgroup.procs -exec cat {} + 2>/dev/null); do
      kill -KILL "$p" 2>/dev/null || true
    done
    sleep 0.2
    remove_cgroup_root "$(node_name "$i")"
  done
  # Mounts under our directories (pod volumes, the kubelet root bind, rootfs, netns), deepest first.
  local m
  for m in $(awk '{print $5}' /proc/self/mountinfo | grep -e "^$NODES_DIR/" -e "^$RUN_DIR/" -e "^$CTRD_ROOTS/" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$RUN_DIR" "$NODES_DIR" "$VOLUMES"
}

down() {
  if ! mine; then log "the real nodes belong to the cluster in $(owner): left alone"; return 0; fi
  stop_nodes
  net_down
  rm -f "$OWNER"
}

case ${1:-} in
  net-up) net_up ;;
  up) up ;;
  images) images ;;
  down) down; log "real nodes down" ;;
  status) healthy && echo healthy || { echo "not running"; exit 1; } ;;
  count) echo "$N" ;;
  runtimes) for ((i = 0; i < N; i++)); do echo "$(sock_of "$i") $CTRD_ROOTS/$(node_name "$i")"; done ;;
  *) echo "usage: $0 net-up|up|down|status|images|count|runtimes" >&2; exit 2 ;;
esac
