#!/usr/bin/env bash
# Builds (once) what the local Kubernetes harness runs, into $LOWTIDE_K8S_HOME (tests/k8s/env.sh):
#   - Debian packages: etcd-server, containerd, runc, containernetworking-plugins, docker.io,
#     debootstrap, iptables, conntrack, socat, openssl (apt-get, as root)
#   - bin/: the Kubernetes $K8S_VERSION binaries, built from the Go module proxy through a wrapper
#     module that requires k8s.io/kubernetes and pins every k8s.io/* staging module the kubernetes
#     module replaces to the matching v0.x.y (the kubernetes module cannot be `go install`ed
#     directly because of those replaces); CoreDNS from its module
#   - images/base-$DEBIAN_SUITE.tar: a Debian rootfs (debootstrap) that `up.sh` docker-imports as
#     the base image (no image registry is reachable here)
# Each part is skipped when present; delete it (or all of $LOWTIDE_K8S_HOME) to rebuild.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=env.sh
. "$here/env.sh"
mkdir -p "$K8S_BIN" "$K8S_IMAGES"

[ "$(id -u)" -eq 0 ] || k8s_die "the harness needs root (containerd, kubelet, iptables, mounts)"

# ---- Debian packages -------------------------------------------------------------------------
pkgs=() 
need_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$1"); }
for p in etcd-server containerd runc containernetworking-plugins docker.io debootstrap iptables \
         conntrack socat openssl ethtool iproute2 kmod; do need_pkg "$p"; done
if [ ${#pkgs[@]} -gt 0 ]; then
  k8s_log "apt-get install ${pkgs[*]}"
  policy=/usr/sbin/policy-rc.d made=0
  # package scripts must not start dockerd/containerd/etcd: the harness runs its own instances
  [ -e $policy ] || { printf '#!/bin/sh\nexit 101\n' > $policy; chmod 755 $policy; made=1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 "${pkgs[@]}" >/dev/null
  [ $made -eq 1 ] && rm -f $policy
fi

# ---- Kubernetes binaries -----------------------------------------------------------------------
k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
missing=()
for c in "${k8s_cmds[@]}"; do
  if [ "$c" = kubectl ]; then v=(version --client); else v=(--version); fi
  [ -x "$K8S_BIN/$c" ] && "$K8S_BIN/$c" "${v[@]}" 2>/dev/null | grep -q "$K8S_VERSION" || missing+=("$c")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v go >/dev/null || k8s_die "Go is needed to build ${missing[*]} (https://go.dev/dl)"
  k8s_log "building ${missing[*]} $K8S_VERSION from the Go module proxy (about 10 min on 2 cores)"
  b=$LOWTIDE_K8S_HOME/build
  mkdir -p "$b"
  cd "$b"
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -f "$gomod" ] || k8s_die "go mod download k8s.io/kubernetes@$K8S_VERSION failed"
  staging=${K8S_VERSION/v1./v0.}
  {
    echo "module lowtide.local/k8sbuild"
    echo
    sed -n 's/^go \(.*\)/go \1/p' "$gomod" | head -n1
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # "k8s.io/api => ./staging/src/k8s.io/api" in kubernetes' go.mod -> pin to the release tag
    grep -Eo 'k8s.io/[a-z0-9-]+ => ./staging/src/k8s.io/[a-z0-9-]+' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for c in "${k8s_cmds[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
    echo ")"
  } > tools.go
  GOFLAGS=-mod=mod go mod tidy >/dev/null
  ldpkg() { local p=$1; echo "-X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"; }
  ldflags="-s -w $(ldpkg k8s.io/component-base/version) $(ldpkg k8s.io/client-go/pkg/version)"
  for c in "${missing[@]}"; do
    t=$SECONDS
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$K8S_BIN/$c" "k8s.io/kubernetes/cmd/$c"
    k8s_log "built $c in $((SECONDS - t))s"
  done
  cd - >/dev/null
fi

if ! [ -x "$K8S_BIN/coredns" ] || ! "$K8S_BIN/coredns" -version 2>/dev/null | grep -q "${COREDNS_VERSION#v}"; then
  k8s_log "building coredns $COREDNS_VERSION"
  GOBIN=$K8S_BIN CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
fi

# skaffold's module has replace directives, so `go install skaffold@v` refuses it: build it inside its
# own downloaded module (the proxy serves the version, only the version list is refused).
if ! [ -x "$K8S_BIN/skaffold" ] || ! "$K8S_BIN/skaffold" version 2>/dev/null | grep -q "$SKAFFOLD_VERSION"; then
  k8s_log "building skaffold $SKAFFOLD_VERSION (about 5 min on 2 cores)"
  dir=$(go mod download -json "github.com/GoogleContainerTools/skaffold/v2@$SKAFFOLD_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$dir" ] || k8s_die "go mod download skaffold $SKAFFOLD_VERSION failed"
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
     -ldflags "-s -w -X github.com/GoogleContainerTools/skaffold/v2/pkg/skaffold/version.version=$SKAFFOLD_VERSION" \
     -o "$K8S_BIN/skaffold" ./cmd/skaffold)
fi

# ---- base image rootfs ---------------------------------------------------------------------------
base_tar=$K8S_IMAGES/base-$DEBIAN_SUITE.tar
if [ ! -s "$base_tar" ]; then
  k8s_log "debootstrap $DEBIAN_SUITE (python3, venv, gcc for the C extensions, Java for the Spark image)"
  root=$(mktemp -d "$LOWTIDE_K8S_HOME/rootfs.XXXX")
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates,procps,tini \
    "$DEBIAN_SUITE" "$root" "${mirror:-http://deb.debian.org/debian}" >/dev/null
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
  # `python` as in the python:3.11-slim image the Dockerfile defaults to
  ln -sf python3 "$root/usr/bin/python"
  tar -C "$root" -cf "$base_tar.tmp" . && mv "$base_tar.tmp" "$base_tar"
  rm -rf "$root"
fi
k8s_log "build done: $(ls "$K8S_BIN" | tr '\n' ' ')"
