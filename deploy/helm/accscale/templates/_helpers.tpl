{{/* The release's resources are named <release>-accscale unless the release's name already says accscale. */}}
{{- define "accscale.fullname" -}}
{{- if contains "accscale" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-accscale" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "accscale.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: accscale
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "accscale.selector" -}}
app.kubernetes.io/name: accscale
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The headless Service the sidecar of shard .shard follows: the operator's, or the shard's own. */}}
{{- define "accscale.tritonService" -}}
{{- if .root.Values.triton.existingService -}}
{{- .root.Values.triton.existingService -}}
{{- else -}}
{{- printf "%s-triton-%d" (include "accscale.fullname" .root) (int .shard) -}}
{{- end -}}
{{- end -}}
