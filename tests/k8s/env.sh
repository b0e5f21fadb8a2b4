# Shared settings of the local Kubernetes harness (sourced by the tests/k8s/*.sh scripts).
#
# Everything the harness makes lives under one directory, $LOWTIDE_K8S_HOME
# (default ~/.cache/lowtide-k8s):
#
#   bin/            kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
#                   kubectl coredns skaffold   (built once from their Go modules, kept)
#   build/          the Go wrapper module the Kubernetes binaries are built from (kept)
#   images/         base-<suite>.tar: Debian rootfs from debootstrap (kept)
#   run/            one cluster's state: PKI, etcd data, containerd/dockerd roots, logs, pids,
#                   kubeconfig, PersistentVolume directories   (removed by `make k8s-down`)
#
# Versions: the Kubernetes release kind's and minikube's current node images carry.
K8S_VERSION=${K8S_VERSION:-v1.31.4}
COREDNS_VERSION=${COREDNS_VERSION:-v1.11.4}
SKAFFOLD_VERSION=${SKAFFOLD_VERSION:-v2.16.1}
DEBIAN_SUITE=${DEBIAN_SUITE:-bookworm}
LOWTIDE_K8S_HOME=${LOWTIDE_K8S_HOME:-$HOME/.cache/lowtide-k8s}
K8S_BIN=$LOWTIDE_K8S_HOME/bin
K8S_RUN=$LOWTIDE_K8S_HOME/run
K8S_IMAGES=$LOWTIDE_K8S_HOME/images
KUBECONFIG=$K8S_RUN/kubeconfig
export KUBECONFIG LOWTIDE_K8S_HOME

# Network layout (a single node).
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC_IP=10.96.0.1
POD_CIDR=10.244.0.0/16
CLUSTER_DOMAIN=cluster.local
APISERVER_PORT=6443
ETCD_CLIENT_PORT=23790
ETCD_PEER_PORT=23800
# images the harness builds and loads into the node's containerd
LOWTIDE_IMAGE=${LOWTIDE_IMAGE:-lowtide:dev}
LOWTIDE_SPARK_IMAGE=${LOWTIDE_SPARK_IMAGE:-lowtide-spark:dev}
BASE_IMAGE_TAG=lowtide-base:$DEBIAN_SUITE
PAUSE_IMAGE=lowtide-pause:1
REDIS_IMAGE=lowtide-redis:7

k8s_log() { printf '[k8s %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
k8s_die() { printf '[k8s] ERROR: %s\n' "$*" >&2; exit 1; }

# phase timing: `phase NAME` starts a phase and reports the previous one's duration
_phase_name="" _phase_t0=0
phase() {
  local now=$SECONDS
  if [ -n "$_phase_name" ]; then
    printf '[k8s] phase %-28s %4ds\n' "$_phase_name" $((now - _phase_t0)) | tee -a "${K8S_PHASES_FILE:-/dev/null}"
  fi
  _phase_name=${1:-} _phase_t0=$now
}

# the node's IP: the first global IPv4 address that is not loopback (kubelet and kube-proxy
# refuse 127.0.0.1); a dummy interface provides one when the machine has none
node_ip() {
  local ip
  ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '$2 != "lowtide0" {split($4, a, "/"); print a[1]; exit}')
  if [ -z "$ip" ]; then
    ip=$(ip -4 -o addr show dev lowtide0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
  fi
  echo "$ip"
}
