package sglang

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/kv"
)

// Engine drives one SGLang server.
type Engine struct {
	remote.Ranks  // per rank, from /metrics
	cfg           Config
	info          ServerInfo
	bootstrapPort int
}

var (
	_ engine.Engine = (*Engine)(nil)
	_ engine.Ranked = (*Engine)(nil)
	_ engine.Health = (*Engine)(nil)
)

// ServerInfo is what the adapter reads from /get_server_info (SGLang's
// server_args and scheduler info; absent fields stay zero).
type ServerInfo struct {
	ServedModelName string `json:"served_model_name"`
	ModelPath       string `json:"model_path"`
	ContextLength   int    `json:"context_length"`
	PageSize        int    `json:"page_size"`
	DisaggMode      string `json:"disaggregation_mode"`
	BootstrapPort   int    `json:"disaggregation_bootstrap_port"`
	DPSize          int    `json:"dp_size"`
	Incremental     bool   `json:"incremental_streaming_output"`
	StreamOutput    bool   `json:"stream_output"` // the older name of the same switch
	MaxTotalTokens  int    `json:"max_total_num_tokens"`
	MaxReqInputLen  int    `json:"max_req_input_len"`
	Version         string `json:"version"`
}

// New waits until the server is healthy (bounded by ctx), reads its model,
// page size, KV capacity, disaggregation mode and bootstrap port from
// /get_server_info, and starts reading its load. The KV-event relay starts
// when the worker installs its event sink.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	var err error
	if cfg.Config, err = cfg.WithDefaults("sglang"); err != nil {
		return nil, err
	}
	base := cfg.URL
	if cfg.HintForm, err = cfg.HintForm.WithDefault(); err != nil {
		return nil, fmt.Errorf("sglang hint form %w", err)
	}
	if cfg.BootstrapHost == "" {
		u, _ := url.Parse(base)
		cfg.BootstrapHost = u.Hostname()
	}
	e := &Engine{cfg: cfg}
	if err := e.Attach(ctx, cfg.Config); err != nil {
		return nil, err
	}
	if err := e.readServerInfo(ctx); err != nil {
		return nil, err
	}
	cfg = e.cfg
	blockSize := e.info.PageSize
	blocks := 0
	if e.info.MaxTotalTokens > 0 {
		blocks = e.info.MaxTotalTokens / blockSize
	}
	ecfg := engine.Config{Model: cfg.Model, Role: cfg.Role, BlockSize: blockSize, Blocks: blocks, MaxModelLen: e.info.ContextLength,
		// Hints and handoffs only make sense between engines serving the
		// same model with the same page layout.
		Digest: fmt.Sprintf("sglang/%s/ps%d", cfg.Model, blockSize)}
	if err := e.NewRelay(cfg.Config, blockSize); err != nil {
		return nil, err
	}
	e.Start(cfg.Config, ecfg)
	e.scrape(ctx)
	e.ReadLoad(e.scrape)
	e.Logger().Info("sglang engine attached", "model", cfg.Model, "version", e.info.Version, "context_length", e.info.ContextLength,
		"page_size", blockSize, "blocks", blocks, "dp_size", cfg.DPSize, "disaggregation_mode", e.info.DisaggMode,
		"bootstrap", e.bootstrapAddr(), "incremental_streaming", e.incremental(), "hint_form", cfg.HintForm, "kv_events", cfg.Events)
	return e, nil
}

