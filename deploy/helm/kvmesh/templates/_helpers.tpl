{{/* Chart name, shortened to the 63 characters a label value allows. */}}
{{- define "kvmesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name of every object. */}}
{{- define "kvmesh.fullname" -}}
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

{{- define "kvmesh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvmesh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvmesh
{{- end }}

{{- define "kvmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvmesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvmesh.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The kvmesh image: repository:tag or repository@digest; "latest" is refused. */}}
{{- define "kvmesh.image" -}}
{{- $img := .Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- $tag := default .Chart.AppVersion $img.tag | toString }}
{{- if eq $tag "latest" }}
{{- fail "image.tag: pin a version or a digest, not \"latest\"" }}
{{- end }}
{{- printf "%s:%s" $img.repository $tag }}
{{- end }}
{{- end }}

{{/* NATS URL(s) every kvmesh process dials. */}}
{{- define "kvmesh.natsURL" -}}
{{- if .Values.nats.enabled }}
{{- printf "nats://%s-nats.%s.svc:%d" (include "kvmesh.fullname" .) .Release.Namespace (int .Values.nats.port) }}
{{- else if .Values.nats.external.url }}
{{- .Values.nats.external.url }}
{{- else }}
{{- fail "nats.enabled is false: set nats.external.url (nats://host:4222)" }}
{{- end }}
{{- end }}

{{/* NATS client args for the credentials mounted from Secrets. */}}
{{- define "kvmesh.natsArgs" -}}
- --nats={{ include "kvmesh.natsURL" . }}
{{- with .Values.credentials.nats }}
{{- if .credsSecret }}
- --nats-creds=/etc/kvmesh/nats-creds/{{ .credsKey }}
{{- end }}
{{- if .tlsSecret }}
{{- if .caKey }}
- --nats-ca=/etc/kvmesh/nats-tls/{{ .caKey }}
{{- end }}
{{- if and .certKey .keyKey }}
- --nats-cert=/etc/kvmesh/nats-tls/{{ .certKey }}
- --nats-key=/etc/kvmesh/nats-tls/{{ .keyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvmesh.credentialVolumeMounts" -}}
{{- with .Values.credentials.nats }}
{{- if .credsSecret }}
- name: nats-creds
  mountPath: /etc/kvmesh/nats-creds
  readOnly: true
{{- end }}
{{- if .tlsSecret }}
- name: nats-tls
  mountPath: /etc/kvmesh/nats-tls
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "kvmesh.credentialVolumes" -}}
{{- with .Values.credentials.nats }}
{{- if .credsSecret }}
- name: nats-creds
  secret:
    secretName: {{ .credsSecret }}
    defaultMode: 0440
{{- end }}
{{- if .tlsSecret }}
- name: nats-tls
  secret:
    secretName: {{ .tlsSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}
{{- end }}

{{/* Models the frontend serves: frontend.models, else every worker group's model. */}}
{{- define "kvmesh.frontendModels" -}}
{{- $models := .Values.frontend.models }}
{{- if not $models }}
{{- $models = list }}
{{- range .Values.workers }}
{{- $w := deepCopy $.Values.workerDefaults }}
{{- include "kvmesh.overlay" (dict "dst" $w "src" .) }}
{{- $models = append $models $w.model }}
{{- end }}
{{- end }}
{{- $models | uniq | join "," }}
{{- end }}

{{/* prometheus.io/* annotations for the scrape config in deploy/prometheus. */}}
{{- define "kvmesh.scrapeAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
kvmesh.overlay sets every key of .src on .dst (a copy of workerDefaults).
Unlike mergeOverwrite it keeps false, 0 and "" from the group (controlPort: 0
turns peer transfer off); maps such as sim and resources merge one level deep.
*/}}
{{- define "kvmesh.overlay" -}}
{{- $dst := .dst }}
{{- range $k, $v := .src }}
{{- $d := get $dst $k }}
{{- if and (kindIs "map" $v) (kindIs "map" $d) }}
{{- $m := deepCopy $d }}
{{- range $k2, $v2 := $v }}
{{- $_ := set $m $k2 $v2 }}
{{- end }}
{{- $_ := set $dst $k $m }}
{{- else }}
{{- $_ := set $dst $k $v }}
{{- end }}
{{- end }}
{{- end }}
