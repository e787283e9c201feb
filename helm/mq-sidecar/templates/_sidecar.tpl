{{/*
Sidecar injection: named templates that put mq-sidecar into any pod spec. Each takes a dict
with "root": this chart's context. Inside this chart that is `.`; in a chart that has this one
as a dependency (in charts/ or under `dependencies:`), it is `index .Subcharts "mq-sidecar"`
(Helm >= 3.7), so the sidecar's values, defaults and names are the dependency's own:

  {{- $mq := dict "root" (index .Subcharts "mq-sidecar") }}
  spec:
    enableServiceLinks: false
    terminationGracePeriodSeconds: {{ include "mq-sidecar.terminationGracePeriodSeconds" $mq }}
    {{- if $mq.root.Values.sidecar.native }}
    initContainers:
      {{- include "mq-sidecar.container" $mq | nindent 6 }}
    {{- end }}
    containers:
      - name: app
        env:
          {{- include "mq-sidecar.appEnv" $mq | nindent 10 }}
      {{- if not $mq.root.Values.sidecar.native }}
      {{- include "mq-sidecar.container" $mq | nindent 6 }}
      {{- end }}
    volumes:
      {{- include "mq-sidecar.volumes" $mq | nindent 6 }}

Pod labels "mq-sidecar.selectorLabels" put the pod behind the metrics Service; annotations
"mq-sidecar.podAnnotations" add Prometheus' pod annotations and the config checksum. The
dependency renders the ConfigMap, Secrets and metrics Service the container refers to; set
exampleApp.enabled and sparkExecutor.enabled to false there if you do not want them. A
"values" key in the dict overrides root.Values.
*/}}

{{/* The termination grace period the sidecar needs: shutdownDelaySeconds for the app, then
the drain (drain_timeout, rounded up to seconds), then 5 s of margin, which covers what a
drained session may take past the deadline (4.5 s at most: its report to the app, the
DISCONNECT's receipt, its ERROR; docs/deploy.md, "Shutdown order"). An explicit
sidecar.terminationGracePeriodSeconds below that is refused. */}}
{{- define "mq-sidecar.terminationGracePeriodSeconds" -}}
{{- $v := .values | default .root.Values -}}
{{- $drainMs := 10000 -}}
{{- if and $v.config (hasKey $v.config "drain_timeout") -}}{{- $drainMs = $v.config.drain_timeout -}}{{- end -}}
{{- $delay := int64 $v.sidecar.shutdownDelaySeconds -}}
{{- $needed := add $delay (int64 (ceil (divf $drainMs 1000))) 5 -}}
{{- $given := $v.sidecar.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $given -}}
{{- $needed -}}
{{- else if lt (int64 $given) (int64 $needed) -}}
{{- fail (printf "sidecar.terminationGracePeriodSeconds: %d is too short: mq-sidecar needs shutdownDelaySeconds (%d) + drain_timeout (%v ms, rounded up to %d s) + 5 s margin = %d s, or the kubelet kills it (SIGKILL) in the middle of its drain" (int64 $given) $delay $drainMs (int64 (ceil (divf $drainMs 1000))) (int64 $needed)) -}}
{{- else -}}
{{- int64 $given -}}
{{- end -}}
{{- end -}}

{{/* Environment of the sidecar container: credentials from Secrets, then sidecar.extraEnv. */}}
{{- define "mq-sidecar.sidecarEnv" -}}
{{- $v := .values | default .root.Values -}}
{{- $broker := include "mq-sidecar.brokerSecretName" . -}}
{{- $client := include "mq-sidecar.clientSecretName" . -}}
{{- if $broker }}
- name: MQ_SIDECAR_LOGIN
  valueFrom:
    secretKeyRef:
      name: {{ $broker }}
      key: {{ $v.credentials.loginKey }}
- name: MQ_SIDECAR_PASSCODE
  valueFrom:
    secretKeyRef:
      name: {{ $broker }}
      key: {{ $v.credentials.passcodeKey }}
{{- end }}
{{- if $client }}
- name: MQ_SIDECAR_CLIENT_LOGIN
  valueFrom:
    secretKeyRef:
      name: {{ $client }}
      key: {{ $v.clientCredentials.loginKey }}
