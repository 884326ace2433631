package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/engine/trtllm"
	"github.com/kvmesh/kvmesh/kv"
)

func init() {
	engineAdapters["trtllm"] = engineAdapter{open: openTRTLLM,
		// TensorRT-LLM's events are polled over HTTP: --kv-events names the
		// server whose POST /kv_cache_events answers them.
		checkEvents: func(s string) error {
			if _, err := remote.CheckURL(s); err != nil {
				return fmt.Errorf("%w (TensorRT-LLM's KV events are polled: give the server's base URL, normally --engine-url's)", err)
			}
			return nil
		},
		eventsAtEngineURL: true,
		hintForms:         []string{hintOff},
		connectorConfig:   trtllmConnectorYAML,
	}
}

// openTRTLLM attaches to one trtllm-serve.
func openTRTLLM(ctx context.Context, a engineAttach) (attachedEngine, error) {
	if a.dpSize > 1 {
		return nil, fmt.Errorf("--dp-size %d: a TensorRT-LLM server is one rank to kvmesh (its attention-DP ranks are not routed to)", a.dpSize)
	}
	if err := trtllm.CheckHintForm(a.opts.hintForm); err != nil {
		return nil, err
	}
	// Its events are polled: no ZMQ replay endpoint or topic.
	rc := a.remote()
	rc.ReplayEvents, rc.Topic = "", ""
	e, err := trtllm.New(ctx, trtllm.Config{Config: rc})
	if err != nil {
		return nil, err
	}
	return e, nil // its events come by polling: no ZMQ relay
}

// The KV block manager connector as TensorRT-LLM loads it
// (KvCacheConnectorConfig): kvmesh's own Python package (python/), a thin
// client of this worker's sidecar.
const (
	trtllmConnectorModule    = "kvmesh_kvbm.trtllm"
	trtllmConnectorScheduler = "KvmeshConnectorScheduler"
	trtllmConnectorWorker    = "KvmeshConnectorWorker"
)

// trtllmConnectorYAML is the LLM API options YAML a TensorRT-LLM server
// needs to run the KV block manager behind this worker: the connector,
// the KV events and iteration stats kvmesh reads, and for a context
// (prefill) server its cache transceiver. The tiers live in this worker's
// sidecar; TensorRT-LLM's connector config takes no extra keys, so the
// socket goes in the server's environment.
func trtllmConnectorYAML(k *kvbmFlags, role kv.Role) string {
	var b strings.Builder
	b.WriteString("# trtllm-serve --extra_llm_api_options (or --config) for a kvmesh worker with --connector kvbm.\n")
	b.WriteString("# Merge with your own options. Install kvmesh's connector into the server's Python\n")
	b.WriteString("# (pip install ./python, or PYTHONPATH=<kvmesh>/python) and run it with the sidecar's socket:\n")
	fmt.Fprintf(&b, "#   KVMESH_KVBM_SOCKET=%s\n", k.socketPath())
	fmt.Fprintf(&b, "# Tiers (in the kvmesh worker): %d host blocks, %d disk blocks, %d object blocks.\n", k.host, k.disk, k.object)
	fmt.Fprintf(&b, "kv_connector_config:\n  connector_module: %s\n  connector_scheduler_class: %s\n  connector_worker_class: %s\n",
		trtllmConnectorModule, trtllmConnectorScheduler, trtllmConnectorWorker)
	b.WriteString("kv_cache_config:\n  enable_block_reuse: true\n  enable_partial_reuse: false\n  event_buffer_max_size: 1024\n")
	b.WriteString("enable_iter_perf_stats: true\n")
	if role == kv.RolePrefill {
		b.WriteString("cache_transceiver_config:\n  backend: DEFAULT\n")
	}
	return b.String()
}

// emitConnectorConfig logs (and with --connector-config-out writes) the
// configuration a real engine needs to load the worker's --connector.
func emitConnectorConfig(cmd *cobra.Command, wf *workerFlags, role kv.Role, log *slog.Logger) error {
	if wf.kvbm.connector == "" {
		if wf.connectorOut != "" {
			return errors.New("--connector-config-out needs --connector")
		}
		return nil
	}
	a, err := lookupEngine(wf.engine)
	if err != nil {
		return err
	}
	if a.connectorConfig == nil {
		return fmt.Errorf("--connector %s with --engine %s: kvmesh has no engine-side configuration for it; configure the engine's own connector and run the worker without --connector", wf.kvbm.connector, wf.engine)
	}
	yaml := a.connectorConfig(&wf.kvbm, role)
	log.Info("the engine must load the KV connector with this configuration", "connector", wf.kvbm.connector, "config", yaml)
	switch wf.connectorOut {
	case "":
	case "-":
		fmt.Fprint(cmd.OutOrStdout(), yaml)
	default:
		// Atomically: the engine's launcher may be waiting for the file.
		if err := writeFileAtomic(wf.connectorOut, []byte(yaml), 0o644); err != nil {
			return fmt.Errorf("--connector-config-out: %w", err)
		}
	}
	return nil
}
