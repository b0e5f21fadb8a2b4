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
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
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
{{- required "auth.existingSecret is required when auth.enabled is true (see README \"Authentication\")" .Values.auth.existingSecret }}
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
