{{- define "phalanx.labels" -}}
app.kubernetes.io/name: phalanx
app.kubernetes.io/part-of: phalanx
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "phalanx.partOf" -}}
app.kubernetes.io/part-of: phalanx
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The webhooks' namespaceSelector, also the config's managedJobsNamespaceSelector. */}}
{{- define "phalanx.namespaceSelector" -}}
{{- if .Values.namespaceSelector -}}
{{ toYaml .Values.namespaceSelector }}
{{- else -}}
matchExpressions:
- key: kubernetes.io/metadata.name
  operator: NotIn
  values: [kube-system, {{ .Release.Namespace }}]
{{- end -}}
{{- end -}}
