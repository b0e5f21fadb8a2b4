{{/* Chart name, possibly overridden. */}}
{{- define "lowtide.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name, at most 63 characters. */}}
{{- define "lowtide.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "lowtide.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; call with (dict "ctx" $ "component" "replica"). */}}
{{- define "lowtide.labels" -}}
helm.sh/chart: {{ include "lowtide.chart" .ctx }}
{{ include "lowtide.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{- define "lowtide.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lowtide.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The lowtide image: repo:tag, repo:tag@digest (as skaffold sets it) or repo@sha256:digest. */}}
{{- define "lowtide.image" -}}
{{- /* toString: an all-digit tag set with --set (a short git SHA) arrives as an integer */}}
{{- $tag := toString (default .Chart.AppVersion .Values.image.tag) }}
{{- if hasPrefix "sha256:" $tag }}
{{- printf "%s@%s" .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "lowtide.redisName" -}}
{{- printf "%s-redis" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lowtide.replicaName" -}}
{{- printf "%s-replica" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lowtide.replicaHeadless" -}}
{{- printf "%s-replica-headless" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lowtide.frontdoorName" -}}
{{- printf "%s-frontdoor" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Redis URL every lowtide process gets as LOWTIDE_REDIS_URL. The chart's Redis: rediss://
with TLS on (redis-py takes ssl_* from the query: the CA, and the pod's own certificate as the
client certificate), the password from the Secret through $(REDIS_PASSWORD) (kubelet expands it:
"lowtide.redisEnv" defines REDIS_PASSWORD and LOWTIDE_TLS_* first). */}}
{{- define "lowtide.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- $auth := ternary ":$(REDIS_PASSWORD)@" "" .Values.redis.auth.enabled }}
{{- $host := printf "%s.%s.svc.%s:%d" (include "lowtide.redisName" .) .Release.Namespace .Values.clusterDomain (int .Values.redis.port) }}
{{- if .Values.tls.enabled }}
{{- $q := "ssl_ca_certs=$(LOWTIDE_TLS_CA)" }}
{{- if .Values.redis.tls.authClients }}
{{- $q = printf "%s&ssl_certfile=$(LOWTIDE_TLS_CERT)&ssl_keyfile=$(LOWTIDE_TLS_KEY)" $q }}
{{- end }}
{{- printf "rediss://%s%s/0?%s" $auth $host $q }}
{{- else }}
{{- printf "redis://%s%s/0" $auth $host }}
{{- end }}
{{- else }}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl }}
{{- end }}
{{- end }}

{{- define "lowtide.etcdName" -}}
{{- printf "%s-etcd" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lowtide.etcdHeadless" -}}
{{- printf "%s-etcd-headless" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* An etcd member's stable name (its advertised peer and client host); call with (dict "ctx" $ "i" N). */}}
{{- define "lowtide.etcdMemberHost" -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "lowtide.etcdName" .ctx) (int .i) (include "lowtide.etcdHeadless" .ctx) .ctx.Release.Namespace .ctx.Values.clusterDomain }}
{{- end }}

{{/* The etcd members' image: etcd.image, or the lowtide image (it carries etcd and etcdctl). */}}
{{- define "lowtide.etcdImage" -}}
{{- if .Values.etcd.image.repository }}
{{- printf "%s:%s" .Values.etcd.image.repository (toString (required "etcd.image.tag is required with etcd.image.repository" .Values.etcd.image.tag)) }}
{{- else }}
{{- include "lowtide.image" . }}
{{- end }}
{{- end }}

{{/* The metadata store's URL every lowtide process gets as LOWTIDE_METADATA_URL: every member of
the chart's etcd by its own name (the client fails over between them; the client Service is for
tools), or etcd.externalEndpoints. etcds:// (with TLS on, or externalTls): mutual TLS with the
process's own certificate (LOWTIDE_TLS_*), which the chart's CA signed, as it signed the members'. */}}
{{- define "lowtide.metadataUrl" -}}
{{- if .Values.etcd.enabled }}
{{- $endpoints := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $endpoints = append $endpoints (printf "%s:%d" (include "lowtide.etcdMemberHost" (dict "ctx" $ "i" $i)) (int $.Values.etcd.clientPort)) }}
{{- end }}
{{- printf "%s://%s" (ternary "etcds" "etcd" .Values.tls.enabled) (join "," $endpoints) }}
{{- else }}
{{- if not .Values.etcd.externalEndpoints }}
{{- fail "etcd.externalEndpoints (HOST:PORT of each member) is required when etcd.enabled is false" }}
{{- end }}
{{- printf "%s://%s" (ternary "etcds" "etcd" .Values.etcd.externalTls) (join "," .Values.etcd.externalEndpoints) }}
{{- end }}
{{- end }}

{{- define "lowtide.metadataEnv" -}}
- name: LOWTIDE_METADATA_URL
  value: {{ include "lowtide.metadataUrl" . | quote }}
{{- end }}

{{/* etcd.migrateFromRedis: an init container of every lowtide server that, before the server first
talks to etcd, copies the metadata a release before etcd kept in Redis (once: the Redis is then
marked). A hook cannot do it: a pre-upgrade hook runs before the etcd of the upgrade exists, a
post-upgrade one after the servers started on an empty etcd (and made a new cluster id there).
Call with (dict "ctx" $ "dir" TLS-DIR), "podIndex" true for a replica (its TLS-DIR uses $(POD_INDEX)). */}}
{{- define "lowtide.metadataMigrateInit" -}}
{{- if .ctx.Values.etcd.migrateFromRedis.enabled }}
- name: metadata-migrate
  image: {{ include "lowtide.image" .ctx | quote }}
  imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
  {{- $cmd := list "python" "-c" (include "lowtide.metadataMigrateScript" .ctx) }}
  command:
    {{- toYaml $cmd | nindent 4 }}
  env:
    {{- if and .podIndex .ctx.Values.tls.enabled }}
    # a replica's certificate is under replica-<ordinal>/
    - name: POD_INDEX
      valueFrom:
        fieldRef:
          fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
    {{- end }}
    {{- include "lowtide.tlsEnv" (dict "ctx" .ctx "dir" .dir) | trim | nindent 4 }}
    {{- include "lowtide.redisEnv" .ctx | trim | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 64Mi}
    limits: {memory: 256Mi}
  securityContext:
    {{- toYaml .ctx.Values.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "lowtide.tmpVolumeMount" .ctx | nindent 4 }}
    {{- include "lowtide.tlsVolumeMount" .ctx | trim | nindent 4 }}
{{- end }}
{{- end }}

{{/* Skips at once when Redis holds no old metadata (lowtide:cluster_id) or was marked migrated;
else runs `lowtide metadata migrate` (retried while etcd comes up) and marks the Redis. */}}
{{- define "lowtide.metadataMigrateScript" -}}
import os, subprocess, sys, time
import redis
e = os.environ
cert = e.get("LOWTIDE_TLS_CERT")
for _ in range(120):  # a new replica's certificate Secret may come a moment after its pod
    if not cert or (os.path.exists(cert) and os.path.getsize(cert) > 0): break
    time.sleep(1)
url, mark = e["LOWTIDE_REDIS_URL"], "lowtide:metadata_migrated_to_etcd"
for attempt in range(60):
    try:
        r = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
        done, legacy = r.get(mark), r.get("lowtide:cluster_id")
        break
    except redis.RedisError as exc:
        print(f"metadata-migrate: Redis not answering ({exc}), retrying", flush=True)
        time.sleep(3)
else:
    sys.exit("metadata-migrate: Redis did not answer")
if done or legacy is None:
    print(f"metadata-migrate: cluster {done.decode()} was migrated to etcd before: nothing to do" if done
          else "metadata-migrate: the Redis holds no lowtide cluster metadata: nothing to migrate")
    sys.exit(0)
argv = ["lowtide", "metadata", "migrate", "--from-redis", url, "--metadata-url", e["LOWTIDE_METADATA_URL"]]
secret = e.get("REDIS_PASSWORD")
for attempt in range(20):
    run = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(run.stdout.replace(secret, "***") if secret else run.stdout, end="", flush=True)  # the URL has the password
    if run.returncode == 0:
        r.set(mark, legacy)
        sys.exit(0)
    time.sleep(5)
sys.exit("metadata-migrate: lowtide metadata migrate failed (above)")
{{- end }}

{{/* Pod annotations: Prometheus scrape + user annotations; call with (dict "ctx" $ "port" N
"container" NAME): NAME is the container `kubectl exec/logs` pick (the pods have init containers). */}}
{{- define "lowtide.podAnnotations" -}}
{{ include "lowtide.configChecksum" .ctx }}
{{- with .container }}
kubectl.kubernetes.io/default-container: {{ . }}
{{- end }}
{{- if .ctx.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: {{ .ctx.Values.metrics.path | quote }}
{{- if include "lowtide.metricsTls" .ctx }}
prometheus.io/scheme: https
{{- end }}
{{- end }}
{{- with .ctx.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Scheduling and security settings shared by the lowtide pods. */}}
{{- define "lowtide.podCommon" -}}
{{ include "lowtide.podCommonWith" (dict "ctx" . "apiToken" (eq .Values.leases.backend "kubernetes")) }}
{{- end }}

{{/* The same, with the ServiceAccount token mounted when "apiToken" (pods that call the
Kubernetes API: Leases, or the replicas' rack and drain-on-scale-down reads); call with
(dict "ctx" $ "apiToken" BOOL). */}}
{{- define "lowtide.podCommonWith" -}}
{{- $v := .ctx.Values -}}
serviceAccountName: {{ include "lowtide.serviceAccountName" .ctx }}
automountServiceAccountToken: {{ .apiToken }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The auth Secret's name; fails the render when auth is on without one. */}}
{{- define "lowtide.authSecret" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else if .Values.auth.tokens }}
{{- printf "%s-auth" (include "lowtide.fullname" .) }}
{{- else }}
{{- fail "auth.enabled needs auth.existingSecret or auth.tokens (see docs/operations.md#authentication)" }}
{{- end }}
{{- end }}

{{/* Env of every lowtide server with auth on (the flags fall back to these LOWTIDE_* variables). */}}
{{- define "lowtide.authEnv" -}}
{{- if .Values.auth.enabled }}
- name: LOWTIDE_AUTH_ENABLED
  value: "true"
- name: LOWTIDE_TOKENS_FILE
  value: {{ printf "%s/tokens" .Values.auth.mountPath | quote }}
- name: LOWTIDE_SUPER_USERS
  value: {{ .Values.auth.superUsers | quote }}
{{- end }}
{{- end }}

{{/* The auth Secret as a pod volume (mount it with "lowtide.authVolumeMount"). */}}
{{- define "lowtide.authVolume" -}}
{{- if .Values.auth.enabled }}
- name: auth
  secret:
    secretName: {{ include "lowtide.authSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "lowtide.authVolumeMount" -}}
{{- if .Values.auth.enabled }}
- name: auth
  mountPath: {{ .Values.auth.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "lowtide.coordinatorName" -}}
{{- printf "%s-coordinator" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lowtide.coordinatorHeadless" -}}
{{- printf "%s-coordinator-headless" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lowtide.scannerName" -}}
{{- printf "%s-orphan-scanner" (include "lowtide.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lowtide.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lowtide.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Diskless topics are on when the object store is configured. */}}
{{- define "lowtide.disklessEnabled" -}}
{{- if ne .Values.objectStore.type "none" }}true{{ end }}
{{- end }}

{{/* The object store URL of diskless topics' WAL files (LOWTIDE_OBJECT_STORE). */}}
{{- define "lowtide.objectStoreUrl" -}}
{{- if eq .Values.objectStore.type "volume" }}
{{- printf "file://%s" .Values.objectStore.volume.mountPath }}
{{- else if eq .Values.objectStore.type "s3" }}
{{- required "objectStore.s3.url is required when objectStore.type is s3 (s3://bucket[/prefix]?endpoint=...&region=...)" .Values.objectStore.s3.url }}
{{- end }}
{{- end }}

{{- define "lowtide.objectStoreSecret" -}}
{{- default (printf "%s-s3" (include "lowtide.fullname" .)) .Values.objectStore.s3.existingSecret }}
{{- end }}

{{/* Env for every process that reads the object store (replicas, coordinators, scanner). */}}
{{- define "lowtide.objectStoreEnv" -}}
{{- if include "lowtide.disklessEnabled" . }}
- name: LOWTIDE_OBJECT_STORE
  value: {{ include "lowtide.objectStoreUrl" . | quote }}
{{- if and (eq .Values.objectStore.type "s3") (or .Values.objectStore.s3.existingSecret .Values.objectStore.s3.accessKeyId) }}
# boto3 reads the standard AWS variables
- name: AWS_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ include "lowtide.objectStoreSecret" . }}, key: access-key-id}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ include "lowtide.objectStoreSecret" . }}, key: secret-access-key}}
{{- end }}
{{- end }}
{{- end }}

{{- define "lowtide.objectStoreVolume" -}}
{{- if eq .Values.objectStore.type "volume" }}
- name: objects
  persistentVolumeClaim:
    claimName: {{ include "lowtide.fullname" . }}-objects
{{- end }}
{{- end }}

{{- define "lowtide.objectStoreVolumeMount" -}}
{{- if eq .Values.objectStore.type "volume" }}
- name: objects
  mountPath: {{ .Values.objectStore.volume.mountPath }}
{{- end }}
{{- end }}

{{/* Leadership on Kubernetes Leases (front door controller, coordinator shards). */}}
{{- define "lowtide.leaseEnv" -}}
{{- if eq .Values.leases.backend "kubernetes" }}
- name: LOWTIDE_LEASE_BACKEND
  value: kubernetes
- name: LOWTIDE_LEASE_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: LOWTIDE_LEASE_NAME_PREFIX
  value: {{ include "lowtide.fullname" . | quote }}
{{- end }}
{{- end }}

{{/* Writable /tmp for read-only root filesystems (mount with "lowtide.tmpVolumeMount"). */}}
{{- define "lowtide.tmpVolume" -}}
- name: tmp
  emptyDir: {}
{{- end }}

{{- define "lowtide.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* The health probes of a lowtide server on port N; call with (dict "ctx" $ "port" N).
Without TLS: the kubelet's gRPC probes. With TLS (the kubelet's gRPC probe cannot do TLS): startup
and readiness exec "lowtide.tlsHealthCheck" (about 0.04 s of CPU; startup every 2 s only until it
first passes, so a pod is Ready as soon as it serves; readiness every 10 s), liveness is a TCP
connect (no process started). Generous timeouts: a busy 2-core node runs a short Python for seconds. */}}
{{- define "lowtide.grpcProbes" -}}
{{- if .ctx.Values.tls.enabled }}
{{- $exec := dict "command" (list "python" "-c" (include "lowtide.tlsHealthCheck" .ctx) (toString .port)) }}
startupProbe:
  exec:
    {{- toYaml $exec | nindent 4 }}
  periodSeconds: 2
  timeoutSeconds: 10
  failureThreshold: 90
readinessProbe:
  exec:
    {{- toYaml $exec | nindent 4 }}
  periodSeconds: 10
  timeoutSeconds: 10
livenessProbe:
  tcpSocket:
    port: {{ .port }}
  periodSeconds: 10
  failureThreshold: 6
{{- else }}
startupProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 2
  failureThreshold: 90
readinessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 5
livenessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 10
  failureThreshold: 6
{{- end }}
{{- end }}

{{/* grpc.health.v1.Health/Check of localhost:PORT (argv[1]) over mutual TLS with the pod's
LOWTIDE_TLS_* files: exit 0 when the answer is SERVING. The standard library only (importing grpc
costs 4 times the CPU): TLS with ALPN h2, the HTTP/2 preface, one HEADERS frame (HPACK literals)
and one DATA frame with the empty request; the answer's message is 08 01 for SERVING; trailers
alone, RST_STREAM or GOAWAY mean an error. */}}
{{- define "lowtide.tlsHealthCheck" -}}
import os, socket, ssl, struct, sys
e = os.environ.get
c = ssl.create_default_context(cafile=e("LOWTIDE_TLS_CA"))
c.load_cert_chain(e("LOWTIDE_TLS_CERT"), e("LOWTIDE_TLS_KEY"))
c.set_alpn_protocols(["h2"])
def fr(t, f, s, p): return struct.pack(">I", len(p))[1:] + bytes([t, f]) + struct.pack(">I", s) + p
def hd(n, v): return b"\0" + bytes([len(n)]) + n + bytes([len(v)]) + v
h = b"".join(hd(n, v) for n, v in ((b":method", b"POST"), (b":scheme", b"https"), (b":path", b"/grpc.health.v1.Health/Check"), (b":authority", b"localhost"), (b"content-type", b"application/grpc"), (b"te", b"trailers")))
with socket.create_connection(("localhost", int(sys.argv[1])), timeout=8) as r, c.wrap_socket(r, server_hostname="localhost") as t:
    t.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + fr(4, 0, 0, b"") + fr(1, 4, 1, h) + fr(0, 1, 1, b"\0" * 5))
    b = b""
    while True:
        while len(b) < 9 or len(b) < 9 + int.from_bytes(b[:3], "big"):
            d = t.recv(65536)
            if not d: sys.exit(1)
            b += d
        n = int.from_bytes(b[:3], "big"); ty, fl, p = b[3], b[4], b[9:9 + n]; b = b[9 + n:]
        if ty == 4 and not fl & 1: t.sendall(fr(4, 1, 0, b""))
        elif ty == 0 and len(p) >= 5: sys.exit(0 if p[5:] == b"\x08\x01" else 1)
        elif ty in (3, 7) or (ty == 1 and fl & 1): sys.exit(1)
{{- end }}

{{/* Checksum of the chart-made Secrets and config, so pods roll when they change. */}}
{{- define "lowtide.configChecksum" -}}
{{- $parts := list (toJson .Values.auth) (toJson .Values.objectStore) (toJson .Values.leases) (include "lowtide.redisUrl" .) (include "lowtide.metadataUrl" .) (toJson .Values.tls) (toJson .Values.redis.auth) }}
checksum/config: {{ join "|" $parts | sha256sum }}
{{- end }}
