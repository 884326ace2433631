{{/*
Real engines beside a kvmesh worker: one pod runs the engine (vllm, sglang
or trtllm) and `kvmesh worker` as its sidecar, which reaches the engine on
localhost. Every helper takes (dict "root" $ "w" $w), $w a worker group
already overlaid on workerDefaults.
*/}}

{{/* Paths both containers agree on. */}}
{{- define "kvmesh.engine.connectorDir" -}}/var/run/kvmesh/connector{{- end }}
{{- define "kvmesh.engine.kvbmDiskDir" -}}/var/lib/kvmesh/kvbm{{- end }}
{{- define "kvmesh.engine.optionsDir" -}}/etc/kvmesh/engine{{- end }}

{{/* kvmesh.engine.check fails the render on a group the worker would refuse. */}}
{{- define "kvmesh.engine.check" -}}
{{- $w := .w }}
{{- $e := $w.engineServer }}
{{- if not (has $w.engine (list "sim" "vllm" "sglang" "trtllm")) }}
{{- fail (printf "workers[%s].engine %q: want sim, vllm, sglang or trtllm" $w.name $w.engine) }}
{{- end }}
{{- if and $w.kvbm.enabled (eq $w.role "decode") }}
{{- fail (printf "workers[%s].kvbm.enabled: a decode worker runs no connector (its prompt KV comes from its prefill peer); enable kvbm on the prefill group" $w.name) }}
{{- end }}
{{- if and $w.kvbm.enabled (not (or $w.kvbm.hostBlocks $w.kvbm.diskBlocks)) }}
{{- fail (printf "workers[%s].kvbm: give hostBlocks or diskBlocks" $w.name) }}
{{- end }}
{{- if ne $w.engine "sim" }}
{{- if not $e.image }}
{{- fail (printf "workers[%s].engineServer.image: give the %s image, pinned (a tag other than latest, or a digest)" $w.name $w.engine) }}
{{- end }}
{{- if and $w.kvbm.enabled (ne $w.engine "trtllm") }}
{{- fail (printf "workers[%s].kvbm.enabled with engine %s: kvmesh has no engine-side configuration of the KVBM connector for %s (only trtllm); configure the engine's own connector in engineServer.args instead" $w.name $w.engine $w.engine) }}
{{- end }}
{{- if and (eq $w.engine "trtllm") (gt (int $w.dpSize) 1) }}
{{- fail (printf "workers[%s].dpSize %d: a TensorRT-LLM server is one rank to kvmesh" $w.name (int $w.dpSize)) }}
{{- end }}
{{- if and (eq $w.engine "trtllm") $e.modelPath (ne $e.modelPath $w.model) }}
{{- fail (printf "workers[%s]: trtllm-serve serves the model under the path it loads: leave engineServer.modelPath empty and set model to %q" $w.name $e.modelPath) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The URL the worker reaches its engine at. An SGLang prefill server's
host is also the bootstrap host its decode peers dial (kvmesh takes it from
this URL), so it is the pod IP there; everywhere else the loopback. */}}
{{- define "kvmesh.engine.url" -}}
{{- if and (eq .w.engine "sglang") (eq .w.role "prefill") -}}
http://$(POD_IP):{{ .w.engineServer.port }}
{{- else -}}
http://127.0.0.1:{{ .w.engineServer.port }}
{{- end }}
{{- end }}

{{/* The ZMQ KV-event config vLLM and SGLang take as --kv-events-config
JSON: "*" makes the publisher bind (a host would make it connect). */}}
{{- define "kvmesh.engine.kvEventsConfig" -}}
{{- $e := .w.engineServer }}
{{- $c := dict "publisher" "zmq" "endpoint" (printf "tcp://*:%d" (int $e.kvEventsPort)) }}
{{- if eq .w.engine "vllm" }}{{ $_ := set $c "enable_kv_cache_events" true }}{{ end }}
{{- if $e.kvEventsReplayPort }}{{ $_ := set $c "replay_endpoint" (printf "tcp://*:%d" (int $e.kvEventsReplayPort)) }}{{ end }}
{{- toJson $c }}
{{- end }}

