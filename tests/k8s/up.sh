#!/usr/bin/env bash
# Starts a real single-node Kubernetes ($K8S_VERSION, the release kind and minikube run) on this
# machine, everything under $LOWTIDE_K8S_HOME/run (tests/k8s/env.sh):
#
#   etcd -> kube-apiserver -> kube-controller-manager, kube-scheduler
#   containerd (CRI, cgroupfs, CNI bridge 10.244.0.0/24) -> kubelet (node = this machine)
#   kube-proxy (iptables: Services and ClusterIPs work), CoreDNS (on the node IP, as the pods'
#   cluster DNS: Service and StatefulSet pod names resolve), a hostPath PersistentVolume
#   provisioner (tests/k8s/provisioner.py; the default StorageClass "lowtide-hostpath"),
#   dockerd (builds the image; its layer cache is kept in $LOWTIDE_K8S_HOME/docker)
#
# Then writes $KUBECONFIG (cluster-admin). Idempotent: a running cluster is left alone.
# Stop with tests/k8s/down.sh (make k8s-down). Needs root and what build.sh makes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
. "$here/env.sh"
[ "$(id -u)" -eq 0 ] || k8s_die "the harness needs root"
for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl coredns; do
  [ -x "$K8S_BIN/$c" ] || k8s_die "$K8S_BIN/$c missing: run tests/k8s/build.sh (make k8s-build)"
done
if [ -f "$K8S_RUN/up" ] && "$K8S_BIN/kubectl" get --raw /readyz >/dev/null 2>&1; then
  k8s_log "cluster already up ($KUBECONFIG)"; exit 0
fi
# a half-started or crashed cluster: clean it away first
[ -d "$K8S_RUN" ] && bash "$here/down.sh" >/dev/null
mkdir -p "$K8S_RUN"/{pki,logs,pids,etcd,containerd,cni/net.d,kubelet,pv}
PATH=$K8S_BIN:$PATH
pki=$K8S_RUN/pki logs=$K8S_RUN/logs pids=$K8S_RUN/pids

