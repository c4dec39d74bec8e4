{{/* The chart's name, or nameOverride. */}}
{{- define "epo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name, the prefix of every object: the chart's name alone
when the release is named after it, as most installs are.
*/}}
{{- define "epo.fullname" -}}
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

{{- define "epo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The recommended labels, on every object. */}}
{{- define "epo.labels" -}}
helm.sh/chart: {{ include "epo.chart" . }}
{{ include "epo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: egress-proxies-operator
{{- end }}

{{/* What the Deployment, the Services and the NetworkPolicy select on. */}}
{{- define "epo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "epo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller-manager
{{- end }}

{{- define "epo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "epo.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "epo.tokenSecretName" -}}
{{- default (printf "%s-discovery-token" (include "epo.fullname" .)) .Values.discovery.token.secretName }}
{{- end }}

{{- define "epo.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The providers config file, as the operator reads it. */}}
{{- define "epo.providersConfig" -}}
{{- dict "providers" .Values.providers | toYaml }}
{{- end }}

{{/* The ServiceMonitor renders only when asked for and served. */}}
{{- define "epo.serviceMonitorServed" -}}
{{- if and .Values.metrics.enabled .Values.metrics.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") }}true{{ end }}
{{- end }}

{{/*
epo.prometheusRuleServed is "true" when the PrometheusRule is asked for and
the cluster serves its API, as epo.serviceMonitorServed for the
ServiceMonitor.
*/}}
{{- define "epo.prometheusRuleServed" -}}
{{- if and .Values.metrics.enabled .Values.metrics.prometheusRule.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") }}true{{ end }}
{{- end }}