{{/* The worker's args that attach it to its engine. */}}
{{- define "kvmesh.engine.workerArgs" -}}
{{- $w := .w }}
{{- $e := $w.engineServer }}
- --engine-url={{ include "kvmesh.engine.url" . }}
{{- if eq $w.engine "trtllm" }}
- --kv-events=http://127.0.0.1:{{ $e.port }}
{{- else }}
- --kv-events=tcp://127.0.0.1:{{ $e.kvEventsPort }}
{{- if $e.kvEventsReplayPort }}
- --kv-events-replay=tcp://127.0.0.1:{{ $e.kvEventsReplayPort }}
{{- end }}
{{- end }}
- --engine-timeout={{ $e.healthTimeout }}
{{- if $w.kvbm.enabled }}
- --connector-config-out={{ include "kvmesh.engine.connectorDir" . }}/llm-api-options.yaml
{{- end }}
{{- end }}

{{/* The engine's command line. */}}
{{- define "kvmesh.engine.args" -}}
{{- $w := .w }}
{{- $e := $w.engineServer }}
{{- $modelPath := default $w.model $e.modelPath }}
{{- $host := "127.0.0.1" }}
{{- if and (eq $w.engine "sglang") (eq $w.role "prefill") }}{{ $host = "0.0.0.0" }}{{ end }}
{{- if eq $w.engine "vllm" }}
- {{ $modelPath }}
- --served-model-name={{ $w.model }}
- --host={{ $host }}
- --port={{ $e.port }}
- --enable-prefix-caching
- --enable-prompt-tokens-details
- {{ printf "--kv-events-config=%s" (include "kvmesh.engine.kvEventsConfig" .) | squote }}
{{- if gt (int $w.dpSize) 1 }}
- --data-parallel-size={{ $w.dpSize }}
{{- end }}
{{- if ne $w.role "aggregated" }}
- '--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_both"}'
{{- end }}
{{- else if eq $w.engine "sglang" }}
- --model-path={{ $modelPath }}
- --served-model-name={{ $w.model }}
- --host={{ $host }}
- --port={{ $e.port }}
- --enable-metrics
- {{ printf "--kv-events-config=%s" (include "kvmesh.engine.kvEventsConfig" .) | squote }}
{{- if gt (int $w.dpSize) 1 }}
- --dp-size={{ $w.dpSize }}
{{- end }}
{{- if ne $w.role "aggregated" }}
- --disaggregation-mode={{ $w.role }}
- --disaggregation-transfer-backend={{ $e.transferBackend }}
{{- end }}
{{- if eq $w.role "prefill" }}
- --disaggregation-bootstrap-port={{ $e.bootstrapPort }}
{{- end }}
{{- else if eq $w.engine "trtllm" }}
- {{ $modelPath }}
- --host={{ $host }}
- --port={{ $e.port }}
- --backend=pytorch
{{- if $w.kvbm.enabled }}
- --extra_llm_api_options={{ include "kvmesh.engine.connectorDir" . }}/llm-api-options.yaml
{{- else }}
- --extra_llm_api_options={{ include "kvmesh.engine.optionsDir" . }}/llm-api-options.yaml
{{- end }}
{{- end }}
{{- with $e.args }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* TensorRT-LLM's LLM API options: KV events for the worker's polling,
iteration stats, and for P/D the cache transceiver. With kvbm the worker
writes them instead (--connector-config-out), with the connector. */}}
{{- define "kvmesh.engine.trtllmOptions" -}}
kv_cache_config:
  enable_block_reuse: true
  event_buffer_max_size: 1024
enable_iter_perf_stats: true
{{- if ne .w.role "aggregated" }}
cache_transceiver_config:
  backend: {{ .w.engineServer.cacheTransceiverBackend }}
{{- end }}
{{- end }}

{{/* A probe against the engine's /health on localhost, where the kubelet
cannot reach: python3 is in every engine image. */}}
{{- define "kvmesh.engine.probe" -}}
{{- $p := deepCopy (default (dict) .probe) }}
{{- $_ := set $p "exec" (dict "command" (list "python3" "-c" (printf "import urllib.request; urllib.request.urlopen('http://127.0.0.1:%d/health', timeout=5)" (int .w.engineServer.port)))) }}
{{- if not (hasKey $p "timeoutSeconds") }}{{ $_ := set $p "timeoutSeconds" 10 }}{{ end }}
{{- toYaml $p }}
{{- end }}