# start NAME CMD...: runs a daemon in its own session, output to logs/NAME.log, pid in pids/NAME
start() {
  local name=$1; shift
  setsid "$@" >"$logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$pids/$name"
}
# wait_for WHAT SECONDS CMD...: polls CMD until it succeeds
wait_for() {
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { tail -n 30 "$logs"/*.log >&2 || true; k8s_die "$what not ready after ${secs}s"; }
    sleep 0.5
  done
}

phase "network"
# A non-loopback node IP: kubelet and kube-proxy need one.
ip_addr=$(node_ip)
if [ -z "$ip_addr" ]; then
  ip link add lowtide0 type dummy 2>/dev/null || true
  ip addr add 10.199.0.1/32 dev lowtide0 2>/dev/null || true
  ip link set lowtide0 up
  ip_addr=$(node_ip)
fi
[ -n "$ip_addr" ] || k8s_die "no node IP"
echo "$ip_addr" > "$K8S_RUN/node-ip"
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
node=$(hostname | tr 'A-Z_' 'a-z-')
echo "$node" > "$K8S_RUN/node-name"

phase "pki"
# One CA signs everything. Components authenticate with client certificates; the harness gives
# them one cluster-admin identity (O=system:masters) instead of per-component identities, as a
# test cluster may: RBAC still applies to every pod's ServiceAccount.
if [ ! -f "$pki/ca.crt" ]; then
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=lowtide-k8s-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    cat > apiserver.ext <<EXT
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,IP:127.0.0.1,IP:$KUBERNETES_SVC_IP,IP:$ip_addr
extendedKeyUsage=serverAuth
EXT
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' > client.ext
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=lowtide-k8s-admin" \
      -keyout admin.key -out admin.csr 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out admin.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  )
fi
"$K8S_BIN/kubectl" config set-cluster lowtide --server="https://127.0.0.1:$APISERVER_PORT" \
  --certificate-authority="$pki/ca.crt" --embed-certs >/dev/null
"$K8S_BIN/kubectl" config set-credentials admin --client-certificate="$pki/admin.crt" \
  --client-key="$pki/admin.key" --embed-certs >/dev/null
"$K8S_BIN/kubectl" config set-context lowtide --cluster=lowtide --user=admin >/dev/null
"$K8S_BIN/kubectl" config use-context lowtide >/dev/null

phase "etcd + control plane"
start etcd etcd --name lowtide --data-dir "$K8S_RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "lowtide=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync
wait_for etcd 60 curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health"

start kube-apiserver kube-apiserver \
  --etcd-servers="http://127.0.0.1:$ETCD_CLIENT_PORT" \
  --secure-port="$APISERVER_PORT" --bind-address=0.0.0.0 --advertise-address="$ip_addr" \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --kubelet-client-certificate="$pki/admin.crt" --kubelet-client-key="$pki/admin.key" \
  --service-account-issuer="https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode=Node,RBAC \
  --allow-privileged=true --enable-priority-and-fairness=false --profiling=false
wait_for kube-apiserver 120 "$K8S_BIN/kubectl" get --raw /readyz

start kube-controller-manager kube-controller-manager --kubeconfig="$KUBECONFIG" \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
  --use-service-account-credentials=true --controllers='*,-nodeipam' \
  --leader-elect=false --profiling=false
start kube-scheduler kube-scheduler --kubeconfig="$KUBECONFIG" --leader-elect=false --profiling=false

phase "containerd + kubelet"
cat > "$K8S_RUN/cni/net.d/10-lowtide.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "lowtide",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$K8S_RUN/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
CNI
cni_bin=/usr/lib/cni
[ -x $cni_bin/bridge ] || cni_bin=/opt/cni/bin
cat > "$K8S_RUN/containerd/config.toml" <<TOML
version = 2
root = "$K8S_RUN/containerd/root"
state = "$K8S_RUN/containerd/state"
[grpc]
  address = "$K8S_RUN/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/library/$PAUSE_IMAGE"
  # the sandbox may not raise OOM scores (it is unprivileged there)
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$cni_bin"
    conf_dir = "$K8S_RUN/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
TOML
start containerd containerd --config "$K8S_RUN/containerd/config.toml"
wait_for containerd 60 ctr -a "$K8S_RUN/containerd.sock" version

# CoreDNS on the node IP serves the cluster domain from the apiserver and forwards the rest.
upstream=$(awk '/^nameserver/ && $2 !~ /^127\./ {print $2; exit}' /etc/resolv.conf)
cat > "$K8S_RUN/Corefile" <<DNS
.:53 {
    bind $ip_addr
    errors
    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG lowtide
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    ${upstream:+forward . $upstream}
    cache 5
}
DNS
start coredns coredns -conf "$K8S_RUN/Corefile"

cat > "$K8S_RUN/kubelet/config.yaml" <<KUBELET
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: Webhook}
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: ["$ip_addr"]
containerRuntimeEndpoint: unix://$K8S_RUN/containerd.sock
# this sandbox's cgroups (v1, no systemd): cgroupfs, no QoS hierarchy, no node allocatable
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
resolvConf: /etc/resolv.conf
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
podCIDR: 10.244.0.0/24
maxPods: 110
KUBELET
start kubelet kubelet --config="$K8S_RUN/kubelet/config.yaml" --kubeconfig="$KUBECONFIG" \
  --root-dir="$K8S_RUN/kubelet/root" --hostname-override="$node" --node-ip="$ip_addr" \
  --cert-dir="$K8S_RUN/kubelet/pki"
cat > "$K8S_RUN/kube-proxy.yaml" <<PROXY
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$KUBECONFIG"}
hostnameOverride: $node
clusterCIDR: $POD_CIDR
mode: iptables
# leave the machine's conntrack sysctls alone (read-only here)
conntrack: {maxPerCore: 0}
PROXY
start kube-proxy kube-proxy --config="$K8S_RUN/kube-proxy.yaml"

phase "docker + images"
# dockerd only builds images: no bridge, no iptables rules of its own (kube-proxy owns those);
# `docker build --network host` reaches the package registries.
mkdir -p "$LOWTIDE_K8S_HOME/docker"
start dockerd dockerd --data-root "$LOWTIDE_K8S_HOME/docker" --exec-root "$K8S_RUN/docker-exec" \
  --host "unix://$K8S_RUN/docker.sock" --pidfile "$K8S_RUN/docker.pid" \
  --bridge=none --iptables=false --ip6tables=false --storage-driver=overlay2
export DOCKER_HOST=unix://$K8S_RUN/docker.sock DOCKER_BUILDKIT=0
wait_for dockerd 60 docker version
base_tar=$K8S_IMAGES/base-$DEBIAN_SUITE.tar
[ -s "$base_tar" ] || k8s_die "$base_tar missing: run tests/k8s/build.sh"
if ! docker image inspect "$BASE_IMAGE_TAG" >/dev/null 2>&1; then
  docker import "$base_tar" "$BASE_IMAGE_TAG-rootfs" >/dev/null
  # The base trusts what this machine trusts: extra CAs (a TLS-inspecting egress proxy's, say) are
  # copied in, and pip is told to use the system bundle, so `pip install` in the build reaches PyPI
  # exactly as the host's pip does.
  ctx=$(mktemp -d)
  mkdir -p "$ctx/ca"
  cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$ctx/pip.conf"
  printf 'FROM %s\nCOPY ca/ /usr/local/share/ca-certificates/\nCOPY pip.conf /etc/pip.conf\nRUN update-ca-certificates >/dev/null\n' \
    "$BASE_IMAGE_TAG-rootfs" > "$ctx/Dockerfile"
  docker build -q -t "$BASE_IMAGE_TAG" "$ctx" >/dev/null
  rm -rf "$ctx"
fi
# The pod sandbox ("pause") image: any long-running entrypoint that exits on SIGTERM.
if ! docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1; then
  printf 'FROM %s\nENTRYPOINT ["/usr/bin/tini", "--", "sleep", "infinity"]\n' "$BASE_IMAGE_TAG" \
    | docker build -q -t "$PAUSE_IMAGE" - >/dev/null
fi
# Redis for the chart's Redis StatefulSet (the official image is out of reach): Debian's redis-server,
# no entrypoint (the chart's args start with redis-server), data in /data as in the official image.
if ! docker image inspect "$REDIS_IMAGE" >/dev/null 2>&1; then
  printf '%s\n' "FROM $BASE_IMAGE_TAG" \
    'RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >/dev/null && rm -rf /var/lib/apt/lists/*' \
    'RUN mkdir -p /data && chmod 1777 /data' 'WORKDIR /data' 'EXPOSE 6379' 'CMD ["redis-server", "--protected-mode", "no"]' \
    | docker build -q --network host -t "$REDIS_IMAGE" - >/dev/null
fi
docker save "$PAUSE_IMAGE" "$REDIS_IMAGE" | ctr -a "$K8S_RUN/containerd.sock" -n k8s.io images import - >/dev/null

phase "node ready"
wait_for "node $node" 120 "$K8S_BIN/kubectl" wait --for=condition=Ready "node/$node" --timeout=2s
# storage: a default StorageClass served by the harness' hostPath provisioner
"$K8S_BIN/kubectl" apply -f - >/dev/null <<SC
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: lowtide-hostpath
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: lowtide.local/hostpath
reclaimPolicy: Delete
volumeBindingMode: Immediate
SC
py=${PYTHON:-$(cd "$here/../.." && pwd)/.venv/bin/python}
start provisioner "$py" "$here/provisioner.py" --root "$K8S_RUN/pv"
wait_for "service account default" 60 "$K8S_BIN/kubectl" get serviceaccount default
wait_for "CoreDNS" 30 bash -c "exec 3<>/dev/tcp/$ip_addr/53"
phase ""
touch "$K8S_RUN/up"
k8s_log "cluster up: node $node ($ip_addr), KUBECONFIG=$KUBECONFIG, DOCKER_HOST=$DOCKER_HOST"