- name: MQ_SIDECAR_CLIENT_PASSCODE
  valueFrom:
    secretKeyRef:
      name: {{ $client }}
      key: {{ $v.clientCredentials.passcodeKey }}
{{- end }}
{{- with $v.sidecar.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
mq-sidecar.container: the sidecar container, as one item of a `containers` list (sidecar.native
false) or of `initContainers` (sidecar.native true: restartPolicy Always). Loopback STOMP for
the app, admin HTTP for the kubelet and Prometheus, config from the ConfigMap, credentials,
TLS files and admin token from Secrets (this container only), hardened securityContext.
*/}}
{{- define "mq-sidecar.container" -}}
{{- $v := .values | default .root.Values -}}
{{- $env := include "mq-sidecar.sidecarEnv" . | trim -}}
- name: mq-sidecar
  image: {{ include "mq-sidecar.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if $v.sidecar.native }}
  restartPolicy: Always
  {{- end }}
  args:
    - run
    - --config
    - /etc/mq-sidecar/mq-sidecar.toml
  {{- if $env }}
  env:
    {{- $env | nindent 4 }}
  {{- end }}
  ports:
    # STOMP, bound to 127.0.0.1: only containers of this pod reach it.
    - name: stomp
      containerPort: {{ int64 $v.sidecar.ports.stomp }}
      protocol: TCP
    - name: admin
      containerPort: {{ int64 $v.sidecar.ports.admin }}
      protocol: TCP
  startupProbe:
    httpGet:
      path: /healthz
      port: admin
    periodSeconds: {{ int64 $v.sidecar.startupProbe.periodSeconds }}
    timeoutSeconds: {{ int64 $v.sidecar.startupProbe.timeoutSeconds }}
    failureThreshold: {{ int64 $v.sidecar.startupProbe.failureThreshold }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: admin
    periodSeconds: {{ int64 $v.sidecar.livenessProbe.periodSeconds }}
    timeoutSeconds: {{ int64 $v.sidecar.livenessProbe.timeoutSeconds }}
    failureThreshold: {{ int64 $v.sidecar.livenessProbe.failureThreshold }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: {{ int64 $v.sidecar.readinessProbe.periodSeconds }}
    timeoutSeconds: {{ int64 $v.sidecar.readinessProbe.timeoutSeconds }}
    failureThreshold: {{ int64 $v.sidecar.readinessProbe.failureThreshold }}
  {{- if and (not $v.sidecar.native) (gt (int64 $v.sidecar.shutdownDelaySeconds) 0) }}
  lifecycle:
    # Plain container: every container gets SIGTERM at once, so the sidecar waits for the
    # app to close its sessions before it starts to drain.
    preStop:
      sleep:
        seconds: {{ int64 $v.sidecar.shutdownDelaySeconds }}
  {{- end }}
  {{- with $v.sidecar.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.sidecar.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: mq-sidecar-config
      mountPath: /etc/mq-sidecar
      readOnly: true
    {{- if include "mq-sidecar.tlsFiles" . | fromJsonArray }}
    # Broker CA, client certificate and key: this container only. A directory, never
    # subPath: the kubelet updates a Secret's directory mount when the Secret changes
    # (a renewed certificate), a subPath mount never; the sidecar re-reads the files at
    # every broker connect.
    - name: mq-sidecar-tls
      mountPath: {{ include "mq-sidecar.tlsDir" . }}
      readOnly: true
    {{- end }}
    {{- if include "mq-sidecar.adminTokenSecretName" . }}
    # Admin token: this container only, a directory mount too (rotation, as above).
    - name: mq-sidecar-admin-token
      mountPath: {{ include "mq-sidecar.adminTokenDir" . }}
      readOnly: true
    {{- end }}
    {{- if include "mq-sidecar.outboxVolume" . }}
    # The outbox (outbox_dir): this container only; one sidecar per directory (a lock).
    - name: mq-sidecar-outbox
      mountPath: {{ include "mq-sidecar.outboxDir" . }}
    {{- end }}
{{- end -}}

{{/* mq-sidecar.volumes: the volumes the container mounts, as items of a `volumes` list: the
config, the TLS and admin token Secrets when configured, and the outbox's volume (an
emptyDir or a claim) when it is on (only the sidecar container mounts them). */}}
{{- define "mq-sidecar.volumes" -}}
{{- $v := .values | default .root.Values -}}
{{- $tlsFiles := include "mq-sidecar.tlsFiles" . | fromJsonArray -}}
{{- $token := include "mq-sidecar.adminTokenSecretName" . -}}
- name: mq-sidecar-config
  configMap:
    name: {{ include "mq-sidecar.configMapName" . }}
{{- if $tlsFiles }}
- name: mq-sidecar-tls
  secret:
    secretName: {{ $v.tls.existingSecret }}
    # The files the sidecar uses, under fixed names; a listed key missing from the Secret
    # keeps the pod from starting (set that key's value to "" to leave the file out).
    items:
      {{- range $tlsFiles }}
      - key: {{ .key }}
        path: {{ .path }}
      {{- end }}
{{- end }}
{{- if $token }}
- name: mq-sidecar-admin-token
  secret:
    secretName: {{ $token }}
    items:
      - key: {{ $v.admin.tokenSecret.key }}
        path: token
{{- end }}
{{- $outbox := include "mq-sidecar.outboxVolume" . }}
{{- if eq $outbox "pvc" }}
- name: mq-sidecar-outbox
  persistentVolumeClaim:
    claimName: {{ include "mq-sidecar.outboxClaimName" . }}
{{- else if $outbox }}
- name: mq-sidecar-outbox
  {{- with $v.outbox.volume.sizeLimit }}
  emptyDir:
    sizeLimit: {{ . }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- end }}
{{- end -}}

{{/* mq-sidecar.appEnv: environment for the app container: where the sidecar listens
(STOMP_HOST, STOMP_PORT) and, when configured, the client credentials (STOMP_LOGIN,
STOMP_PASSCODE). Never the broker credentials. */}}
{{- define "mq-sidecar.appEnv" -}}
{{- $v := .values | default .root.Values -}}
{{- $client := include "mq-sidecar.clientSecretName" . -}}
- name: STOMP_HOST
  value: 127.0.0.1
- name: STOMP_PORT
  value: {{ int64 $v.sidecar.ports.stomp | quote }}
{{- if $client }}
- name: STOMP_LOGIN
  valueFrom:
    secretKeyRef:
      name: {{ $client }}
      key: {{ $v.clientCredentials.loginKey }}
- name: STOMP_PASSCODE
  valueFrom:
    secretKeyRef:
      name: {{ $client }}
      key: {{ $v.clientCredentials.passcodeKey }}
{{- end }}
{{- end -}}

{{/* mq-sidecar.podAnnotations: Prometheus pod-discovery annotations (metrics.podAnnotations)
and a checksum of the config, so a config change rolls the pods. */}}
{{- define "mq-sidecar.podAnnotations" -}}
{{- $v := .values | default .root.Values -}}
checksum/mq-sidecar-config: {{ include "mq-sidecar.toml" . | sha256sum }}
{{- if $v.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ int64 $v.sidecar.ports.admin | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* mq-sidecar.sparkExecutorPod: a Spark executor pod template (a Pod without a name) with the
sidecar; Spark keeps the template's init containers, volumes and the executor container's env. */}}
{{- define "mq-sidecar.sparkExecutorPod" -}}
{{- $v := .values | default .root.Values -}}
apiVersion: v1
kind: Pod
metadata:
  labels:
    {{- include "mq-sidecar.selectorLabels" . | nindent 4 }}
    app.kubernetes.io/component: spark-executor
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with $v.sparkExecutor.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- include "mq-sidecar.podAnnotations" . | nindent 4 }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "mq-sidecar.terminationGracePeriodSeconds" . }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with include "mq-sidecar.podSecurityContext" . }}
  securityContext:
    {{- . | nindent 4 }}
  {{- end }}
  {{- if $v.sidecar.native }}
  initContainers:
    {{- include "mq-sidecar.container" . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ $v.sparkExecutor.containerName }}
      env:
        {{- include "mq-sidecar.appEnv" . | nindent 8 }}
    {{- if not $v.sidecar.native }}
    {{- include "mq-sidecar.container" . | nindent 4 }}
    {{- end }}
  volumes:
    {{- include "mq-sidecar.volumes" . | nindent 4 }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
