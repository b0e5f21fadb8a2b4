{{/* TLS (docs/operations.md#tls-on-kubernetes): every lowtide server's gRPC port speaks only TLS,
with a certificate from a kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt: the layout
cert-manager writes) mounted at tls.mountPath; the server's certificate is also the client
certificate it presents to the services it calls, and its subject is its principal
(CN=broker-N -> User:broker-N). Where a component's Secret comes from, first match wins:
tls.existingSecrets.<component> (yours), a cert-manager Certificate (tls.certManager.issuerRef.name),
or the chart's own CA (tls.selfSigned, templates/tls.yaml). */}}

{{- define "lowtide.metricsTls" -}}
{{- if and .Values.tls.enabled .Values.tls.metrics }}true{{ end }}
{{- end }}

{{- define "lowtide.certManager" -}}
{{- if and .Values.tls.enabled .Values.tls.certManager.issuerRef.name }}true{{ end }}
{{- end }}

{{/* The Secret of a component's certificate; call with (dict "ctx" $ "key" "frontdoor"), key one
of tls.existingSecrets' keys; replicas: (dict "ctx" $ "key" "replica" "ordinal" N), one Secret
per ordinal (existingSecrets.replica is then a prefix: <prefix>-N). */}}
{{- define "lowtide.tlsSecret" -}}
{{- $v := .ctx.Values.tls }}
{{- $existing := index $v.existingSecrets .key }}
{{- $component := .key | kebabcase }}
{{- if hasKey . "ordinal" }}
{{- if $existing }}
{{- printf "%s-%d" $existing (int .ordinal) }}
{{- else }}
{{- printf "%s-%s-%d-tls" (include "lowtide.fullname" .ctx) $component (int .ordinal) }}
{{- end }}
{{- else if $existing }}
{{- $existing }}
{{- else }}
{{- printf "%s-%s-tls" (include "lowtide.fullname" .ctx) $component }}
{{- end }}
{{- if not (or $existing $v.selfSigned (include "lowtide.certManager" .ctx)) }}
{{- fail (printf "tls.enabled needs a certificate for %s: tls.selfSigned=true, tls.certManager.issuerRef.name, or tls.existingSecrets.%s (docs/operations.md#tls-on-kubernetes)" .key .key) }}
{{- end }}
{{- end }}

