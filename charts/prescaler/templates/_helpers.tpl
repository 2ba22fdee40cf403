{{/*
Names and labels shared by every template (and by rbac.yaml).
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "prescaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's object name prefix: fullnameOverride, else <release>-<chart name> (just
<release> when it already contains the chart name). At most 63 characters.
*/}}
{{- define "prescaler.fullname" -}}
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

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "prescaler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels on every object of the release. */}}
{{- define "prescaler.labels" -}}
helm.sh/chart: {{ include "prescaler.chart" . }}
{{ include "prescaler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prescaler
{{- end }}

{{/* The labels that select the operator pods (immutable once installed). */}}
{{- define "prescaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prescaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "prescaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "prescaler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The leader-election Lease (in the release namespace). */}}
{{- define "prescaler.leaseName" -}}
{{- default (include "prescaler.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* Every Lease the operator uses, as a YAML flow list: the leader Lease, or with shards
one Lease per shard and one per member slot (operator/prescaler/sharding.py lease_names). */}}
{{- define "prescaler.leaseNames" -}}
{{- $base := include "prescaler.leaseName" . }}
{{- $names := list }}
{{- if gt (int .Values.shards) 0 }}
{{- range $i := until (int .Values.shards) }}
{{- $names = append $names (printf "%s-shard-%d" $base $i) }}
{{- end }}
{{- range $i := until (int .Values.shards) }}
{{- $names = append $names (printf "%s-member-%d" $base $i) }}
{{- end }}
{{- else }}
{{- $names = list $base }}
{{- end }}
{{- $names | toJson }}
{{- end }}

{{/* The operator image reference: repository:tag, or repository@digest. */}}
{{- define "prescaler.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The labels that select the admission pods (prescaler admit), never the operator's. */}}
{{- define "prescaler.admissionSelectorLabels" -}}
app.kubernetes.io/name: {{ include "prescaler.name" . }}-admission
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: admission
{{- end }}
