{{/* Brokers added and drained on Kubernetes (docs/operations.md#brokers-added-and-drained-on-kubernetes):
the replica pods' rack from their node's zone label, the drain of a pod removed by a scale-down,
and the pre-upgrade check that refuses a scale-down the cluster cannot absorb. */}}

{{/* Whether the replica pods call the Kubernetes API (and so get a ServiceAccount token). */}}
{{- define "lowtide.replicaApiToken" -}}
{{- if or (eq .Values.leases.backend "kubernetes") .Values.rackAwareness.enabled .Values.replica.drainOnScaleDown.enabled }}true{{ end }}
{{- end }}

{{/* The replica pods' grace period: the drain of a scale-down runs in preStop, and the grace period
counts from the start of preStop, so it must cover the drain's timeout, the API read before it
(up to 15 s) and the server's own shutdown afterwards. */}}
{{- define "lowtide.replicaGracePeriod" -}}
{{- $r := .Values.replica }}
{{- if $r.drainOnScaleDown.enabled }}
{{- max (int $r.terminationGracePeriodSeconds) (add (int $r.drainOnScaleDown.timeoutSeconds) 60) }}
{{- else }}
{{- int $r.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* `lowtide` connection flags of a command run inside a release pod: the front door Service (a
name in its certificate) and, with auth on, the super user's admin.properties of the auth Secret.
TLS comes from the pod's LOWTIDE_TLS_* variables. */}}
{{- define "lowtide.inClusterCliFlags" -}}
--bootstrap-server {{ include "lowtide.frontdoorName" . }}:{{ .Values.frontdoor.service.port }}
{{- if .Values.auth.enabled }} --command-config {{ .Values.auth.mountPath }}/admin.properties{{ end }}
{{- end }}

{{/* Init container script: write the value of the node's topologyKey label (argv[2]) to argv[1]
("" when the node has none: no rack, as a broker without --rack). A refused read (no RBAC) is an
error, not an empty rack: a silently rack-unaware broker would make placement rack-unaware for the
whole cluster (metadata/store.assign_replicas needs every broker's rack). */}}
{{- define "lowtide.rackScript" -}}
import os, sys, time
from kubernetes import client, config
from kubernetes.client.rest import ApiException
out, key, node = sys.argv[1], sys.argv[2], os.environ["NODE_NAME"]
config.load_incluster_config()
api = client.CoreV1Api()
for attempt in range(8):
    try:
        labels = api.read_node(node, _request_timeout=10).metadata.labels or {}
        break
    except ApiException as exc:
        if exc.status in (401, 403, 404):
            sys.exit(f"rack: cannot read node {node}: HTTP {exc.status} {exc.reason}. rackAwareness needs "
                     "get on nodes (the chart's ClusterRole with rbac.create=true), or set rackAwareness.enabled=false")
        error = exc
    except Exception as exc:  # the API server not reachable yet: retried
        error = exc
    time.sleep(min(2 ** attempt, 10))
else:
    sys.exit(f"rack: cannot read node {node}: {error}")
rack = labels.get(key, "")
with open(out, "w") as f:
    f.write(rack)
print(f"rack: node {node} {key}={rack}" if rack else f"rack: node {node} has no {key} label: no rack")
{{- end }}

{{/* preStop of a replica pod: drain only when this pod is removed by a scale-down. preStop cannot
be told why the pod stops, so it reads the StatefulSet's spec.replicas: a scale-down has already
lowered it below this pod's ordinal; a restart, a rolling update, an eviction or a node drain has
not (and a deleted StatefulSet, an uninstall, drains nothing either: the whole cluster goes). An
unreadable StatefulSet means no drain: a restart must never drain, and the pre-upgrade check has
already refused a scale-down the cluster cannot absorb. */}}
{{- define "lowtide.drainPreStop" -}}
{{- $d := .Values.replica.drainOnScaleDown -}}
# kubelet records a hook's output only when it fails (as an event): copy it to the container's log
if ( : >>/proc/1/fd/1 ) 2>/dev/null; then exec >>/proc/1/fd/1 2>&1; fi
ordinal=${HOSTNAME##*-}
want=$(python -c '
import sys
from kubernetes import client, config
try:
    config.load_incluster_config()
    print(client.AppsV1Api().read_namespaced_stateful_set(sys.argv[1], sys.argv[2], _request_timeout=15).spec.replicas)
except Exception as exc:
    sys.exit(f"HTTP {exc.status} {exc.reason}" if hasattr(exc, "status") else repr(exc)[:300])
' {{ include "lowtide.replicaName" . | quote }} "$POD_NAMESPACE" 2>/tmp/prestop.err) || want=
case $want in
  ''|*[!0-9]*)
    echo "preStop: StatefulSet {{ include "lowtide.replicaName" . }} not readable, no drain: $(tail -n 1 /tmp/prestop.err)"; exit 0;;
esac
if [ "$ordinal" -lt "$want" ]; then
  echo "preStop: broker $ordinal stays (the StatefulSet keeps $want replicas): no drain"; exit 0
fi
echo "preStop: broker $ordinal is removed (the StatefulSet is scaled to $want): lowtide drain --broker $ordinal"
exec lowtide drain --broker "$ordinal" --timeout {{ int $d.timeoutSeconds }}
{{- if gt (int $d.throttleBytesPerSecond) 0 }} --throttle {{ int $d.throttleBytesPerSecond }}{{ end }} {{ include "lowtide.inClusterCliFlags" . }}
{{- end }}

{{/* The pre-upgrade scale-down check (templates/scale-down-check.yaml), from `lowtide topics
list/describe` JSON (where replicas are) and `lowtide rebalance --plan` JSON (its "brokers" are the
live ones); diskless topics are left out (their data is in the object store, their "replicas" are
gateways). Refused: a new count below a topic's replication factor (the partitions could never be
fully replicated again); a removed broker that holds replicas when more than one live broker is
removed (a removed pod drains itself onto "the other live brokers", least loaded first, which would
be the empty brokers being removed too); fewer live brokers staying than a partition on the removed
broker has replicas (its drain would refuse, and the pod would go with its replicas). The reason
goes to the log and the pod's termination message. */}}
{{- define "lowtide.scaleDownCheckScript" -}}
import json, os, subprocess, sys, time
new, old = int(os.environ["NEW_REPLICAS"]), int(os.environ["OLD_REPLICAS"])
drain = os.environ["DRAIN_ON_SCALE_DOWN"] == "true"
flags = os.environ["LOWTIDE_CLI_FLAGS"].split()
def refuse(message):
    message = "scale-down check: REFUSED: " + message
    print(message, flush=True)
    try:
        with open("/dev/termination-log", "w") as f:
            f.write(message[:4000])
    except OSError:
        pass
    sys.exit(1)
def lowtide(*args):
    p = subprocess.run(["lowtide", *args, *flags, "--output", "json"], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"lowtide {' '.join(args[:2])}: {(p.stdout + p.stderr).strip()[-500:]}")
    return json.loads(p.stdout)
for attempt in range(8):  # the front door restarting, a topic deleted between the calls: again
    try:
        names = lowtide("topics", "list", "--include-internal")["topics"]
        topics = lowtide("topics", "describe", *[a for n in names for a in ("--topic", n)])["topics"] if names else []
        live = sorted(b["broker"] for b in lowtide("rebalance", "--plan")["brokers"])
        break
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        error = exc
        time.sleep(5)
else:
    refuse(f"cannot read the cluster's topics and brokers, so cannot tell whether the scale-down is safe: {error}")
rf, holders, stray, held = {}, {}, {}, {}
for t in topics:
    if t.get("diskless"):
        continue
    parts = t.get("partitions") or []
    rf[t["name"]] = t.get("replication_factor") or max((len(p["replicas"]) for p in parts), default=0)
    for p in parts:
        for b in p["replicas"]:
            if b >= new:
                into = stray if old and b >= old else holders
                into[b] = into.get(b, 0) + 1
                held.setdefault(b, {})[t["name"]] = max(held.get(b, {}).get(t["name"], 0), len(p["replicas"]))
staying = [b for b in live if b < new]
leaving = sorted({b for b in live if b >= new} | set(holders))
print(f"scale-down check: replicas {f'{old} -> {new}' if old else f'-> {new}'}; live brokers {live}; "
      f"{len(rf)} topics, largest replication factor {max(rf.values(), default=0)}; partitions on removed "
      f"brokers: {holders or 'none'}", flush=True)
if stray:
    print(f"scale-down check: warning: partitions list brokers without a pod ({stray}); "
          "move them with lowtide drain --broker K", flush=True)
above = sorted((r, n) for n, r in rf.items() if r > new)
if above:
    shown = ", ".join(f"{n} (RF {r})" for r, n in above[-10:][::-1])
    refuse(f"replica.replicas={new} is below the replication factor of {len(above)} topic(s): {shown}; "
           f"their partitions could never be fully replicated again. Keep at least {above[-1][0]} replicas, "
           "or lower those topics' replication factor first (lowtide reassign).")
if holders and len(leaving) > 1:
    refuse(f"brokers {leaving} would be removed at once and {sorted(holders)} still hold replicas "
           f"(partitions per broker: {holders}). A removed pod drains itself onto the other live brokers, "
           "which would include the others being removed: scale down one broker at a time "
           f"(--set replica.replicas={max(leaving)} first).")
if holders and not drain:
    k = next(iter(holders))
    refuse(f"broker {k} still holds {holders[k]} partition replica(s) and replica.drainOnScaleDown is off: "
           f"run lowtide drain --broker {k} first, or turn drainOnScaleDown on.")
for k in holders:
    short = {n: r for n, r in held[k].items() if r > len(staying)}
    if short:
        refuse(f"broker {k} holds replicas of {', '.join(f'{n} (RF {r})' for n, r in sorted(short.items()))} but "
               f"only {len(staying)} live broker(s) would stay ({staying}; brokers below {new} that are not live: "
               f"{[b for b in range(new) if b not in live]}): its drain could not place them. Bring those "
               "brokers back first.")
print("scale-down check: ok" + (f": broker {next(iter(holders))} drains itself in its preStop hook" if holders else ""))
{{- end }}
