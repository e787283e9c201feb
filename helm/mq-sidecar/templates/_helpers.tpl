{{/*
Names, labels and the TOML rendering of `config`.

Every template in this file and in _sidecar.tpl takes a dict, so that another chart that has
this chart as a dependency can call them with this chart's values:
  root    the root context ($)
  values  the mq-sidecar values; default: root.Values (right inside this chart). A parent chart
          passes (index .Values "mq-sidecar").
*/}}

{{/* The chart's name: "mq-sidecar" (fixed, so names agree in a parent chart's context). */}}
{{- define "mq-sidecar.name" -}}
{{- $v := .values | default .root.Values -}}
{{- $v.nameOverride | default "mq-sidecar" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of every object: <release>-mq-sidecar, or the release name when it already
contains the chart name, or fullnameOverride. At most 50 characters, so that the longest
suffix (-spark-executor-pod-template is on a ConfigMap, whose names may be longer) keeps a
Service name (-metrics) within the 63 characters of a DNS label. */}}
{{- define "mq-sidecar.fullname" -}}
{{- $v := .values | default .root.Values -}}
{{- $name := include "mq-sidecar.name" . -}}
{{- if $v.fullnameOverride -}}
{{- $v.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains $name .root.Release.Name -}}
{{- .root.Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .root.Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the pods running this release's sidecar (metrics Service). */}}
{{- define "mq-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mq-sidecar.name" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* Labels of every object of this chart. */}}
{{- define "mq-sidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mq-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: mq-sidecar
{{- end -}}

{{/* The sidecar image: repository@digest, or repository:tag (default: appVersion). */}}
{{- define "mq-sidecar.image" -}}
{{- $v := .values | default .root.Values -}}
{{- if $v.image.digest -}}
{{- printf "%s@%s" $v.image.repository $v.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $v.image.repository ($v.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* Object names. */}}
{{- define "mq-sidecar.configMapName" -}}
{{- include "mq-sidecar.fullname" . }}-config
{{- end -}}

{{- define "mq-sidecar.metricsName" -}}
{{- include "mq-sidecar.fullname" . }}-metrics
{{- end -}}

{{/* Secret with the sidecar's broker login, or "" when no credentials are configured. */}}
{{- define "mq-sidecar.brokerSecretName" -}}
{{- $v := .values | default .root.Values -}}
{{- if $v.credentials.existingSecret -}}
{{- $v.credentials.existingSecret -}}
{{- else if or $v.credentials.login $v.credentials.passcode -}}
{{- include "mq-sidecar.fullname" . }}-broker-credentials
{{- end -}}
{{- end -}}

{{/* Secret with the credentials apps present to the sidecar, or "". */}}
{{- define "mq-sidecar.clientSecretName" -}}
{{- $v := .values | default .root.Values -}}
{{- if $v.clientCredentials.existingSecret -}}
{{- $v.clientCredentials.existingSecret -}}
{{- else if or $v.clientCredentials.login $v.clientCredentials.passcode -}}
{{- include "mq-sidecar.fullname" . }}-client-credentials
{{- end -}}
{{- end -}}

{{/*
mq-sidecar.tomlValue: one value as TOML. Strings are JSON-quoted (a JSON string is a valid TOML
basic string), booleans as is, numbers without a fraction as integers (Helm reads every number
of a values file as a float: 10000 would print as 1e+04), other numbers as floats, lists as
inline arrays.
*/}}
{{- define "mq-sidecar.tomlValue" -}}
{{- if kindIs "string" . -}}
{{- toJson . -}}
{{- else if kindIs "bool" . -}}
{{- ternary "true" "false" . -}}
{{- else if kindIs "float64" . -}}
{{- if eq . (floor .) -}}{{- int64 . -}}{{- else -}}{{- . -}}{{- end -}}
{{- else if or (kindIs "int" .) (kindIs "int64" .) -}}
{{- . -}}
{{- else if kindIs "slice" . -}}
[{{- range $i, $e := . -}}{{- if $i -}}, {{ end -}}{{- include "mq-sidecar.tomlValue" $e -}}{{- end -}}]
{{- else -}}
{{- fail (printf "mq-sidecar: cannot write %v (%s) as a TOML value" . (kindOf .)) -}}
{{- end -}}
{{- end -}}

{{/*
mq-sidecar.toml: the mq-sidecar configuration file rendered from `config`, plus listen and
admin_listen from sidecar.ports. Broker tables go last ([[brokers]]), as TOML requires.
*/}}
{{- define "mq-sidecar.toml" -}}
{{- $v := .values | default .root.Values -}}
{{- $config := $v.config | default dict -}}
{{- $brokers := $config.brokers -}}
{{- $urls := list -}}
{{- if kindIs "string" $brokers -}}
{{- $urls = list $brokers -}}
{{- else if kindIs "slice" $brokers -}}
{{- range $brokers -}}
{{- if kindIs "string" . -}}{{- $urls = append $urls . -}}{{- else -}}{{- $urls = append $urls (.url | default "") -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq (int64 $v.sidecar.ports.stomp) (int64 $v.sidecar.ports.admin) -}}
{{- fail (printf "sidecar.ports: stomp and admin are both %d; they share the pod's network namespace and need two ports" (int64 $v.sidecar.ports.stomp)) -}}
{{- end -}}
{{- range $urls -}}
{{- if regexMatch "://[^/?#,()\\s]*@" . -}}
{{- fail (printf "config.brokers: %q has credentials in it (user:password@): they would be stored in a ConfigMap; set credentials.login/passcode (or credentials.existingSecret) instead" (regexReplaceAll "://[^/?#,()\\s]*@" . "://***@")) -}}
{{- end -}}
{{- end -}}
# mq-sidecar configuration, rendered by the Helm chart from .Values.config
# (option names and units as in config/examples/mq-sidecar.toml: ms, bytes).
# Credentials are not here: MQ_SIDECAR_LOGIN/PASSCODE come from a Secret.
listen = {{ printf "127.0.0.1:%v" (int64 $v.sidecar.ports.stomp) | quote }}
admin_listen = {{ printf "0.0.0.0:%v" (int64 $v.sidecar.ports.admin) | quote }}
{{- range $key, $value := $config }}
{{- if and (eq $key "brokers") (kindIs "slice" $value) (gt (len $value) 0) (kindIs "map" (first $value)) }}
{{- else }}
{{ $key }} = {{ include "mq-sidecar.tomlValue" $value }}
{{- end }}
{{- end }}
{{- if and (kindIs "slice" $brokers) (gt (len $brokers) 0) (kindIs "map" (first $brokers)) }}
{{- range $brokers }}
[[brokers]]
{{- range $key, $value := . }}
{{ $key }} = {{ include "mq-sidecar.tomlValue" $value }}
{{- end }}
{{- end }}
{{- end }}
{{ end -}}
