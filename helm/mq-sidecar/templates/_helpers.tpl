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

{{/* Where the sidecar container mounts the TLS Secret and the admin token Secret: their own
directories, not under /etc/mq-sidecar (the ConfigMap's mount), so no mount point has to be
made inside another read-only volume. */}}
{{- define "mq-sidecar.tlsDir" -}}
/var/run/secrets/mq-sidecar/tls
{{- end -}}

{{- define "mq-sidecar.adminTokenDir" -}}
/var/run/secrets/mq-sidecar/admin
{{- end -}}

{{/* Where the sidecar container mounts the outbox volume: outbox_dir. */}}
{{- define "mq-sidecar.outboxDir" -}}
/var/lib/mq-sidecar/outbox
{{- end -}}

{{/*
mq-sidecar.outboxVolume: the outbox's volume type, "emptyDir" or "pvc", or "" when the outbox
is off. Refuses a volume smaller than 2 x outbox.maxBytes (the outbox takes up to about 1.7
times its frame bytes on disk, plus its write-ahead log): an emptyDir past its sizeLimit gets
the pod evicted, frames and all; a full claim refuses every SEND.
*/}}
{{- define "mq-sidecar.outboxVolume" -}}
{{- $v := .values | default .root.Values -}}
{{- $outbox := $v.outbox | default dict -}}
{{- if $outbox.enabled -}}
{{- $volume := $outbox.volume | default dict -}}
{{- $type := $volume.type | default "emptyDir" -}}
{{- $maxBytes := 1073741824.0 -}}
{{- if not (kindIs "invalid" $outbox.maxBytes) -}}{{- $maxBytes = float64 $outbox.maxBytes -}}{{- end -}}
{{- $key := ternary "size" "sizeLimit" (eq $type "pvc") -}}
{{- $quantity := ternary ($volume.size | default "") ($volume.sizeLimit | default "") (eq $type "pvc") -}}
{{- if and $quantity (not (and (eq $type "pvc") $volume.existingClaim)) -}}
{{- $bytes := include "mq-sidecar.quantityBytes" $quantity -}}
{{- if and $bytes (lt (float64 $bytes) (mulf 2 $maxBytes)) -}}
{{- fail (printf "outbox.volume.%s: %s is less than 2 x outbox.maxBytes (%d bytes): the outbox takes up to about 1.7 times its frame bytes on disk, plus its write-ahead log; %s" $key $quantity (int64 $maxBytes) (ternary "a full claim refuses every SEND" "past the sizeLimit the kubelet evicts the pod, and its emptyDir with the frames in it" (eq $type "pvc"))) -}}
{{- end -}}
{{- end -}}
{{- $type -}}
{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity (2Gi, 500M, 1073741824) in bytes, or "" for a form it does not read
(the check above is then skipped). */}}
{{- define "mq-sidecar.quantityBytes" -}}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 -}}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$" . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" . -}}
{{- $unit := trimPrefix $number . -}}
{{- mulf (float64 $number) (index $units $unit) -}}
{{- end -}}
{{- end -}}

{{/* The outbox's PersistentVolumeClaim: outbox.volume.existingClaim, or <fullname>-outbox
(made by the chart). */}}
{{- define "mq-sidecar.outboxClaimName" -}}
{{- $v := .values | default .root.Values -}}
{{- $v.outbox.volume.existingClaim | default (printf "%s-outbox" (include "mq-sidecar.fullname" .)) -}}
{{- end -}}

{{/* The pod's securityContext: podSecurityContext, with fsGroup (the sidecar's runAsGroup)
and fsGroupChangePolicy OnRootMismatch added for an outbox on a claim, whose root directory
belongs to root: the sidecar (not root) must write there. An fsGroup given wins. */}}
{{- define "mq-sidecar.podSecurityContext" -}}
{{- $v := .values | default .root.Values -}}
{{- $context := deepCopy ($v.podSecurityContext | default dict) -}}
{{- if and (eq (include "mq-sidecar.outboxVolume" .) "pvc") (not (hasKey $context "fsGroup")) -}}
{{- $group := 10001 -}}
{{- with $v.sidecar.securityContext -}}{{- if .runAsGroup -}}{{- $group = .runAsGroup -}}{{- end -}}{{- end -}}
{{- $_ := set $context "fsGroup" (int64 $group) -}}
{{- $_ := set $context "fsGroupChangePolicy" "OnRootMismatch" -}}
{{- end -}}
{{- if $context -}}
{{- toYaml $context -}}
{{- end -}}
{{- end -}}

