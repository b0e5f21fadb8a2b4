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

{{/* The Redis URL every lowtide process gets as LOWTIDE_REDIS_URL. */}}
{{- define "lowtide.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s.%s.svc.%s:%d/0" (include "lowtide.redisName" .) .Release.Namespace .Values.clusterDomain (int .Values.redis.port) }}
{{- else }}
{{- required "redis.externalUrl is required when redis.enabled is false" .Values.redis.externalUrl }}
{{- end }}
{{- end }}

{{/* Pod annotations: Prometheus scrape + user annotations; call with (dict "ctx" $ "port" N). */}}
{{- define "lowtide.podAnnotations" -}}
{{ include "lowtide.configChecksum" .ctx }}
{{- if .ctx.Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: {{ .ctx.Values.metrics.path | quote }}
{{- end }}
{{- with .ctx.Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Scheduling and security settings shared by the lowtide pods. */}}
{{- define "lowtide.podCommon" -}}
serviceAccountName: {{ include "lowtide.serviceAccountName" . }}
automountServiceAccountToken: {{ eq .Values.leases.backend "kubernetes" }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
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

{{/* The standard gRPC health probes of a lowtide server on port N; call with the port. */}}
{{- define "lowtide.grpcProbes" -}}
startupProbe:
  grpc:
    port: {{ . }}
  periodSeconds: 2
  failureThreshold: 90
readinessProbe:
  grpc:
    port: {{ . }}
  periodSeconds: 5
livenessProbe:
  grpc:
    port: {{ . }}
  periodSeconds: 10
  failureThreshold: 6
{{- end }}

{{/* Checksum of the chart-made Secrets and config, so pods roll when they change. */}}
{{- define "lowtide.configChecksum" -}}
{{- $parts := list (toJson .Values.auth) (toJson .Values.objectStore) (toJson .Values.leases) (include "lowtide.redisUrl" .) }}
checksum/config: {{ join "|" $parts | sha256sum }}
{{- end }}
