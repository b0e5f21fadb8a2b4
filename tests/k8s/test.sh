#!/usr/bin/env bash
# `make k8s-test`: the chart on a real single-node Kubernetes (tests/k8s/up.sh), end to end.
#
#   1. image       docker build of the Dockerfile (services and spark targets, BASE_IMAGE = the
#                  harness' Debian base), loaded into the node's containerd
#   2. install     helm install --wait: every pod Ready (replicas, front door, coordinators, orphan
#                  scanner, Redis, 3 etcd members), then `helm test`
#   3. delete      a topic produced in the cluster; DeleteRecords with grpcurl through a
#                  `kubectl port-forward` of the front door Service returns the low watermark
#                  (over mutual TLS with the chart's admin certificate)
#      tls         inside the cluster, a plaintext gRPC call to a replica, a plaintext Redis PING and
#                  a plaintext etcd call are refused (the chart runs with TLS on, its default)
#   4. restart     a replica pod deleted: the StatefulSet brings it back on its volume, with its
#                  data and the log start offset intact
#      coordinator (issue 32) a diskless topic produced to; the coordinator shard that applied the
#                  most, settled with a log tail after its newest snapshot in the object store, has
#                  its pod deleted together with its PVC: it comes back on a new, empty volume from
#                  that snapshot plus the log tail, with the same SQLite tables, row for row
#   5. spark       a group consumes part of the topic; the retention caller CronJob triggered once
#                  (`kubectl create job --from=cronjob/...`) moves the low watermark to the group's offsets
#   6. rotation    a renewed front door certificate written into its Secret is served without a restart
#   7. upgrade     helm upgrade (a changed value rolls the front door; the certificates stay the
#                  same)
#   8. scale       (issue 31) the node labelled with a zone before the install: every broker
#                  registered that zone as its rack (chart rackAwareness); helm upgrade to 4
#                  replicas (the running ones not restarted), `lowtide rebalance --execute --wait`
#                  moves replicas onto broker 3; a restart of pod 3 does not drain it; a scale-down
#                  to 2 is refused by the chart's pre-upgrade check (RF 3) and changes nothing; helm
#                  upgrade to 3: pod 3's preStop drains it (`lowtide drain --broker 3`) before it
#                  goes; records produced before, during and after all read back
#  10. etcd        (issue 51) the etcd leader's pod deleted with its PVC while records are produced
#                  (acks=all): it rejoins as a new member on its empty volume, 3 healthy members
#                  again, every acknowledged record reads back, no lowtide server restarted
#  11. redis       the Redis pod deleted with its PVC: every record reads back; a topic created,
#                  produced to and read; the diskless topic produced to right after (its shards'
#                  leases and registry are in etcd)
#  12. uninstall   helm uninstall: no pod left, volumes released and deleted
# Each phase's duration is printed and written to $LOWTIDE_K8S_HOME/run/phases.txt.
# Assumes the cluster is up (make k8s-up); `make k8s-test` runs build, up, this and down.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=env.sh
. "$here/env.sh"
export PATH=$K8S_BIN:$repo/.tools/bin:$PATH
export DOCKER_HOST=unix://$K8S_RUN/docker.sock
export DOCKER_BUILDKIT=0  # the legacy builder, without its deprecation banner (no buildx here)
export K8S_PHASES_FILE=$K8S_RUN/phases.txt
: > "$K8S_PHASES_FILE"
NS=${K8S_TEST_NAMESPACE:-lowtide}
REL=${K8S_TEST_RELEASE:-lt}
TOPIC=k8s-orders
GROUP=etl
k() { kubectl -n "$NS" "$@"; }
fail() {
  echo "k8s-test: FAILED: $*" >&2
  k get pods -o wide >&2 || true
  k get events --sort-by=.lastTimestamp 2>/dev/null | tail -n 25 >&2 || true
  echo "k8s-test: FAILED: $*" >&2  # again, last: CI shows only the tail of the output
  exit 1
}
# one Ready pod of a component (by the chart's app.kubernetes.io/component label); a pod being
# deleted still says Running until its containers exit, so those are skipped
pod_of() { k get pods -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=$1" \
             --field-selector=status.phase=Running -o json \
           | jq -r '[.items[] | select(.metadata.deletionTimestamp == null)
                     | select(any(.status.conditions[]?; .type == "Ready" and .status == "True"))]
                    | .[0].metadata.name // empty'; }
# until no pod of the release is terminating (helm --wait returns once the new pods are Ready,
# while the old ones may still be shutting down: their readiness fails and kubectl wait errors)
wait_terminated() {
  local _
  for _ in $(seq 240); do
    [ "$(k get pods -l "app.kubernetes.io/instance=$REL" -o json \
         | jq '[.items[] | select(.metadata.deletionTimestamp != null)] | length')" = 0 ] && return 0
    sleep 0.5
  done
  return 1
}
# the lowtide CLI inside the cluster (in a front door pod: the replicas' names resolve there)
# (retried: during a rollout the pod picked may be going away under the exec, and a partition whose
# leader just moved answers NOT_LEADER for a moment; only the answer that succeeded is printed)
lt() {
  local i out
  for i in $(seq 15); do
    if out=$(k exec "$(pod_of frontdoor)" -- lowtide "$@" --bootstrap-server localhost:9090); then
      printf '%s\n' "$out"; return 0
    fi
    echo "lt $1 (attempt $i): $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-400)" >&2
    sleep 2
  done
  return 1
}
offsets() {  # offsets TIME -> "p0 p1 p2" sorted by partition
  lt offsets --topic "$TOPIC" --time "$1" --output json \
    | jq -r '[.partitions // . | .[]] | sort_by(.partition) | map(.offset | tostring) | join(" ")'
}

