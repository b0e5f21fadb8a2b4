#!/usr/bin/env bash
# Installs what a fresh machine lacks for lowtide's demo and tests (called by `make setup`):
#   system:  redis-server, etcd (etcd-server: the cluster metadata store) and etcdctl (etcd-client),
#            jq, prometheus (Debian packages), Java >= 17 (for PySpark), gcc and
#            the headers of the Python that builds .venv (for the C record walker, which
#            `pip install -e .` compiles), Maven (mvn: scripts/kafka_tools.sh fetches Kafka's CLI
#            tools and Spark's Kafka connector from Maven Central with it); installed with apt-get
#            when run as root, otherwise named with the command to run.
#   tools:   grpcurl and helm, built from their Go modules into .tools/bin when Go is there.
#            Optional: a failure is a warning (tests that need them skip, naming the tool), and a
#            failed build is not retried by `make setup` until `make tools` (which forces it).
#            kgo-verifiable-consumer, the franz-go test client in tests/go/kgo-verifiable (its
#            go.mod/go.sum pin franz-go), built into .tools/bin, again when its source changes; its
#            failure is a warning too, except under CI=true, where it (and a missing Go) is fatal.
# Does nothing (quickly) on a machine that already has everything.
#
# usage: scripts/setup.sh [--system] [--tools] [--force-tools]     (no option: --system --tools)
# env:   CI=true makes missing system tools fatal when they cannot be installed;
#        GO_TOOL_TIMEOUT (seconds per Go tool build, default 900); GRPCURL_VERSION, HELM_VERSION.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools_dir=$root/.tools
GRPCURL_VERSION=${GRPCURL_VERSION:-v1.9.4}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
GO_TOOL_TIMEOUT=${GO_TOOL_TIMEOUT:-900}

do_system=0 do_tools=0 force_tools=0
for arg in "$@"; do
  case $arg in
    --system) do_system=1 ;;
    --tools) do_tools=1 ;;
    --force-tools) do_tools=1 force_tools=1 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done
[ $# -eq 0 ] && do_system=1 do_tools=1

say() { echo "setup: $*"; }
warn() { echo "setup: WARNING: $*" >&2; }
is_root() { [ "$(id -u)" -eq 0 ]; }
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ] || [ -x "/usr/sbin/$1" ]; }

java_major() {  # prints the major version of `java` on PATH, or 0
  local v
  v=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}') || true
  case $v in
    1.*) v=${v#1.}; echo "${v%%.*}" ;;
    "") echo 0 ;;
    *) v=${v%%.*}; v=${v%%[!0-9]*}; echo "${v:-0}" ;;
  esac
}

# apt-get install, quietly (errors shown), without letting package scripts start services:
# the tests and `lowtide cluster up` start redis-server and prometheus themselves on free ports.
apt_install() {
  local log policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
  log=$(mktemp)
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made_policy=1
  fi
  say "apt-get update"
  if ! apt-get update -q >"$log" 2>&1; then
    cat "$log" >&2; rc=1
  else
    say "apt-get install $*"
    apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 "$@" >"$log" 2>&1 || { cat "$log" >&2; rc=1; }
  fi
  [ $made_policy -eq 1 ] && rm -f "$policy"
  rm -f "$log"
  return $rc
}

# The interpreter `pip install -e .` compiles lowtide.record._validate with: .venv's if it exists,
# else the one scripts/venv.sh would pick first.
build_python() {
  local cand
  if [ -x "$root/.venv/bin/python" ]; then echo "$root/.venv/bin/python"; return 0; fi
  for cand in ${PYTHON:-} python3 python3.13 python3.12 python3.11; do
    command -v "$cand" >/dev/null 2>&1 && { command -v "$cand"; return 0; }
  done
  return 1
}

# Prints the Debian package holding Python.h for interpreter $1 when the header is missing and apt
# can provide it ("" when present); returns 1 when missing and apt cannot help (pyenv, conda, ...).
python_headers_pkg() {
  local py=$1 inc prefix ver
  inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) || return 1
  [ -f "$inc/Python.h" ] && return 0
  prefix=$("$py" -c 'import sys; print(sys.base_prefix)')
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$prefix" = /usr ] || return 1
  echo "python$ver-dev"
}