{{/*
mq-sidecar.tlsFiles: the files of the TLS Secret (tls.existingSecret) the sidecar uses, as a
JSON list of {"option", "key", "path"}: the mq-sidecar option, the Secret's key, the file name
in mq-sidecar.tlsDir. Keys set to "" are left out. [] without tls.existingSecret. Refuses a
certificate without its key and the other way round, and a key password without the key.
*/}}
{{- define "mq-sidecar.tlsFiles" -}}
{{- $v := .values | default .root.Values -}}
{{- $tls := $v.tls | default dict -}}
{{- $files := list -}}
{{- if $tls.existingSecret -}}
{{- if and $tls.certKey (not $tls.keyKey) -}}
{{- fail "tls: certKey is set but keyKey is empty: a client certificate needs its key (set both, or both to \"\" without mutual TLS)" -}}
{{- end -}}
{{- if and $tls.keyKey (not $tls.certKey) -}}
{{- fail "tls: keyKey is set but certKey is empty: a key needs its client certificate (set both, or both to \"\" without mutual TLS)" -}}
{{- end -}}
{{- if and $tls.keyPasswordKey (not $tls.keyKey) -}}
{{- fail "tls: keyPasswordKey is set but keyKey is empty: a key password needs the key" -}}
{{- end -}}
{{- range $row := list (list "tls_ca_file" $tls.caKey "ca.crt") (list "tls_cert_file" $tls.certKey "tls.crt") (list "tls_key_file" $tls.keyKey "tls.key") (list "tls_key_password_file" $tls.keyPasswordKey "key-password") -}}
{{- if index $row 1 -}}
{{- $files = append $files (dict "option" (index $row 0) "key" (index $row 1) "path" (index $row 2)) -}}
{{- end -}}
{{- end -}}
{{- if not $files -}}
{{- fail (printf "tls.existingSecret %q: caKey, certKey and keyKey are all empty, nothing to mount (leave existingSecret empty to use the system trust store)" $tls.existingSecret) -}}
{{- end -}}
{{- end -}}
{{- toJson $files -}}
{{- end -}}

{{/* The admin token's Secret name, or "" when there is no token. Refuses
admin.tokenForMetrics without a token. */}}
{{- define "mq-sidecar.adminTokenSecretName" -}}
{{- $v := .values | default .root.Values -}}
{{- $admin := $v.admin | default dict -}}
{{- $secret := $admin.tokenSecret | default dict -}}
{{- if and $admin.tokenForMetrics (not $secret.name) -}}
{{- fail "admin.tokenForMetrics: /metrics would need a token, but admin.tokenSecret.name is empty" -}}
{{- end -}}
{{- $secret.name | default "" -}}
{{- end -}}