{{/* Every certificate the release needs, as a JSON list of {key, secret, cn, dns, ips, managed}:
managed = the chart makes it (selfSigned or cert-manager), i.e. no existingSecret. The names are
every name a peer dials the component by: its Service in the four forms, per-pod names under the
headless Service and a wildcard for it (not over the bare headless name: gRPC refuses a wildcard
over a single label), localhost and 127.0.0.1 (the probes, port-forwards). */}}
{{- define "lowtide.tlsCerts" -}}
{{- $ns := .Release.Namespace }}
{{- $suffixes := list "" (printf ".%s" $ns) (printf ".%s.svc" $ns) (printf ".%s.svc.%s" $ns .Values.clusterDomain) }}
{{- $certs := list }}
{{- $local := list "localhost" }}
{{- $ips := list "127.0.0.1" }}
{{- /* replicas: one certificate each, CN=broker-N. On a scale-down the removed pods still run
(their preStop drains them, for minutes) after the upgrade, so the certificates of the ordinals the
running StatefulSet has (lookup) are kept until a later upgrade: deleting one would take the files
from under a draining pod (its optional projected source, templates/replica.yaml). */}}
{{- $headless := include "lowtide.replicaHeadless" . }}
{{- $running := lookup "apps/v1" "StatefulSet" .Release.Namespace (include "lowtide.replicaName" .) }}
{{- range $i := until (max (int .Values.replica.replicas) (int (dig "spec" "replicas" 0 $running)) | int) }}
{{- $dns := list }}
{{- range $s := $suffixes }}
{{- $dns = concat $dns (list (printf "%s-%d.%s%s" (include "lowtide.replicaName" $) $i $headless $s) (printf "%s%s" $headless $s)) }}
{{- if $s }}{{ $dns = append $dns (printf "*.%s%s" $headless $s) }}{{ end }}
{{- end }}
{{- $certs = append $certs (dict "key" "replica" "ordinal" $i "secret" (include "lowtide.tlsSecret" (dict "ctx" $ "key" "replica" "ordinal" $i)) "cn" (printf "broker-%d" $i) "dns" (concat $dns $local) "ips" $ips "managed" (not $.Values.tls.existingSecrets.replica)) }}
{{- end }}
{{- /* front door: its Service (bootstrap address, also what replicas' Kafka listeners call) */}}
{{- $dns := list }}
{{- range $s := $suffixes }}{{ $dns = append $dns (printf "%s%s" (include "lowtide.frontdoorName" $) $s) }}{{ end }}
{{- $certs = append $certs (dict "key" "frontdoor" "secret" (include "lowtide.tlsSecret" (dict "ctx" $ "key" "frontdoor")) "cn" "frontdoor" "dns" (concat $dns $local) "ips" $ips "managed" (not .Values.tls.existingSecrets.frontdoor)) }}
{{- if include "lowtide.disklessEnabled" . }}
{{- $ch := include "lowtide.coordinatorHeadless" . }}
{{- $dns = list }}
{{- range $s := $suffixes }}
{{- range $i := until (int $.Values.coordinator.shards) }}
{{- $dns = append $dns (printf "%s-%d.%s%s" (include "lowtide.coordinatorName" $) $i $ch $s) }}
{{- end }}
{{- $dns = append $dns (printf "%s%s" $ch $s) }}
{{- if $s }}{{ $dns = append $dns (printf "*.%s%s" $ch $s) }}{{ end }}
{{- end }}
{{- $certs = append $certs (dict "key" "coordinator" "secret" (include "lowtide.tlsSecret" (dict "ctx" $ "key" "coordinator")) "cn" "coordinator" "dns" (concat $dns $local) "ips" $ips "managed" (not .Values.tls.existingSecrets.coordinator)) }}
{{- if .Values.orphanScanner.enabled }}
{{- $dns = list }}
{{- range $s := $suffixes }}{{ $dns = append $dns (printf "%s%s" (include "lowtide.scannerName" $) $s) }}{{ end }}
{{- $certs = append $certs (dict "key" "orphanScanner" "secret" (include "lowtide.tlsSecret" (dict "ctx" $ "key" "orphanScanner")) "cn" "orphan-scanner" "dns" (concat $dns $local) "ips" $ips "managed" (not .Values.tls.existingSecrets.orphanScanner)) }}
{{- end }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- $dns = list }}
{{- range $s := $suffixes }}
{{- $dns = concat $dns (list (printf "%s%s" (include "lowtide.redisName" $) $s) (printf "%s-0.%s%s" (include "lowtide.redisName" $) (include "lowtide.redisName" $) $s)) }}
{{- end }}
{{- $certs = append $certs (dict "key" "redis" "secret" (include "lowtide.tlsSecret" (dict "ctx" $ "key" "redis")) "cn" "redis" "dns" (concat $dns $local) "ips" $ips "managed" (not .Values.tls.existingSecrets.redis)) }}
{{- end }}
{{- /* etcd: one certificate for every member, server and client (peers and etcdctl). Each member's
name is in it, not only the wildcard: a member accepts a peer's connection only when a name of the
peer's certificate resolves to the address it comes from (etcd's SAN check resolves no wildcard). */}}
{{- if .Values.etcd.enabled }}
{{- $eh := include "lowtide.etcdHeadless" . }}
{{- $dns = list }}
{{- range $s := $suffixes }}
{{- range $i := until (int $.Values.etcd.replicas) }}
{{- $dns = append $dns (printf "%s-%d.%s%s" (include "lowtide.etcdName" $) $i $eh $s) }}
{{- end }}
{{- $dns = concat $dns (list (printf "%s%s" (include "lowtide.etcdName" $) $s) (printf "%s%s" $eh $s)) }}
{{- if $s }}{{ $dns = append $dns (printf "*.%s%s" $eh $s) }}{{ end }}
{{- end }}
{{- $certs = append $certs (dict "key" "etcd" "secret" (include "lowtide.tlsSecret" (dict "ctx" $ "key" "etcd")) "cn" "etcd" "dns" (concat $dns $local) "ips" $ips "managed" (not .Values.tls.existingSecrets.etcd)) }}
{{- end }}
{{- /* the client identity of helm test, the ACL Job and the Spark jobs: User:admin */}}
{{- $certs = append $certs (dict "key" "admin" "secret" (include "lowtide.tlsSecret" (dict "ctx" $ "key" "admin")) "cn" "admin" "dns" (list) "ips" (list) "managed" (not .Values.tls.existingSecrets.admin)) }}
{{- toJson $certs }}
{{- end }}