setup_system() {
  local -a missing=() pkgs=()
  local cmd jv py hdr_pkg=""
  # gcc: compiles the C record walker (without it, leader validation runs a slow Python fallback).
  for cmd in redis-server jq prometheus gcc; do
    have "$cmd" || { missing+=("$cmd"); pkgs+=("$cmd"); }   # command name == Debian package name
  done
  have etcd || { missing+=(etcd); pkgs+=(etcd-server); }
  have etcdctl || { missing+=(etcdctl); pkgs+=(etcd-client); }
  if py=$(build_python); then
    if hdr_pkg=$(python_headers_pkg "$py"); then
      [ -n "$hdr_pkg" ] && { missing+=("Python.h of $py"); pkgs+=("$hdr_pkg"); }
    else
      warn "Python.h of $py is missing and apt-get cannot install it (not a Debian python):"
      warn "  lowtide.record._validate will not compile; leader validation uses a slow Python fallback."
    fi
  fi
  have mvn || { missing+=(mvn); pkgs+=(maven); }
  jv=$(java_major)
  if [ "$jv" -lt 17 ]; then
    missing+=("java>=17 (found: $( [ "$jv" -eq 0 ] && echo none || echo "$jv"))")
    pkgs+=(openjdk-17-jre-headless)
  fi
  if [ ${#missing[@]} -eq 0 ]; then
    say "system tools present: redis-server etcd etcdctl jq prometheus gcc mvn java $jv"
    return 0
  fi
  if is_root && have apt-get; then
    apt_install "${pkgs[@]}" || { echo "setup: ERROR: apt-get install ${pkgs[*]} failed (output above)" >&2; exit 1; }
    # A package installed on a systemd machine is enabled for the next boot: not wanted for
    # prometheus (it would hold port 9090 and scrape nothing of ours).
    if [[ " ${pkgs[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ] && have systemctl; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    # Nor etcd's own service on 2379: lowtide starts its members itself, on free ports.
    if [[ " ${pkgs[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ] && have systemctl; then
      systemctl disable --now etcd >/dev/null 2>&1 || true
    fi
    for cmd in redis-server etcd etcdctl jq prometheus gcc mvn; do
      have "$cmd" || { echo "setup: ERROR: $cmd still missing after apt-get install" >&2; exit 1; }
    done
    if [ -n "$hdr_pkg" ] && [ -n "$(python_headers_pkg "$py")" ]; then
      echo "setup: ERROR: Python.h of $py still missing after apt-get install $hdr_pkg" >&2; exit 1
    fi
    jv=$(java_major)
    if [ "$jv" -lt 17 ]; then
      echo "setup: ERROR: java >= 17 is needed by PySpark, but 'java -version' reports $jv." >&2
      echo "setup:        put a JDK/JRE 17+ first on PATH (or set it with update-alternatives --config java)." >&2
      exit 1
    fi
    say "installed: ${pkgs[*]}"
  else
    warn "missing: ${missing[*]}"
    warn "install them as root with:"
    warn "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${pkgs[*]}"
    warn "(redis-server and etcd: every integration test and the demo; prometheus: observability tests;"
    warn " jq: contract-check; java 17+: PySpark jobs and the demo; gcc and python3.X-dev: the C"
    warn " record walker, built by 'pip install -e .', else a slow Python fallback; maven: Kafka's CLI"
    warn " tools and Spark's Kafka connector, make kafka-tools). Tests needing them will skip."
    [ "${CI:-}" = true ] && { echo "setup: ERROR: CI needs every tool and cannot install them (not root)." >&2; exit 1; }
  fi
  return 0
}

find_go() {
  if command -v go >/dev/null 2>&1; then command -v go
  elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
  else return 1; fi
}

# build_go_tool NAME MODULE@VERSION: go install into .tools/bin, time-boxed, failure = warning.
build_go_tool() {
  local name=$1 module=$2 go marker=$tools_dir/$1.failed log=$tools_dir/$1.build.log start
  if [ -x "$tools_dir/bin/$name" ]; then return 0; fi
  if command -v "$name" >/dev/null 2>&1; then say "$name: using $(command -v "$name")"; return 0; fi
  if [ -e "$marker" ] && [ $force_tools -eq 0 ]; then
    warn "$name: an earlier build failed (see $log); 'make tools' retries it"
    return 0
  fi
  if ! go=$(find_go); then
    warn "$name: not found and Go is not installed to build it; tests that need $name will skip"
    return 0
  fi
  mkdir -p "$tools_dir/bin"
  # go needs a home for its module and build caches; without $HOME keep them in .tools/
  [ -n "${HOME:-}" ] || export GOPATH=$tools_dir/go GOCACHE=$tools_dir/go-cache
  say "$name: building $module with go install (first time only; up to ${GO_TOOL_TIMEOUT}s)"
  start=$SECONDS
  if GOBIN=$tools_dir/bin GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
      timeout "$GO_TOOL_TIMEOUT" "$go" install "$module" >"$log" 2>&1; then
    rm -f "$marker"
    say "$name: built .tools/bin/$name in $((SECONDS - start))s"
  else
    touch "$marker"
    warn "$name: go install $module failed or timed out after $((SECONDS - start))s; last lines of $log:"
    tail -n 5 "$log" >&2 || true
  fi
  return 0
}

# build_repo_go_tool NAME DIR: go build of the main package in DIR (a module of this repository,
# pinned by its go.sum) into .tools/bin/NAME, time-boxed; rebuilt when a file in DIR is newer than
# the binary. A failure is a warning (a test that needs NAME skips, naming it), fatal under CI=true:
# CI must run those tests, not skip them.
build_repo_go_tool() {
  local name=$1 dir=$root/$2 go bin=$tools_dir/bin/$1 marker=$tools_dir/$1.failed log=$tools_dir/$1.build.log start
  local fatal=0
  [ "${CI:-}" = true ] && fatal=1
  if [ -x "$bin" ] && [ -z "$(find "$dir" -type f -newer "$bin" -print -quit)" ]; then return 0; fi
  if [ -e "$marker" ] && [ $force_tools -eq 0 ] && [ $fatal -eq 0 ] \
      && [ -z "$(find "$dir" -type f -newer "$marker" -print -quit)" ]; then
    warn "$name: an earlier build failed (see $log); 'make tools' retries it"
    return 0
  fi
  if ! go=$(find_go); then
    if [ $fatal -eq 1 ]; then
      echo "setup: ERROR: $name: Go is not installed to build $2 (CI needs it)" >&2; exit 1
    fi
    warn "$name: Go is not installed to build $2; tests that need $name will skip"
    return 0
  fi
  mkdir -p "$tools_dir/bin"
  [ -n "${HOME:-}" ] || export GOPATH=$tools_dir/go GOCACHE=$tools_dir/go-cache
  say "$name: building $2 with go build (up to ${GO_TOOL_TIMEOUT}s)"
  start=$SECONDS
  if (cd "$dir" && GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
      timeout "$GO_TOOL_TIMEOUT" "$go" build -mod=readonly -o "$bin.tmp" .) >"$log" 2>&1; then
    mv -f "$bin.tmp" "$bin"
    rm -f "$marker"
    say "$name: built .tools/bin/$name in $((SECONDS - start))s"
  else
    rm -f "$bin.tmp"
    touch "$marker"
    if [ $fatal -eq 1 ]; then
      echo "setup: ERROR: $name: go build of $2 failed or timed out after $((SECONDS - start))s; last lines of $log:" >&2
      tail -n 20 "$log" >&2 || true
      exit 1
    fi
    warn "$name: go build of $2 failed or timed out after $((SECONDS - start))s; last lines of $log:"
    tail -n 5 "$log" >&2 || true
  fi
  return 0
}

[ $do_system -eq 1 ] && setup_system
if [ $do_tools -eq 1 ]; then
  build_go_tool grpcurl "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
  build_go_tool helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  build_repo_go_tool kgo-verifiable-consumer tests/go/kgo-verifiable
fi
exit 0