{{/*
mq-sidecar.chartOptions: the options the chart sets from values outside `config`, as TOML
lines: the TLS files (where the Secret is mounted) and settings, the admin token file,
max_sessions, the outbox (outbox_dir: where its volume is mounted).
*/}}
{{- define "mq-sidecar.chartOptions" -}}
{{- $v := .values | default .root.Values -}}
{{- $tls := $v.tls | default dict -}}
{{- $admin := $v.admin | default dict -}}
{{- $dir := include "mq-sidecar.tlsDir" . -}}
{{- range include "mq-sidecar.tlsFiles" . | fromJsonArray }}
{{ .option }} = {{ printf "%s/%s" $dir .path | quote }}
{{- end }}
{{- if kindIs "bool" $tls.verifyHostname }}
tls_verify_hostname = {{ include "mq-sidecar.tomlValue" $tls.verifyHostname }}
{{- end }}
{{- with $tls.serverName }}
tls_server_name = {{ include "mq-sidecar.tomlValue" . }}
{{- end }}
{{- if not (kindIs "invalid" $tls.minVersion) }}
tls_min_version = {{ include "mq-sidecar.tomlValue" (toString $tls.minVersion) }}
{{- end }}
{{- with $tls.ciphers }}
tls_ciphers = {{ include "mq-sidecar.tomlValue" . }}
{{- end }}
{{- if include "mq-sidecar.adminTokenSecretName" . }}
admin_token_file = {{ printf "%s/token" (include "mq-sidecar.adminTokenDir" .) | quote }}
admin_token_metrics = {{ if $admin.tokenForMetrics }}true{{ else }}false{{ end }}
{{- end }}
{{- if not (kindIs "invalid" $v.maxSessions) }}
max_sessions = {{ include "mq-sidecar.tomlValue" $v.maxSessions }}
{{- end }}
{{- with include "mq-sidecar.memoryBudget" . }}
max_memory_bytes = {{ . }}
{{- end }}
{{- if include "mq-sidecar.outboxVolume" . }}
outbox = true
outbox_dir = {{ include "mq-sidecar.outboxDir" . | quote }}
{{- if not (kindIs "invalid" $v.outbox.destinations) }}
outbox_destinations = {{ include "mq-sidecar.tomlValue" $v.outbox.destinations }}
{{- end }}
{{- if not (kindIs "invalid" $v.outbox.maxBytes) }}
outbox_max_bytes = {{ include "mq-sidecar.tomlValue" $v.outbox.maxBytes }}
{{- end }}
{{- if not (kindIs "invalid" $v.outbox.maxAge) }}
outbox_max_age = {{ include "mq-sidecar.tomlValue" $v.outbox.maxAge }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
mq-sidecar.memoryBudget: max_memory_bytes derived from the sidecar container's memory limit,
when config does not set it: the limit less 128 MiB for the process itself (about 40 MiB idle,
the sessions' own objects, the budget's overshoot: docs/behaviour.md, "One memory budget").
Empty without a limit, or one in a form mq-sidecar.quantityBytes does not read (the program's
default, 384 MiB, applies). A limit that leaves less than
one frame of max_frame_bytes needs (twice its size and 64 KiB) is refused with the reason.
*/}}
{{- define "mq-sidecar.memoryBudget" -}}
{{- $v := .values | default .root.Values -}}
{{- $config := $v.config | default dict -}}
{{- $limits := ($v.sidecar.resources | default dict).limits | default dict -}}
{{- $limit := "" -}}
{{- if and (not (hasKey $config "max_memory_bytes")) $limits.memory -}}
{{- $limit = include "mq-sidecar.quantityBytes" (toString $limits.memory) -}}
{{- end -}}
{{- if $limit -}}
{{- $budget := sub ($limit | float64 | int64) 134217728 -}}
{{- $frame := 150994944 -}}
{{- if hasKey $config "max_frame_bytes" -}}{{- $frame = $config.max_frame_bytes | int64 -}}{{- end -}}
{{- $needed := add (mul 2 $frame) 65536 -}}
{{- if lt $budget $needed -}}
{{- fail (printf "sidecar.resources.limits.memory: %v leaves max_memory_bytes %d (the limit less 128 MiB for the process), below what one frame of max_frame_bytes (%d) needs, %d (twice its size and 64 KiB): raise the limit to at least %d bytes, or set config.max_frame_bytes lower" $limits.memory $budget $frame $needed (add $needed 134217728)) -}}
{{- end -}}
{{- $budget -}}
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
admin_listen from sidecar.ports and the options of mq-sidecar.chartOptions (tls, admin,
maxSessions). Broker tables go last ([[brokers]]), as TOML requires.
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
# Credentials are not here: MQ_SIDECAR_LOGIN/PASSCODE come from a Secret; the TLS files and
# the admin token are files of Secrets mounted into the sidecar container only.
listen = {{ printf "127.0.0.1:%v" (int64 $v.sidecar.ports.stomp) | quote }}
admin_listen = {{ printf "0.0.0.0:%v" (int64 $v.sidecar.ports.admin) | quote }}
{{- range $key, $value := $config }}
{{- if and (eq $key "brokers") (kindIs "slice" $value) (gt (len $value) 0) (kindIs "map" (first $value)) }}
{{- else }}
{{ $key }} = {{ include "mq-sidecar.tomlValue" $value }}
{{- end }}
{{- end }}
{{- include "mq-sidecar.chartOptions" . }}
{{- if and (kindIs "slice" $brokers) (gt (len $brokers) 0) (kindIs "map" (first $brokers)) }}
{{- range $brokers }}
[[brokers]]
{{- range $key, $value := . }}
{{ $key }} = {{ include "mq-sidecar.tomlValue" $value }}
{{- end }}
{{- end }}
{{- end }}
{{ end -}}