{{/* The engine container. */}}
{{- define "kvmesh.engine.container" -}}
{{- $w := .w }}
{{- $e := $w.engineServer }}
{{- $res := deepCopy (default (dict) $e.resources) }}
{{- $req := deepCopy (default (dict) $res.requests) }}
{{- $lim := deepCopy (default (dict) $res.limits) }}
{{- if $e.gpus }}
{{- $_ := set $req "nvidia.com/gpu" (int $e.gpus) }}
{{- $_ := set $lim "nvidia.com/gpu" (int $e.gpus) }}
{{- end }}
{{- $_ := set $res "requests" $req }}
{{- $_ := set $res "limits" $lim }}
- name: engine
  image: {{ $e.image }}
  imagePullPolicy: {{ $e.pullPolicy }}
  {{- if eq $w.engine "vllm" }}
  command: ["vllm", "serve"]
  {{- else if eq $w.engine "sglang" }}
  command: ["python3", "-m", "sglang.launch_server"]
  {{- else if $w.kvbm.enabled }}
  # The worker writes the options with the connector before it waits for
  # the engine: start once they are there.
  command:
  - /bin/sh
  - -c
  - 'while [ ! -s "$0" ]; do sleep 1; done; exec trtllm-serve "$@"'
  - {{ include "kvmesh.engine.connectorDir" . }}/llm-api-options.yaml
  {{- else }}
  command: ["trtllm-serve"]
  {{- end }}
  args:
    {{- include "kvmesh.engine.args" . | trim | nindent 4 }}
  env:
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  # Writable places on a read-only root: caches, compiled kernels, weights.
  - name: HOME
    value: /cache
  - name: HF_HOME
    value: /cache/huggingface
  - name: TMPDIR
    value: /tmp
  {{- if eq $w.engine "vllm" }}
  - name: VLLM_NO_USAGE_STATS
    value: "1"
  {{- if ne $w.role "aggregated" }}
  # NixlConnector's side channel: decode engines dial the prefill's pod IP.
  - name: VLLM_NIXL_SIDE_CHANNEL_HOST
    value: $(POD_IP)
  - name: VLLM_NIXL_SIDE_CHANNEL_PORT
    value: {{ $e.nixlSideChannelPort | quote }}
  {{- end }}
  {{- end }}
  {{- if and (eq $w.engine "trtllm") $w.kvbm.enabled }}
  # kvmesh's connector (kvmesh_kvbm, in the engine image) calls the worker's sidecar here.
  - name: KVMESH_KVBM_SOCKET
    value: {{ include "kvmesh.engine.connectorDir" . }}/kvbm.sock
  {{- end }}
  {{- with $e.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- $ports := list }}
  {{- if and (eq $w.engine "vllm") (ne $w.role "aggregated") }}
  {{- range $r := until (int $w.dpSize) }}
  {{- $ports = append $ports (dict "name" (printf "nixl-%d" $r) "containerPort" (add $e.nixlSideChannelPort $r) "protocol" "TCP") }}
  {{- end }}
  {{- end }}
  {{- if and (eq $w.engine "sglang") (eq $w.role "prefill") }}
  {{- $ports = append $ports (dict "name" "bootstrap" "containerPort" (int $e.bootstrapPort) "protocol" "TCP") }}
  {{- end }}
  {{- with $ports }}
  ports:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  startupProbe:
    {{- include "kvmesh.engine.probe" (dict "w" $w "probe" $e.startupProbe) | nindent 4 }}
  readinessProbe:
    {{- include "kvmesh.engine.probe" (dict "w" $w "probe" $e.readinessProbe) | nindent 4 }}
  livenessProbe:
    {{- include "kvmesh.engine.probe" (dict "w" $w "probe" $e.livenessProbe) | nindent 4 }}
  resources:
    {{- toYaml $res | nindent 4 }}
  securityContext:
    {{- toYaml (mergeOverwrite (deepCopy .root.Values.containerSecurityContext) (default (dict) $e.securityContext)) | nindent 4 }}
  volumeMounts:
  - name: shm
    mountPath: /dev/shm
  - name: engine-cache
    mountPath: /cache
  - name: engine-tmp
    mountPath: /tmp
  {{- if eq $w.engine "trtllm" }}
  {{- if $w.kvbm.enabled }}
  - name: connector
    mountPath: {{ include "kvmesh.engine.connectorDir" . }}
    readOnly: true
  {{- else }}
  - name: engine-options
    mountPath: {{ include "kvmesh.engine.optionsDir" . }}
    readOnly: true
  {{- end }}
  {{- end }}
  {{- if and $w.kvbm.enabled $w.kvbm.diskBlocks }}
  - name: kvbm-disk
    mountPath: {{ include "kvmesh.engine.kvbmDiskDir" . }}
  {{- end }}
  {{- with $e.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Volumes of a real-engine pod (the kvbm ones are kvmesh.kvbm.volumes'). */}}
{{- define "kvmesh.engine.volumes" -}}
{{- $w := .w }}
{{- $e := $w.engineServer }}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ $e.shmSize }}
- name: engine-cache
  emptyDir:
    sizeLimit: {{ $e.cacheSizeLimit }}
- name: engine-tmp
  emptyDir: {}
{{- if and (eq $w.engine "trtllm") (not $w.kvbm.enabled) }}
- name: engine-options
  configMap:
    name: {{ include "kvmesh.fullname" .root }}-worker-{{ $w.name }}-engine
{{- end }}
{{- with $e.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* KVBM's volumes: the disk tier, and for a real engine the directory the
worker writes the connector's options to. */}}
{{- define "kvmesh.kvbm.volumes" -}}
{{- $w := .w }}
{{- if $w.kvbm.enabled }}
{{- if $w.kvbm.diskBlocks }}
- name: kvbm-disk
  emptyDir:
    sizeLimit: {{ $w.kvbm.diskSizeLimit }}
{{- end }}
{{- if ne $w.engine "sim" }}
- name: connector
  emptyDir:
    sizeLimit: 1Mi
{{- end }}
{{- end }}
{{- end }}

{{- define "kvmesh.kvbm.workerArgs" -}}
{{- $w := .w }}
{{- if $w.kvbm.enabled }}
- --connector=kvbm
{{- if $w.kvbm.hostBlocks }}
- --kvbm-host-blocks={{ int $w.kvbm.hostBlocks }}
{{- end }}
{{- if $w.kvbm.diskBlocks }}
- --kvbm-disk-blocks={{ int $w.kvbm.diskBlocks }}
- --kvbm-disk-dir={{ include "kvmesh.engine.kvbmDiskDir" . }}
{{- end }}
{{- if ne $w.engine "sim" }}
- --kvbm-socket={{ include "kvmesh.engine.connectorDir" . }}/kvbm.sock
{{- end }}
{{- end }}
{{- end }}

{{- define "kvmesh.kvbm.workerMounts" -}}
{{- $w := .w }}
{{- if $w.kvbm.enabled }}
{{- if $w.kvbm.diskBlocks }}
- name: kvbm-disk
  mountPath: {{ include "kvmesh.engine.kvbmDiskDir" . }}
{{- end }}
{{- if ne $w.engine "sim" }}
- name: connector
  mountPath: {{ include "kvmesh.engine.connectorDir" . }}
# The sidecar's arena (/dev/shm) is the engine container's shared memory.
- name: shm
  mountPath: /dev/shm
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when a worker group is an SGLang decode server: those serve only
requests paired with a prefill, so the frontend must never plan a local
prefill on them. */}}
{{- define "kvmesh.sglangDecode" -}}
{{- $found := false }}
{{- range .Values.workers }}
{{- $w := deepCopy $.Values.workerDefaults }}
{{- include "kvmesh.overlay" (dict "dst" $w "src" .) }}
{{- if and (eq $w.engine "sglang") (eq $w.role "decode") }}{{ $found = true }}{{ end }}
{{- end }}
{{- if $found }}true{{ end }}
{{- end }}
