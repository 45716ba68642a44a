{{/* Labels Helm adds to every object on top of the Kustomize ones (tests/helm ignores exactly
these when comparing with config/default). */}}
{{- define "bigfleet.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The labels of one binary's objects: name, part-of, then Helm's. */}}
{{- define "bigfleet.labels" -}}
{{- if .name -}}
app.kubernetes.io/name: {{ .name }}
{{ end -}}
app.kubernetes.io/part-of: bigfleet-trio
{{ include "bigfleet.helmLabels" .root }}
{{- end -}}

{{- define "bigfleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "bigfleet.clusterId" -}}
{{ required "clusterId is required: this cluster's ID as the shard knows it (--set clusterId=ID)" .Values.clusterId }}
{{- end -}}

{{- define "bigfleet.shardAddr" -}}
{{ required "shardAddr is required: the shard's gRPC address HOST:PORT (--set shardAddr=HOST:PORT)" .Values.shardAddr }}
{{- end -}}

{{- define "bigfleet.bootstrapConfigMap" -}}
{{ .Values.bootstrapTemplate.existingConfigMap | default "bigfleet-bootstrap-template" }}
{{- end -}}

{{- define "bigfleet.shardTLSSecret" -}}
{{- if .Values.shardTLS.certManager.enabled -}}
bigfleet-shard-tls
{{- else -}}
{{ required "shardTLS.existingSecret is required when shardTLS.enabled (or set shardTLS.certManager.enabled)" .Values.shardTLS.existingSecret }}
{{- end -}}
{{- end -}}

{{/* The container and Pod security settings of the restricted Pod Security profile. */}}
{{- define "bigfleet.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "bigfleet.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "bigfleet.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: probes
  initialDelaySeconds: 5
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: probes
  initialDelaySeconds: 2
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/* nodeSelector, tolerations, affinity, priorityClassName of one binary's values. */}}
{{- define "bigfleet.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}