sum() { echo $(( ${1// /+} )); }  # "1 2 3" -> 6

# a release left by an earlier failed run goes first
if kubectl get namespace "$NS" >/dev/null 2>&1; then
  helm uninstall "$REL" -n "$NS" --wait >/dev/null 2>&1 || true
  kubectl delete namespace "$NS" --wait=true --timeout=180s >/dev/null
fi

phase "skaffold diagnose + render"
# skaffold.yaml parses with the current schema and renders the chart with the built images' tags
(cd "$repo" && skaffold diagnose --yaml-only >/dev/null) || fail "skaffold diagnose"
render_err=$(mktemp)
rendered=$(cd "$repo" && skaffold render -p dev --digest-source=tag --offline=true 2>"$render_err") \
  || { cat "$render_err" >&2; fail "skaffold render"; }
rm -f "$render_err"
# A here-string, not `echo | grep -q`: grep -q exits at its first match, and under pipefail the echo
# still writing a manifest bigger than the pipe's buffer dies of SIGPIPE, failing a good render.
grep -Eq 'image: "?lowtide:' <<<"$rendered" || fail "skaffold render: no lowtide image in the manifests"
echo "skaffold render: $(grep -c '^kind:' <<<"$rendered") objects"

phase "image build"
build_args=(--network host --build-arg "BASE_IMAGE=$BASE_IMAGE_TAG")
# etcd and etcdctl for the chart's etcd members (they run the lowtide image): the host's (Debian's
# etcd-server and etcd-client, make setup), copied into the build context (docker/etcd/README.md)
for b in etcd etcdctl; do
  src=$(command -v "$b") || fail "$b not found on this machine (make setup installs etcd-server and etcd-client)"
  cmp -s "$src" "$repo/docker/etcd/$b" || install -m 0755 "$src" "$repo/docker/etcd/$b"
done
docker build -q "${build_args[@]}" --target runtime -t "$LOWTIDE_IMAGE" "$repo" >/dev/null
docker build -q "${build_args[@]}" --target spark -t "$LOWTIDE_SPARK_IMAGE" "$repo" >/dev/null
# Captured whole, then its first line printed: `| head -n 1` closes the pipe early, and etcd's
# "write /dev/stdout: broken pipe" then fails the step under pipefail (CI, session 44).
etcd_version=$(docker run --rm --network none --entrypoint etcd "$LOWTIDE_IMAGE" --version) || fail "no etcd in the image"
printf '%s\n' "${etcd_version%%$'\n'*}"
phase "image load"
docker save "$LOWTIDE_IMAGE" "$LOWTIDE_SPARK_IMAGE" | ctr -a "$K8S_RUN/containerd.sock" -n k8s.io images import - >/dev/null
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E "^(lowtide|lowtide-spark):" || true

phase "manifests vs the apiserver"
# Every manifest the chart renders, with default and with full values, validated by the real
# apiserver's schemas (server-side dry run, unknown fields are errors). The Prometheus Operator's
# and cert-manager's kinds are left out: their CRDs are not installed here.
# A dry run persists nothing, so the pods' admission would not find the ServiceAccount the same
# dry run "created": a scratch namespace holds a real one.
dry=$NS-dryrun
kubectl create namespace "$dry" >/dev/null
kubectl -n "$dry" create serviceaccount "$REL-lowtide" >/dev/null
for values in "" "$repo/charts/lowtide/ci/full-values.yaml"; do
  helm template "$REL" "$repo/charts/lowtide" -n "$dry" ${values:+-f "$values"} \
    | python3 "$here/drop_kinds.py" ServiceMonitor PrometheusRule Certificate \
    | kubectl apply -n "$dry" --dry-run=server --validate=strict -f - >/dev/null \
    || fail "rendered manifests (${values:-default values}) refused by the apiserver"
done
kubectl delete namespace "$dry" --wait=false >/dev/null
echo "manifests ok: default and full values"
k get ns "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS" >/dev/null
# the zone the replica pods take as their rack (chart rackAwareness: an init container reads it)
ZONE=lowtide-zone-a
kubectl label node --all --overwrite "topology.kubernetes.io/zone=$ZONE" >/dev/null

phase "helm install"
helm install "$REL" "$repo/charts/lowtide" -n "$NS" -f "$here/values-harness.yaml" \
  --set image.repository="${LOWTIDE_IMAGE%%:*}" --set image.tag="${LOWTIDE_IMAGE##*:}" \
  --set spark.image.repository="${LOWTIDE_SPARK_IMAGE%%:*}" --set spark.image.tag="${LOWTIDE_SPARK_IMAGE##*:}" \
  --wait --timeout 5m || fail "helm install"
k wait pods -l "app.kubernetes.io/instance=$REL" --for=condition=Ready --timeout=120s \
  --field-selector=status.phase!=Succeeded >/dev/null || fail "pods not Ready"
k get pods -o wide
phase "helm test"
helm test "$REL" -n "$NS" --logs --timeout 5m || fail "helm test"
# the test pod stays for --logs (hook-delete-policy before-hook-creation); helm uninstall leaves hooks
k delete pod -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=test" --wait=true >/dev/null

phase "DeleteRecords via port-forward"
lt topics create --topic "$TOPIC" --partitions 3 --replication-factor 3 >/dev/null
lt produce --topic "$TOPIC" --num-records 3000 --record-size 512 >/dev/null
latest=$(offsets latest); echo "latest offsets: $latest"
[ "$(sum "$latest")" -eq 3000 ] || fail "produced 3000 records, latest offsets $latest"
pf_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
k port-forward "svc/$REL-lowtide-frontdoor" "$pf_port:9090" >"$K8S_RUN/logs/port-forward.log" 2>&1 &
pf=$!
trap 'kill $pf 2>/dev/null || true' EXIT
# the chart's admin certificate (User:admin) and CA, as NOTES.txt shows
tls_dir=$K8S_RUN/tls-admin
mkdir -p "$tls_dir"
for f in ca.crt tls.crt tls.key; do
  k get secret "$REL-lowtide-admin-tls" -o json | jq -r --arg f "$f" '.data[$f]' | base64 -d > "$tls_dir/$f"
done
gtls=(-cacert "$tls_dir/ca.crt" -cert "$tls_dir/tls.crt" -key "$tls_dir/tls.key")
for _ in $(seq 100); do grpcurl "${gtls[@]}" "127.0.0.1:$pf_port" list >/dev/null 2>&1 && break; sleep 0.2; done
! grpcurl -plaintext -max-time 5 "127.0.0.1:$pf_port" list >/dev/null 2>&1 || fail "the front door answered plaintext grpcurl"
reply=$(grpcurl "${gtls[@]}" -d "{\"partitions\":[{\"topic\":\"$TOPIC\",\"partition\":0,\"offset\":100}]}" \
  "127.0.0.1:$pf_port" lowtide.v1.Admin/DeleteRecords) || fail "grpcurl DeleteRecords"
echo "$reply" | jq -c .
lw=$(echo "$reply" | jq -r '.partitions[0] | .low_watermark // .lowWatermark')
[ "$lw" = 100 ] || fail "DeleteRecords through the port-forward returned low watermark $lw, wanted 100"

phase "TLS: plaintext refused"
# From inside the cluster (a front door pod): a plaintext gRPC call to a replica fails, the same call
# over TLS with the pod's certificate succeeds; Redis refuses a plaintext PING and answers over TLS.
replica0="$REL-lowtide-replica-0.$REL-lowtide-replica-headless:9092"
k exec -i "$(pod_of frontdoor)" -- python - "$replica0" <<'PY' || fail "a replica's gRPC port: plaintext not refused, or TLS refused"
import os, sys, grpc
from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g
def check(channel):
    with channel as ch:
        return h.HealthCheckResponse.ServingStatus.Name(g.HealthStub(ch).Check(h.HealthCheckRequest(), timeout=5).status)
try:
    sys.exit(f"plaintext {sys.argv[1]}: answered {check(grpc.insecure_channel(sys.argv[1]))}")
except grpc.RpcError as exc:
    print(f"plaintext {sys.argv[1]}: refused ({exc.code().name})")
f = lambda n: open(os.environ["LOWTIDE_TLS_" + n], "rb").read()
print(f"TLS {sys.argv[1]}: {check(grpc.secure_channel(sys.argv[1], grpc.ssl_channel_credentials(f('CA'), f('KEY'), f('CERT'))))}")
PY
redis_pod=$(pod_of redis)
if k exec "$redis_pod" -- sh -c 'redis-cli -p 6379 ping' 2>&1 | grep -q PONG; then
  fail "Redis answered a plaintext PING"
fi
pong=$(k exec "$redis_pod" -- sh -c 'redis-cli -p 6379 --tls --cacert /etc/lowtide/tls/ca.crt --cert /etc/lowtide/tls/tls.crt --key /etc/lowtide/tls/tls.key ping' 2>&1)
[ "$pong" = PONG ] || fail "Redis over TLS: $pong"
echo "redis: plaintext refused, TLS PONG"
# etcd's client port: mutual TLS only (the member's own etcdctl, without and with its certificate)
etcd_pod=$(pod_of etcd)
if k exec "$etcd_pod" -- env -u ETCDCTL_CACERT -u ETCDCTL_CERT -u ETCDCTL_KEY etcdctl --endpoints http://localhost:2379 \
     --dial-timeout 3s --command-timeout 5s endpoint health >/dev/null 2>&1; then
  fail "etcd answered plaintext"
fi
k exec "$etcd_pod" -- etcdctl --endpoints https://localhost:2379 --command-timeout 5s endpoint health >/dev/null 2>&1 \
  || fail "etcd over TLS with the member's certificate"
echo "etcd: plaintext refused, TLS healthy"

phase "replica pod restart"
before_start=$(offsets earliest) before_end=$(offsets latest)
victim=$(k get pods -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=replica" \
  -o jsonpath='{.items[0].metadata.name}')
old_uid=$(k get pod "$victim" -o jsonpath='{.metadata.uid}')
k delete pod "$victim" --wait=true >/dev/null
for _ in $(seq 240); do
  uid=$(k get pod "$victim" -o jsonpath='{.metadata.uid}' 2>/dev/null || true)
  [ -n "$uid" ] && [ "$uid" != "$old_uid" ] && break; sleep 0.5
done
k wait pod "$victim" --for=condition=Ready --timeout=180s >/dev/null || fail "$victim did not come back"
echo "$victim is back (uid $old_uid -> $uid)"
# and back in every ISR (it caught up from the leaders) before the next phase leans on it
for _ in $(seq 120); do
  full=$(lt topics describe --output json | jq '[.topics[].partitions[] | select((.isr | length) < (.replicas | length))] | length')
  [ "$full" = 0 ] && break; sleep 0.5
done
[ "$full" = 0 ] || fail "$full partitions still under-replicated after $victim came back"
# its data: the partitions it holds are readable from it again, nothing below the LSO
after_start=$(offsets earliest) after_end=$(offsets latest)
[ "$after_start" = "$before_start" ] || fail "log start offsets $before_start -> $after_start after the restart"
[ "$after_end" = "$before_end" ] || fail "log end offsets $before_end -> $after_end after the restart"
k exec "$victim" -- sh -c 'ls /var/lib/lowtide | head -n 5'
n=$(lt consume --topic "$TOPIC" --partition 0 --offset 100 --max-records 800 --output json | jq -s 'length')
[ "$n" = 800 ] || fail "read $n records of partition 0 from offset 100 after the restart, wanted 800"

phase "coordinator pod deleted with its volume"
# Issue 32: a coordinator shard's pod deleted together with its PersistentVolumeClaim comes back on
# a new, empty volume from the newest snapshot in the object store plus the metadata log tail after
# it, with the same tables, row for row. (values-harness.yaml: a snapshot every 10 metadata
# records, so a few produces make some and leave a tail.)
DTOPIC=k8s-diskless
# coord_rows POD FILE: every row of the shard's SQLite tables (CoordinatorState.dump, in primary key
# order), one JSON line per row ["table", col1, ...], into FILE, read from a consistent copy (SQLite
# backup API) of the live file; prints "<applied offset> <epoch>". Those two are left out of FILE: a
# new leadership term appends its own EpochStarted record.
coord_rows() {
  k exec -i "$1" -- python - >"$2.tmp" <<'PY' || return 1
import json, shutil, sqlite3, tempfile
from lowtide.coordinator.state import CoordinatorState
tmp = tempfile.mkdtemp(dir="/tmp")
src = sqlite3.connect("file:/var/lib/lowtide/state.sqlite?mode=ro", uri=True)
dst = sqlite3.connect(f"{tmp}/copy.sqlite")
src.backup(dst)
src.close()
dst.close()
state = CoordinatorState(f"{tmp}/copy.sqlite", coordinator_id=0)
tables = state.dump()
state.close()
shutil.rmtree(tmp)
print(tables["applied"][0][1], tables["epoch"][0][1])
for table, rows in tables.items():
    if table not in ("applied", "epoch"):
        for row in rows:
            print(json.dumps([table, *row], default=lambda v: v.hex()))
PY
  head -n 1 "$2.tmp"
  tail -n +2 "$2.tmp" >"$2"
  rm -f "$2.tmp"
}
row_counts() { jq -r '.[0]' "$1" | sort | uniq -c | awk '{printf "%s%s=%s", s, $2, $1; s=" "}'; }
stored_snapshot() {  # stored_snapshot POD -> offset of its shard's newest snapshot in the object store, -1: none
  k exec -i "$1" -- python - <<'PY'
import os
from lowtide.coordinator.snapshot_store import SnapshotStore
from lowtide.objectstore import open_object_store
shard = int(os.environ["HOSTNAME"].rsplit("-", 1)[1])
store = open_object_store(os.environ["LOWTIDE_OBJECT_STORE"], instrumented=False)
newest = SnapshotStore(store=store, shard=shard, keep=2).newest()
print(newest.offset if newest else -1)
PY
}
rows_dir=$K8S_RUN/coordinator-rows
rm -rf "$rows_dir" && mkdir -p "$rows_dir"
lt topics create --topic "$DTOPIC" --partitions 4 --diskless >/dev/null
for _ in $(seq 15); do lt produce --topic "$DTOPIC" --num-records 10 --record-size 100 >/dev/null; done
# the shard that applied the most
cpod="" best=-1
for p in $(k get pods -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=coordinator" \
             -o jsonpath='{.items[*].metadata.name}'); do
  applied=$(coord_rows "$p" "$rows_dir/$p.rows" | cut -d' ' -f1)
  echo "$p: applied offset $applied; $(row_counts "$rows_dir/$p.rows")"
  [ "$applied" -gt "$best" ] && cpod=$p best=$applied
done
[ "$best" -ge 10 ] || fail "no coordinator shard applied 10 metadata records (best $best)"
# Settled, with a snapshot in the store and a log tail after it: produce more until the newest
# stored snapshot is below the applied offset (then the log after it is all the restore has for
# the last records), two reads a moment apart agreeing (nothing in flight).
before_rows=$rows_dir/before.rows
head="" stored=-1
for _ in $(seq 10); do
  lt produce --topic "$DTOPIC" --num-records 10 --record-size 100 >/dev/null
  prev=""
  for _ in $(seq 30); do
    sleep 1
    head=$(coord_rows "$cpod" "$before_rows") || fail "$cpod: its tables could not be read"
    [ "$head" = "$prev" ] && cmp -s "$before_rows" "$before_rows.prev" && break
    prev=$head; cp "$before_rows" "$before_rows.prev"
  done
  [ "$head" = "$prev" ] || fail "$cpod: the state never settled"
  stored=$(stored_snapshot "$cpod") || fail "$cpod: the object store's snapshots could not be listed"
  [ "$stored" -ge 0 ] && [ "$stored" -lt "${head%% *}" ] && break
done
applied_before=${head%% *}
[ "$stored" -ge 0 ] || fail "$cpod: no snapshot in the object store"
[ "$stored" -lt "$applied_before" ] || fail "$cpod: no log tail after the newest stored snapshot ($stored, applied $applied_before)"
# not a vacuous comparison: the shard holds the diskless topic's partitions and its batches
grep -q "^\[\"partitions\", [0-9]*, \"[0-9a-f]*\", \"$DTOPIC\"" "$before_rows" || fail "$cpod holds no partition of $DTOPIC"
grep -q '^\["batches"' "$before_rows" || fail "$cpod holds no batch"
echo "$cpod before: applied offset $applied_before, newest stored snapshot at $stored" \
     "(a log tail of $((applied_before - stored)) records); $(wc -l <"$before_rows") rows: $(row_counts "$before_rows")"
pvc="data-$cpod"
old_pv=$(k get pvc "$pvc" -o jsonpath='{.spec.volumeName}')
k delete pvc "$pvc" --wait=false >/dev/null
k delete pod "$cpod" --wait=true >/dev/null
# The StatefulSet recreates the pod at once; one made while the old claim was still terminating
# waits for a claim that is gone, and only a new pod gets a new claim from the template.
new_pv=""
for _ in $(seq 240); do
  new_pv=$(k get pvc "$pvc" -o jsonpath='{.spec.volumeName}' 2>/dev/null || true)
  [ -n "$new_pv" ] && [ "$new_pv" != "$old_pv" ] && break
  if ! k get pvc "$pvc" >/dev/null 2>&1 \
     && [ "$(k get pod "$cpod" -o jsonpath='{.status.phase}' 2>/dev/null)" = Pending ]; then
    k delete pod "$cpod" --wait=false >/dev/null 2>&1 || true
  fi
  sleep 0.5
done
[ -n "$new_pv" ] && [ "$new_pv" != "$old_pv" ] || fail "$pvc: no new volume (was $old_pv, now '$new_pv')"
k wait pod "$cpod" --for=condition=Ready --timeout=180s >/dev/null || fail "$cpod did not come back"
after_rows=$rows_dir/after.rows
after=""
: >"$after_rows"
for _ in $(seq 60); do
  after=$(coord_rows "$cpod" "$after_rows" 2>/dev/null) && cmp -s "$before_rows" "$after_rows" && break
  sleep 1
done
echo "$cpod after:  applied offset ${after%% *}, volume $old_pv -> $new_pv;" \
     "$(wc -l <"$after_rows") rows: $(row_counts "$after_rows")"
if ! cmp -s "$before_rows" "$after_rows"; then
  { diff "$before_rows" "$after_rows" || true; } | cut -c1-300 | head -n 20 >&2
  fail "$cpod on a new volume: its tables differ from before the deletion (rows in $rows_dir)"
fi
echo "$cpod: the same $(wc -l <"$after_rows") rows, row for row"
k logs "$cpod" > "$K8S_RUN/logs/$cpod-restored.log" 2>&1 || true
downloaded=$(grep -F '"msg": "downloaded a snapshot from the object store"' "$K8S_RUN/logs/$cpod-restored.log" \
  | jq -r .offset | tail -n 1 || true)
[ "$downloaded" = "$stored" ] \
  || fail "$cpod came back without downloading the newest stored snapshot ($stored; downloaded: '${downloaded}')"
echo "$cpod downloaded the snapshot at $downloaded and applied the log from $((downloaded + 1))"

phase "Spark retention CronJob"
lt consume --topic "$TOPIC" --group "$GROUP" --max-records 1500 >/dev/null
committed=$(lt groups describe --group "$GROUP" --output json 2>/dev/null | jq -c . || true)
echo "group $GROUP: $committed"
job=retention-once-$RANDOM
k create job "$job" --from="cronjob/$REL-lowtide-retention" >/dev/null
k wait "job/$job" --for=condition=Complete --timeout=600s >/dev/null || { k logs "job/$job" --tail=50 >&2 || true; fail "retention job"; }
k logs "job/$job" | tail -n 15
start_after=$(offsets earliest)
echo "log start offsets: $after_start -> $start_after"
[ "$(sum "$start_after")" -gt "$(sum "$after_start")" ] || fail "the retention job did not advance the low watermark"
# the group read 1500 records from the log start: the job may not delete past its offsets
[ "$(sum "$start_after")" -le "$(( $(sum "$after_start") + 1500 ))" ] || fail "the retention job deleted past what the group consumed"

phase "certificate rotation"
# A renewed front door certificate (new key and serial, same CA and names, as cert-manager renews)
# written into its Secret: kubelet swaps the mounted files, every front door serves the new one on
# new connections without restarting, and calls through it keep working.
k get secret "$REL-lowtide-frontdoor-tls" -o json > "$K8S_RUN/leaf.json"
k get secret "$REL-lowtide-ca" -o json > "$K8S_RUN/ca.json"
serial=$("$repo/.venv/bin/python" "$here/rotate_cert.py" "$K8S_RUN/leaf.json" "$K8S_RUN/ca.json" \
  2>&1 >"$K8S_RUN/renewed.json") || fail "rotate_cert.py: $serial"
fd_pods=$(k get pods -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=frontdoor" -o json \
  | jq -r '.items[] | select(.metadata.deletionTimestamp == null) | "\(.metadata.name)=\(.metadata.uid)=\(.status.containerStatuses[0].restartCount)"')
k replace -f "$K8S_RUN/renewed.json" >/dev/null
served() {  # the serial (hex) of the certificate pod $1 serves on its gRPC port
  k exec "$1" -- python -c '
import os, socket, ssl
from cryptography import x509
ctx = ssl.create_default_context(cafile=os.environ["LOWTIDE_TLS_CA"])
ctx.load_cert_chain(os.environ["LOWTIDE_TLS_CERT"], os.environ["LOWTIDE_TLS_KEY"])
ctx.set_alpn_protocols(["h2"])
with socket.create_connection(("localhost", 9090), timeout=5) as s, ctx.wrap_socket(s, server_hostname="localhost") as t:
    print(format(x509.load_der_x509_certificate(t.getpeercert(True)).serial_number, "x"))' 2>/dev/null
}
t0=$SECONDS
for entry in $fd_pods; do
  pod=${entry%%=*}
  for _ in $(seq 90); do [ "$(served "$pod")" = "$serial" ] && break; sleep 2; done
  [ "$(served "$pod")" = "$serial" ] || fail "$pod does not serve the renewed certificate $serial after $((SECONDS - t0)) s"
  now=$(k get pod "$pod" -o json | jq -r '"\(.metadata.name)=\(.metadata.uid)=\(.status.containerStatuses[0].restartCount)"')
  [ "$now" = "$entry" ] || fail "$pod restarted for the renewed certificate ($entry -> $now)"
done
echo "front doors serve the renewed certificate $serial after $((SECONDS - t0)) s, not restarted"
lt topics describe --output json >/dev/null || fail "calls through the front door after the renewal"

phase "helm upgrade"
# the certificates and Redis' password are kept (lookup): an upgrade rotates nothing
secrets_digest() {
  k get secrets -l "app.kubernetes.io/instance=$REL" -o json \
    | jq -r '.items[] | select(.metadata.name | test("-(tls|ca|auth)$")) | "\(.metadata.name) \(.data | tostring | @base64)"' \
    | sort | sha256sum
}
secrets_before=$(secrets_digest)
helm upgrade "$REL" "$repo/charts/lowtide" -n "$NS" --reuse-values --set-string podAnnotations.upgraded=yes \
  --wait --timeout 10m >/dev/null || fail "helm upgrade"
for w in deployment/$REL-lowtide-frontdoor statefulset/$REL-lowtide-replica statefulset/$REL-lowtide-coordinator \
         statefulset/$REL-lowtide-etcd; do
  k rollout status "$w" --timeout=300s >/dev/null || fail "$w did not roll out after the upgrade"
done
wait_terminated || fail "old pods still terminating 120 s after the upgrade"
k wait pods -l "app.kubernetes.io/instance=$REL" --for=condition=Ready --timeout=180s \
  --field-selector=status.phase!=Succeeded >/dev/null || fail "pods not Ready after the upgrade"
# every partition led and fully replicated again before the offsets are compared
for _ in $(seq 120); do
  full=$(lt topics describe --output json | jq '[.topics[].partitions[] | select((.isr | length) < (.replicas | length))] | length')
  [ "$full" = 0 ] && break; sleep 0.5
done
[ "$full" = 0 ] || fail "$full partitions still under-replicated after the upgrade"
[ "$(secrets_digest)" = "$secrets_before" ] || fail "helm upgrade changed the certificate or password Secrets"
echo "certificates and Redis password unchanged by the upgrade"
upgraded_start=$(offsets earliest)
[ "$upgraded_start" = "$start_after" ] || fail "log start offsets $start_after -> $upgraded_start across the upgrade"

phase "scale 3 -> 4, rebalance"
# Records with known values (r1, r2, ...) produced with acks=all before the scale-up, between the
# rebalance and the scale-down, and after it: every one must read back at the end.
SCALE_TOPIC=k8s-scale
produce_range() {  # produce_range FROM TO: values rFROM..rTO into $SCALE_TOPIC, acks=all
  local i
  for i in $(seq 5); do
    seq "$1" "$2" | sed 's/^/r/' | k exec -i "$(pod_of frontdoor)" -- lowtide produce --topic "$SCALE_TOPIC" \
      --acks all --bootstrap-server localhost:9090 >/dev/null && return 0
    sleep 2  # a retry may duplicate records: the read-back compares the sets
  done
  return 1
}
read_back() {  # every value rFROM..rTO is in the topic (all partitions, from the earliest offset)
  local want got p
  want=$(seq "$1" "$2" | sed 's/^/r/' | sort -u)
  got=$(for p in 0 1 2; do
          lt consume --topic "$SCALE_TOPIC" --partition "$p" --offset earliest --timeout-ms 3000
        done | sort -u)
  missing=$(comm -23 <(echo "$want") <(echo "$got") | wc -l)
  [ "$missing" = 0 ] || { echo "missing: $(comm -23 <(echo "$want") <(echo "$got") | head -n 5 | tr '\n' ' ')" >&2; return 1; }
  echo "read back r$1..r$2: all $(echo "$want" | wc -l) acknowledged records ($(echo "$got" | wc -l) distinct values read)"
}
# the lowtide CLI once, not retried (a retry of a started reassignment would be refused as moving)
lt_once() { k exec "$(pod_of frontdoor)" -- lowtide "$@" --bootstrap-server localhost:9090; }
# partitions (internal topics too) whose replica list names broker $1
held_by() {
  local names
  names=$(lt topics list --include-internal --output json | jq -r '.topics[] | "--topic", .')
  # shellcheck disable=SC2086
  lt topics describe $names --output json \
    | jq --argjson b "$1" '[.topics[] | select(.diskless | not) | .partitions[] | select(.replicas | index($b))] | length'
}
brokers_json() {  # live brokers and their racks, as the front door knows them
  k exec -i "$(pod_of frontdoor)" -- python - <<'PY'
import json
from lowtide.client import Admin
with Admin("localhost:9090") as admin:
    snap = admin.describe_cluster([])
print(json.dumps({str(b): m.rack for b, m in sorted(snap.brokers.items()) if m.live}))
PY
}
lt topics create --topic "$SCALE_TOPIC" --partitions 3 --replication-factor 3 >/dev/null
produce_range 1 2000 || fail "produce r1..r2000"
replica_uids() { k get pods -l "app.kubernetes.io/instance=$REL,app.kubernetes.io/component=replica" -o json \
                   | jq -r '[.items[] | select(.metadata.deletionTimestamp == null) | "\(.metadata.name)=\(.metadata.uid)"] | sort | join(" ")'; }
uids_before=$(replica_uids)
helm upgrade "$REL" "$repo/charts/lowtide" -n "$NS" --reuse-values --set replica.replicas=4 \
  --wait --timeout 5m >/dev/null || fail "helm upgrade to 4 replicas"
k wait pod "$REL-lowtide-replica-3" --for=condition=Ready --timeout=180s >/dev/null || fail "replica 3 not Ready"
# the running replicas' pod template did not change (certificates listed up to replica.maxReplicas)
for entry in $uids_before; do
  grep -qw -- "$entry" <<<"$(replica_uids)" || fail "scaling up restarted ${entry%%=*}"
done
echo "replica 3 Ready; replicas 0-2 not restarted by the scale-up"
for _ in $(seq 60); do
  racks=$(brokers_json) || racks='{}'
  [ "$(jq length <<<"$racks")" = 4 ] && break; sleep 1
done
echo "live brokers and racks: $racks"
[ "$(jq length <<<"$racks")" = 4 ] || fail "4 live brokers expected after the scale-up: $racks"
[ "$(jq -r --arg z "$ZONE" '[.[] | select(. != $z)] | length' <<<"$racks")" = 0 ] \
  || fail "every broker's rack should be the node's zone $ZONE: $racks"
k logs "$REL-lowtide-replica-3" -c rack || true
lt_once rebalance --execute --wait --timeout 300 >"$K8S_RUN/rebalance.out" || { cat "$K8S_RUN/rebalance.out" >&2; fail "lowtide rebalance --execute --wait"; }
tail -n 3 "$K8S_RUN/rebalance.out"
on3=$(held_by 3)
echo "broker 3 holds $on3 partition replicas after the rebalance"
[ "$on3" -gt 0 ] || fail "the rebalance moved nothing onto broker 3"

phase "restart of pod 3: no drain"
# preStop reads the StatefulSet (4 replicas): ordinal 3 stays, so a plain restart must not drain
old_uid=$(k get pod "$REL-lowtide-replica-3" -o jsonpath='{.metadata.uid}')
k logs -f "$REL-lowtide-replica-3" -c replica >"$K8S_RUN/logs/replica-3-restart.log" 2>&1 &
logs_pid=$!
k delete pod "$REL-lowtide-replica-3" --wait=true >/dev/null
kill "$logs_pid" 2>/dev/null || true
# (the hook's words, when it may write to the container's log; what broker 3 holds is the proof)
grep '^preStop' "$K8S_RUN/logs/replica-3-restart.log" || true
for _ in $(seq 240); do
  uid=$(k get pod "$REL-lowtide-replica-3" -o jsonpath='{.metadata.uid}' 2>/dev/null || true)
  [ -n "$uid" ] && [ "$uid" != "$old_uid" ] && break; sleep 0.5
done
k wait pod "$REL-lowtide-replica-3" --for=condition=Ready --timeout=180s >/dev/null || fail "replica 3 did not come back"
[ "$(held_by 3)" = "$on3" ] || fail "a restart of pod 3 changed what broker 3 holds ($on3 -> $(held_by 3)): it drained"
echo "pod 3 restarted; broker 3 still holds its $on3 partition replicas"
produce_range 2001 4000 || fail "produce r2001..r4000 on 4 brokers"
read_back 1 4000 || fail "records missing on 4 brokers"

phase "scale-down refused below RF"
# 2 replicas < the topics' replication factor 3: the pre-upgrade check Job fails, nothing changes
if helm upgrade "$REL" "$repo/charts/lowtide" -n "$NS" --reuse-values --set replica.replicas=2 \
     --wait --timeout 3m >"$K8S_RUN/refused.out" 2>&1; then
  fail "helm upgrade to 2 replicas was accepted"
fi
grep -i hook "$K8S_RUN/refused.out" | head -n 2 || true
k logs "job/$REL-lowtide-scale-down-check" | tail -n 2 || true
k logs "job/$REL-lowtide-scale-down-check" | grep -q "REFUSED: replica.replicas=2 is below the replication factor" \
  || fail "the scale-down check did not give the replication factor as its reason"
[ "$(k get statefulset "$REL-lowtide-replica" -o jsonpath='{.spec.replicas}')" = 4 ] \
  || fail "the refused upgrade changed the StatefulSet"

phase "drain (preStop) + scale 4 -> 3"
# pod 3 is removed by the scale-down: its preStop runs lowtide drain --broker 3 before it stops
# (the hook writes to the container's log, which goes with the pod: followed from here)
k logs -f "$REL-lowtide-replica-3" -c replica >"$K8S_RUN/logs/replica-3.log" 2>&1 &
logs_pid=$!
helm upgrade "$REL" "$repo/charts/lowtide" -n "$NS" --reuse-values --set replica.replicas=3 \
  --wait --timeout 10m >/dev/null || fail "helm upgrade to 3 replicas"
for _ in $(seq 720); do k get pod "$REL-lowtide-replica-3" >/dev/null 2>&1 || break; sleep 1; done
! k get pod "$REL-lowtide-replica-3" >/dev/null 2>&1 || fail "pod 3 still there 12 min after the scale-down"
kill "$logs_pid" 2>/dev/null || true
grep -E '^preStop|^drain|holds no replica' "$K8S_RUN/logs/replica-3.log" | cut -c1-200 | head -n 6 || true
# nothing else moves replicas off broker 3 here: empty means its preStop drained it
left=$(held_by 3)
[ "$left" = 0 ] || fail "broker 3 still holds $left partition replicas after its pod went (its preStop did not drain it)"
# the drain command itself agrees (exit 0 only when the broker holds no replica)
lt_once drain --broker 3 --timeout 60 || fail "lowtide drain --broker 3 after the scale-down"
for _ in $(seq 120); do
  full=$(lt topics describe --output json | jq '[.topics[].partitions[] | select((.isr | length) < (.replicas | length))] | length')
  [ "$full" = 0 ] && break; sleep 0.5
done
[ "$full" = 0 ] || fail "$full partitions under-replicated after the scale-down"
produce_range 4001 5000 || fail "produce r4001..r5000 on 3 brokers"
read_back 1 5000 || fail "records missing after the drain and scale-down"

# lose_volume POD: POD deleted together with its PersistentVolumeClaim; returns once the StatefulSet
# brought it back Ready on a new, empty volume (as in the coordinator phase: a pod recreated while
# the old claim was still terminating waits for a claim that is gone, so it is deleted again)
lose_volume() {
  local pod=$1 pvc="data-$1" old_pv new_pv=""
  old_pv=$(k get pvc "$pvc" -o jsonpath='{.spec.volumeName}')
  k delete pvc "$pvc" --wait=false >/dev/null
  k delete pod "$pod" --wait=true >/dev/null
  for _ in $(seq 240); do
    new_pv=$(k get pvc "$pvc" -o jsonpath='{.spec.volumeName}' 2>/dev/null || true)
    [ -n "$new_pv" ] && [ "$new_pv" != "$old_pv" ] && break
    if ! k get pvc "$pvc" >/dev/null 2>&1 \
       && [ "$(k get pod "$pod" -o jsonpath='{.status.phase}' 2>/dev/null)" = Pending ]; then
      k delete pod "$pod" --wait=false >/dev/null 2>&1 || true
    fi
    sleep 0.5
  done
  [ -n "$new_pv" ] && [ "$new_pv" != "$old_pv" ] || { echo "$pvc: no new volume (was $old_pv, now '$new_pv')" >&2; return 1; }
  k wait pod "$pod" --for=condition=Ready --timeout=180s >/dev/null || { echo "$pod did not come back Ready" >&2; return 1; }
  echo "$pod is back on a new volume ($old_pv -> $new_pv)"
}
# restarts of the lowtide servers' containers ("pod=count" lines): riding out a store's loss, none restarts
server_restarts() {
  k get pods -l "app.kubernetes.io/instance=$REL" -o json | jq -r '.items[]
    | select(.metadata.labels["app.kubernetes.io/component"] | IN("replica", "frontdoor", "coordinator", "orphan-scanner"))
    | select(.metadata.deletionTimestamp == null)
    | "\(.metadata.name)=\([.status.containerStatuses[]?.restartCount] | add)"' | sort
}
etcdctl_in() { k exec "$(pod_of etcd)" -- etcdctl --dial-timeout 3s --command-timeout 10s "$@"; }

phase "etcd member lost with its volume"
# Issue 51: the etcd leader's pod deleted with its PVC while records are produced (acks=all, batches
# of 200 in the background): the member rejoins on its empty volume (its start script removes its
# old member entry and adds itself), the cluster has 3 healthy members again, every acknowledged
# record reads back, and no lowtide server restarted.
leader_url=$(etcdctl_in endpoint status --cluster -w simple | awk -F', ' '$5 == "true" {print $1}')
victim=$(sed -E 's|^[a-z]+://([^.:]+)[.:].*|\1|' <<<"$leader_url")
[ -n "$victim" ] || fail "no etcd leader found ($leader_url)"
echo "etcd leader: $victim"
restarts_before=$(server_restarts)
acked=$K8S_RUN/etcd-acked stop=$K8S_RUN/etcd-stop
: >"$acked"; rm -f "$stop"
(
  i=5001
  while [ ! -f "$stop" ]; do
    produce_range "$i" $((i + 199)) || { echo "FAILED r$i..r$((i + 199))" >>"$acked"; exit 1; }
    echo $((i + 199)) >>"$acked"
    i=$((i + 200))
  done
) &
producer=$!
sleep 3
lose_volume "$victim" || { touch "$stop"; fail "etcd member $victim lost with its volume did not come back"; }
# A here-string (see above): grep stopping at its match must not fail the pipeline under pipefail.
victim_log=$(k logs "$victim")
grep -q "rejoining it as a new member" <<<"$victim_log" \
  || { touch "$stop"; tail -n 20 <<<"$victim_log" >&2; fail "$victim did not rejoin as a new member"; }
healthy=0 started=0
for _ in $(seq 60); do
  healthy=$(etcdctl_in endpoint health --cluster 2>&1 | grep -c ' is healthy' || true)
  started=$(etcdctl_in member list 2>/dev/null | grep -c ', started, ' || true)
  [ "$healthy" = 3 ] && [ "$started" = 3 ] && break
  sleep 2
done
etcdctl_in member list
[ "$healthy" = 3 ] && [ "$started" = 3 ] || { touch "$stop"; fail "etcd: $healthy healthy and $started started members, wanted 3"; }
touch "$stop"
wait "$producer" || { tail -n 3 "$acked" >&2; fail "a produce (acks=all) failed while the etcd member was replaced"; }
last=$(tail -n 1 "$acked")
echo "produced r5001..r$last ($(wc -l <"$acked") batches of 200, acks=all) while $victim was replaced"
[ "$last" -gt 5200 ] || fail "too few batches produced while the etcd member was replaced (up to r$last)"
read_back 1 "$last" || fail "acknowledged records missing after the etcd member's loss"
[ "$(server_restarts)" = "$restarts_before" ] \
  || fail "lowtide servers restarted during the etcd member's loss: $(diff <(echo "$restarts_before") <(server_restarts) | tr '\n' ' ')"
echo "3 healthy etcd members; no lowtide server restarted"

phase "Redis lost with its volume"
# Redis holds no cluster metadata any more: its pod deleted with its PVC (a new, empty Redis), every
# record reads back, and the services keep working: a topic created, records produced and read.
restarts_before=$(server_restarts)
lose_volume "$REL-lowtide-redis-0" || fail "Redis lost with its volume did not come back"
produce_range $((last + 1)) $((last + 1000)) || fail "produce r$((last + 1))..r$((last + 1000)) after Redis was lost"
read_back 1 $((last + 1000)) || fail "records missing after Redis was lost"
lt topics create --topic k8s-after-redis --partitions 1 --replication-factor 3 >/dev/null || fail "topic creation after Redis was lost"
lt produce --topic k8s-after-redis --num-records 100 --record-size 100 >/dev/null || fail "produce to a new topic after Redis was lost"
n=$(lt consume --topic k8s-after-redis --partition 0 --offset earliest --max-records 100 --output json | jq -s 'length')
[ "$n" = 100 ] || fail "read $n of 100 records of a topic created after Redis was lost"
# The diskless coordinator shards' leases and registry are in etcd too: the diskless topic takes
# records right after Redis was lost, with no shard restarted (kubectl itself under timeout: k is a
# shell function, which timeout cannot run).
timeout 90 kubectl -n "$NS" exec "$(pod_of frontdoor)" -c frontdoor -- lowtide produce --topic "$DTOPIC" --num-records 10 \
  --record-size 100 --bootstrap-server localhost:9090 >/dev/null \
  || fail "produce to the diskless topic right after Redis was lost"
echo "diskless topic: produced to right after Redis was lost"
echo "lowtide server restarts across the Redis loss: $(diff <(echo "$restarts_before") <(server_restarts) | grep '^>' | tr '\n' ' ' || true)"

phase "helm uninstall"
helm uninstall "$REL" -n "$NS" --wait --timeout 5m >/dev/null || fail "helm uninstall"
for _ in $(seq 240); do
  [ -z "$(k get pods -o name 2>/dev/null)" ] && break; sleep 0.5
done
[ -z "$(k get pods -o name)" ] || fail "pods left after uninstall: $(k get pods -o name | tr '\n' ' ')"
# StatefulSet volumes outlive the release by design (as in Kafka charts): delete them explicitly
k delete pvc --all --wait=true >/dev/null
for _ in $(seq 120); do [ -z "$(kubectl get pv -o name)" ] && break; sleep 0.5; done
[ -z "$(kubectl get pv -o name)" ] || fail "volumes not deleted: $(kubectl get pv -o name | tr '\n' ' ')"
kubectl delete namespace "$NS" --wait=true --timeout=120s >/dev/null
phase ""
echo "k8s-test: passed"
cat "$K8S_PHASES_FILE"