{{/* Env of a lowtide container with TLS on: the server flags' LOWTIDE_TLS_* (also what every
channel the process, or a `lowtide` command exec'ed in the pod, dials with); call with (dict "ctx" $
"dir" PATH) where PATH holds tls.crt, tls.key, ca.crt. Servers also get client auth, the mapping
rules and LOWTIDE_METRICS_TLS ("server" true). */}}
{{- define "lowtide.tlsEnv" -}}
{{- if .ctx.Values.tls.enabled }}
- name: LOWTIDE_TLS_CERT
  value: {{ printf "%s/tls.crt" .dir | quote }}
- name: LOWTIDE_TLS_KEY
  value: {{ printf "%s/tls.key" .dir | quote }}
- name: LOWTIDE_TLS_CA
  value: {{ printf "%s/ca.crt" .dir | quote }}
{{- if .server }}
- name: LOWTIDE_TLS_CLIENT_AUTH
  value: {{ .ctx.Values.tls.clientAuth | quote }}
- name: LOWTIDE_TLS_PRINCIPAL_MAPPING_RULES
  value: {{ .ctx.Values.tls.principalMappingRules | quote }}
- name: LOWTIDE_METRICS_TLS
  value: {{ ternary "true" "false" (not (empty (include "lowtide.metricsTls" .ctx))) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's certificate Secret as the volume "tls"; call with (dict "ctx" $ "key" KEY). */}}
{{- define "lowtide.tlsVolume" -}}
{{- if .ctx.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "lowtide.tlsSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "lowtide.tlsVolumeMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* REDIS_PASSWORD (from the Redis password Secret) then LOWTIDE_REDIS_URL, which may use it and
LOWTIDE_TLS_* (so "lowtide.tlsEnv" goes before this), then LOWTIDE_METADATA_URL. */}}
{{- define "lowtide.redisEnv" -}}
{{- if include "lowtide.redisPasswordSecret" . }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "lowtide.redisPasswordSecret" . }}
      key: {{ .Values.redis.auth.existingSecretKey | quote }}
{{- end }}
- name: LOWTIDE_REDIS_URL
  value: {{ include "lowtide.redisUrl" . | quote }}
{{ include "lowtide.metadataEnv" . }}
{{- end }}

{{/* The Secret holding Redis' password ("" when Redis has none). */}}
{{- define "lowtide.redisPasswordSecret" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecret }}
{{- else if and .Values.redis.enabled .Values.redis.auth.enabled }}
{{- printf "%s-auth" (include "lowtide.redisName" .) }}
{{- end }}
{{- end }}

{{/* Env and volume of pods that call lowtide as a client (helm test, the ACL Job, Spark jobs):
the admin certificate (CN=admin: User:admin, a super user by default), and the metadata store's URL. */}}
{{- define "lowtide.clientTlsEnv" -}}
{{- include "lowtide.tlsEnv" (dict "ctx" . "dir" .Values.tls.mountPath) }}
{{ include "lowtide.metadataEnv" . }}
{{- end }}

{{/* The Kafka listeners' security protocol with TLS on: SSL (the client certificate is the
identity, kafka.sslClientAuth), or SASL_SSL with auth on (SASL logins, as SASL_PLAINTEXT without TLS). */}}
{{- define "lowtide.kafkaTlsProtocol" -}}
{{- ternary "SASL_SSL" "SSL" .Values.auth.enabled }}
{{- end }}
