#!/usr/bin/env bash
# Stops everything tests/k8s/up.sh started (pods first, through the kubelet and containerd), undoes
# its network changes and removes $LOWTIDE_K8S_HOME/run. Built binaries, the base image tarball
# and dockerd's layer cache stay (they are slow to make). Safe to run when nothing is up.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
. "$here/env.sh"
pids=$K8S_RUN/pids
[ -d "$LOWTIDE_K8S_HOME" ] || { k8s_log "nothing to stop"; exit 0; }

stop_daemon() {  # SIGTERM, then SIGKILL after $2 seconds
  local name=$1 secs=${2:-10} pid
  [ -f "$pids/$name" ] || return 0
  pid=$(cat "$pids/$name")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq $((secs * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$pids/$name"
}

sock=$K8S_RUN/containerd.sock
stop_daemon kubelet 15
stop_daemon provisioner 5
# every pod sandbox and container the kubelet left (their runc shims outlive the kubelet)
if [ -S "$sock" ]; then
  for ns in k8s.io moby default; do
    for t in $(ctr -a "$sock" -n "$ns" tasks list -q 2>/dev/null); do
      ctr -a "$sock" -n "$ns" tasks kill -s SIGKILL "$t" >/dev/null 2>&1
    done
  done
  sleep 1
fi
for d in kube-proxy coredns kube-scheduler kube-controller-manager dockerd containerd kube-apiserver etcd; do
  stop_daemon "$d" 15
done
# anything of this harness still running (a half-started cluster, an earlier run's daemons): every
# daemon has a path under $LOWTIDE_K8S_HOME on its command line
pkill -TERM -f -- "$LOWTIDE_K8S_HOME/" 2>/dev/null && sleep 2
pkill -KILL -f -- "$LOWTIDE_K8S_HOME/" 2>/dev/null || true
# leftover shims, mounts and network state of this cluster only
pkill -KILL -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
pkill -KILL -f "containerd-shim.*$K8S_RUN" 2>/dev/null || true
grep -o " $K8S_RUN[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
grep -o " $LOWTIDE_K8S_HOME/docker[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
ip link del cni0 2>/dev/null || true
ip link del lowtide0 2>/dev/null || true
# kube-proxy's and the CNI plugins' iptables chains
if command -v iptables-save >/dev/null; then
  for table in nat filter mangle; do
    iptables -t "$table" -S 2>/dev/null | grep -E '^-A .*(KUBE-|CNI-)' | sed 's/^-A/-D/' | while read -r rule; do
      eval "iptables -t $table $rule" 2>/dev/null
    done
    iptables -t "$table" -S 2>/dev/null | awk '/^-N (KUBE-|CNI-)/ {print $2}' | while read -r chain; do
      iptables -t "$table" -F "$chain" 2>/dev/null; iptables -t "$table" -X "$chain" 2>/dev/null
    done
  done
fi
rm -rf --one-file-system "$K8S_RUN"
k8s_log "cluster down; kept: $K8S_BIN, $K8S_IMAGES, $LOWTIDE_K8S_HOME/docker"
