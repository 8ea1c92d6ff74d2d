{{/* The one image, scheduler and agent alike. */}}
{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tessera.labels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The service account the scheduler runs as, as the API server names its requests. */}}
{{- define "tessera.schedulerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:tessera-scheduler
{{- end -}}

{{/* Extended resources Tessera manages: its own, then those of compat modes
     (tessera.model.podspec.gpu_resource_names). */}}
{{- define "tessera.managedResources" -}}
- tessera.io/gpu
- tessera.io/gpu-memory
- tessera.io/gpu-memory-percent
- tessera.io/gpu-cores
{{- if has "hami" .Values.scheduler.compat }}
- nvidia.com/gpu
- nvidia.com/gpumem
- nvidia.com/gpumem-percentage
- nvidia.com/gpucores
{{- end }}
{{- if has "gpu-manager" .Values.scheduler.compat }}
- tencent.com/vcuda-core
- tencent.com/vcuda-memory
{{- end }}
{{- end -}}

{{/* The Services the webhook's serving certificate is for (and webhook.url, if set),
     comma-joined: a generated certificate is made again when this changes. */}}
{{- define "tessera.servingNames" -}}
{{- $names := list "tessera-webhook" -}}
{{- if and .Values.claims.enabled .Values.claims.quota -}}
{{- $names = append $names "tessera-claims-webhook" -}}
{{- end -}}
{{- with .Values.webhook.url -}}
{{- $names = append $names . -}}
{{- end -}}
{{ join "," $names }}
{{- end -}}