// readServerInfo reads /get_server_info (and /v1/models for the name when
// the server does not report served_model_name) and checks the configured
// model, role, DP size and block size against it.
func (e *Engine) readServerInfo(ctx context.Context) error {
	if err := remote.GetJSON(ctx, e.Client(), e.cfg.URL+"/get_server_info", &e.info); err != nil {
		return fmt.Errorf("sglang engine server info: %w", err)
	}
	in := &e.info
	name := in.ServedModelName
	if name == "" {
		var list struct {
			Data []struct {
				ID          string `json:"id"`
				MaxModelLen int    `json:"max_model_len"`
			} `json:"data"`
		}
		if err := remote.GetJSON(ctx, e.Client(), e.cfg.URL+"/v1/models", &list); err == nil && len(list.Data) > 0 {
			name = list.Data[0].ID
			if in.ContextLength == 0 {
				in.ContextLength = list.Data[0].MaxModelLen
			}
		}
	}
	if name == "" {
		name = in.ModelPath
	}
	switch {
	case name == "":
		return fmt.Errorf("sglang engine %s reports no model (served_model_name)", e.cfg.URL)
	case e.cfg.Model == "":
		e.cfg.Model = name
	case e.cfg.Model != name:
		return fmt.Errorf("sglang engine %s does not serve model %q (it serves %q)", e.cfg.URL, e.cfg.Model, name)
	}
	if in.ContextLength == 0 {
		in.ContextLength = in.MaxReqInputLen
	}
	// The role must be the server's: a prefill server answers a request
	// only once a decode server has taken its KV.
	mode := in.DisaggMode
	if mode == "" || mode == "null" {
		mode = "null"
	}
	want := map[kv.Role]string{kv.RoleAggregated: "null", kv.RolePrefill: "prefill", kv.RoleDecode: "decode"}[e.cfg.Role]
	if in.DisaggMode != "" && want != "" && mode != want {
		return fmt.Errorf("sglang engine %s runs --disaggregation-mode %s, but kvmesh attaches it as a %s engine (want --disaggregation-mode %s)",
			e.cfg.URL, mode, e.cfg.Role, want)
	}
	switch {
	case in.DPSize > 1 && e.cfg.DPSize == 1:
		e.cfg.DPSize = in.DPSize
	case in.DPSize > 0 && e.cfg.DPSize != in.DPSize:
		return fmt.Errorf("--dp %d but the SGLang engine at %s runs --dp-size %d", e.cfg.DPSize, e.cfg.URL, in.DPSize)
	}
	e.bootstrapPort = in.BootstrapPort
	if e.bootstrapPort == 0 {
		e.bootstrapPort = DefaultBootstrapPort
	}
	ps, err := e.SettleBlockSize(in.PageSize, e.cfg.BlockSize, remote.BlockSizeRule{Default: DefaultPageSize,
		Engine: "SGLang engine", Uses: "runs --page-size %d", Key: "page_size",
		Unknown: "sglang engine reports no page_size; assuming SGLang's default"})
	if err != nil {
		return err
	}
	in.PageSize = ps
	return nil
}

// incremental: the server streams only each step's new output_ids.
func (e *Engine) incremental() bool { return e.info.Incremental || e.info.StreamOutput }

func (e *Engine) bootstrapAddr() string {
	if e.cfg.Role != kv.RolePrefill {
		return ""
	}
	return net.JoinHostPort(e.cfg.BootstrapHost, strconv.Itoa(e.bootstrapPort))
}

// scrape reads the per-rank load from /metrics. SGLang labels its series
// with the rank that reports them (dp_rank, tp_rank); only attention-TP
// rank 0 of each DP rank speaks for it.
func (e *Engine) scrape(ctx context.Context) {
	fams, err := remote.Scrape(ctx, e.Client(), e.cfg.URL+"/metrics")
	if err != nil {
		if ctx.Err() == nil {
			e.Logger().Debug("sglang metrics", "err", err)
		}
		return
	}
	series := remote.LoadSeries{Running: "sglang:num_running_reqs", Waiting: "sglang:num_queue_reqs", Usage: "sglang:token_usage"}
	dpRank := remote.ModelRank(e.cfg.Model, "dp_rank")
	e.StoreLoad(remote.ReadRankLoad(fams, e.cfg.DPSize, e.Config().Blocks, series, func(s remote.Sample) (int, bool) {
		if tp := s.Labels["tp_rank"]; tp != "" && tp != "0" {
			return 0, false
		}
		return dpRank(s)
	}))
}

// Info is what the server reported at attach.
func (e *Engine) Info() ServerInfo { return e.info }

// MaxModelLen is the server's context length.
func (e *Engine) MaxModelLen() int { return e.info.ContextLength }
