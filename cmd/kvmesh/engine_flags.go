package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/engine/vllm"
	"github.com/kvmesh/kvmesh/kv"
)

// Flags of the real-engine adapters (--engine vllm; SGLang and
// TensorRT-LLM follow with the same names). The worker takes one engine,
// serve a list aligned by position.

// realEngineFlags are one engine's endpoints.
type realEngineFlags struct {
	url, events, replay string
	peers               []string // one per DP rank (worker) or one (serve)
}

// engineOpts are the options every adapter shares.
type engineOpts struct {
	topic, hintForm string
	timeout         time.Duration
}

func (o *engineOpts) register(f *pflag.FlagSet) {
	f.StringVar(&o.topic, "kv-events-topic", "", "vllm: ZMQ topic of the engine's KV events (vLLM's kv-events-config topic)")
	f.StringVar(&o.hintForm, "hint-form", string(vllm.HintNative), "vllm: how KV hints reach the engine: native (the request's kv_hints), bridge (kv_transfer_params.kv_hint) or off (take no hints)")
	f.DurationVar(&o.timeout, "engine-timeout", 10*time.Minute, "vllm: how long to wait for the engine's /health at start (model loading takes minutes)")
}

// check validates the shared options.
func (o *engineOpts) check() error {
	if _, err := vllm.ParseHintForm(o.hintForm); err != nil {
		return fmt.Errorf("--hint-form %w", err)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--engine-timeout %v: want > 0", o.timeout)
	}
	return nil
}

// registerWorkerEngineFlags defines the worker's --engine-url, --kv-events,
// --kv-events-replay and --peer-endpoint.
func registerWorkerEngineFlags(f *pflag.FlagSet, e *realEngineFlags, o *engineOpts) {
	f.StringVar(&e.url, "engine-url", "", "vllm: the engine's base URL, http://HOST:PORT")
	f.StringVar(&e.events, "kv-events", "", "vllm: the engine's KV-event publisher, tcp://HOST:PORT (DP rank r on port+r)")
	f.StringVar(&e.replay, "kv-events-replay", "", "vllm: the engine's KV-event replay endpoint, tcp://HOST:PORT (rank r on port+r); repairs gaps")
	f.StringSliceVar(&e.peers, "peer-endpoint", nil, "vllm: the engine's KV peer service, tcp://HOST:PORT per DP rank; makes this worker a KV hint source")
	o.register(f)
}

// check validates one engine's flags; prefix names the flag family
// ("" or "prefill-"/"decode-") and i the position in a list (-1: none).
func (e *realEngineFlags) check(prefix string, i, dpSize int) error {
	at := func(flag string) string {
		if i < 0 {
			return "--" + prefix + flag
		}
		return fmt.Sprintf("--%s%s (entry %d)", prefix, flag, i+1)
	}
	if e.url == "" {
		return fmt.Errorf("%s is required with --engine vllm", at("engine-url"))
	}
	if _, err := vllm.CheckURL(e.url); err != nil {
		return fmt.Errorf("%s: %w", at("engine-url"), err)
	}
	for _, ep := range []struct{ flag, v string }{{"kv-events", e.events}, {"kv-events-replay", e.replay}} {
		if ep.v == "" {
			continue
		}
		if _, err := kv.ParseEndpoint(ep.v); err != nil {
			return fmt.Errorf("%s: %w", at(ep.flag), err)
		}
	}
	if e.replay != "" && e.events == "" {
		return fmt.Errorf("%s needs %s", at("kv-events-replay"), at("kv-events"))
	}
	if len(e.peers) > 0 && len(e.peers) != dpSize {
		return fmt.Errorf("%s: %d endpoints for %d DP ranks (one per rank)", at("peer-endpoint"), len(e.peers), dpSize)
	}
	for r, p := range e.peers {
		ep, err := kv.ParseEndpoint(p)
		if err != nil {
			return fmt.Errorf("%s (rank %d): %w", at("peer-endpoint"), r, err)
		}
		e.peers[r] = ep.String()
	}
	return nil
}

// dialPeers checks every peer endpoint accepts connections: kvmesh
// advertises them to routers but does not serve them.
func (e *realEngineFlags) dialPeers(ctx context.Context, prefix string) error {
	for r, p := range e.peers {
		ep, _ := kv.ParseEndpoint(p)
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(ep.String(), "tcp://"))
		if err != nil {
			return fmt.Errorf("--%speer-endpoint %s (rank %d) is not dialable: %w", prefix, p, r, err)
		}
		c.Close()
	}
	return nil
}

// openVLLM attaches to one vLLM server.
func openVLLM(ctx context.Context, e *realEngineFlags, o *engineOpts, model string, role kv.Role, dpSize, blockSize int, log *slog.Logger) (*vllm.Engine, error) {
	form, err := vllm.ParseHintForm(o.hintForm)
	if err != nil {
		return nil, fmt.Errorf("--hint-form %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	return vllm.New(wctx, vllm.Config{URL: e.url, Model: model, Role: role, DPSize: dpSize, BlockSize: blockSize, HintForm: form,
		Events: e.events, ReplayEvents: e.replay, Topic: o.topic, Logger: log})
}

// acceptsHints is what a vLLM worker registers: hints are lowered unless
// --hint-form off.
func (o *engineOpts) acceptsHints() *bool {
	on := o.hintForm != string(vllm.HintOff)
	return &on
}

// serveEngineFlags are serve's real-engine lists, aligned by position.
type serveEngineFlags struct {
	engine                                             string
	urls, events, replays, peers                       []string
	prefillURLs, prefillEvents, prefillReplays, prPeer []string
	decodeURLs, decodeEvents, decodeReplays            []string
	opts                                               engineOpts
}

func (s *serveEngineFlags) register(f *pflag.FlagSet) {
	f.StringVar(&s.engine, "engine", "sim", "engine behind the workers: sim (started here) or vllm (running vLLM servers, one worker each)")
	f.StringSliceVar(&s.urls, "engine-url", nil, "vllm: aggregated engines' base URLs, http://HOST:PORT,…")
	f.StringSliceVar(&s.events, "kv-events", nil, "vllm: their KV-event publishers, tcp://HOST:PORT,… (aligned with --engine-url)")
	f.StringSliceVar(&s.replays, "kv-events-replay", nil, "vllm: their KV-event replay endpoints (aligned)")
	f.StringSliceVar(&s.peers, "peer-endpoint", nil, "vllm: their KV peer services (aligned); makes them KV hint sources")
	f.StringSliceVar(&s.prefillURLs, "prefill-engine-url", nil, "vllm P/D: prefill engines' base URLs")
	f.StringSliceVar(&s.prefillEvents, "prefill-kv-events", nil, "vllm P/D: prefill engines' KV-event publishers (aligned)")
	f.StringSliceVar(&s.prefillReplays, "prefill-kv-events-replay", nil, "vllm P/D: prefill engines' replay endpoints (aligned)")
	f.StringSliceVar(&s.prPeer, "prefill-peer-endpoint", nil, "vllm P/D: prefill engines' KV peer services (aligned)")
	f.StringSliceVar(&s.decodeURLs, "decode-engine-url", nil, "vllm P/D: decode engines' base URLs")
	f.StringSliceVar(&s.decodeEvents, "decode-kv-events", nil, "vllm P/D: decode engines' KV-event publishers (aligned)")
	f.StringSliceVar(&s.decodeReplays, "decode-kv-events-replay", nil, "vllm P/D: decode engines' replay endpoints (aligned)")
	s.opts.register(f)
}

// servedEngine is one engine serve attaches a worker to.
type servedEngine struct {
	flags  realEngineFlags
	role   kv.Role
	prefix string
}

// list zips the aligned lists of one role.
func zipEngines(prefix string, role kv.Role, urls, evs, reps, peers []string) ([]servedEngine, error) {
	for _, l := range []struct {
		flag string
		n    int
	}{{"kv-events", len(evs)}, {"kv-events-replay", len(reps)}, {"peer-endpoint", len(peers)}} {
		if l.n > 0 && l.n != len(urls) {
			return nil, fmt.Errorf("--%s%s: %d entries for %d engines (lists align by position)", prefix, l.flag, l.n, len(urls))
		}
	}
	out := make([]servedEngine, len(urls))
	for i, u := range urls {
		se := servedEngine{flags: realEngineFlags{url: u}, role: role, prefix: prefix}
		if len(evs) > 0 {
			se.flags.events = evs[i]
		}
		if len(reps) > 0 {
			se.flags.replay = reps[i]
		}
		if len(peers) > 0 {
			se.flags.peers = []string{peers[i]}
		}
		if err := se.flags.check(prefix, i, 1); err != nil {
			return nil, err
		}
		out[i] = se
	}
	return out, nil
}

// engines validates the lists and returns the engines to attach.
func (s *serveEngineFlags) engines() ([]servedEngine, error) {
	switch s.engine {
	case "sim":
		for _, l := range [][]string{s.urls, s.prefillURLs, s.decodeURLs} {
			if len(l) > 0 {
				return nil, errors.New("--engine-url, --prefill-engine-url and --decode-engine-url need --engine vllm")
			}
		}
		return nil, nil
	case "vllm":
	default:
		return nil, fmt.Errorf("--engine %q: want sim or vllm", s.engine)
	}
	if err := s.opts.check(); err != nil {
		return nil, err
	}
	agg, err := zipEngines("", kv.RoleAggregated, s.urls, s.events, s.replays, s.peers)
	if err != nil {
		return nil, err
	}
	pre, err := zipEngines("prefill-", kv.RolePrefill, s.prefillURLs, s.prefillEvents, s.prefillReplays, s.prPeer)
	if err != nil {
		return nil, err
	}
	dec, err := zipEngines("decode-", kv.RoleDecode, s.decodeURLs, s.decodeEvents, s.decodeReplays, nil)
	if err != nil {
		return nil, err
	}
	switch {
	case len(pre) > 0 != (len(dec) > 0):
		return nil, errors.New("--prefill-engine-url and --decode-engine-url come together (a P/D fleet needs both)")
	case len(agg)+len(pre) == 0:
		return nil, errors.New("--engine vllm needs --engine-url (aggregated) or --prefill-engine-url and --decode-engine-url (P/D)")
	}
	return append(append(agg, pre...), dec...), nil
}

// startVLLMWorkerEngine checks the worker's vLLM flags, checks its peer
// endpoints dial, and attaches to the engine (waiting for its /health).
func startVLLMWorkerEngine(cmd *cobra.Command, wf *workerFlags, model string, role kv.Role, log *slog.Logger) (*vllm.Engine, error) {
	switch {
	case wf.controlListen != "":
		return nil, errors.New("--control-listen serves the sim's blocks; a vLLM engine's peer service is its own: name it with --peer-endpoint")
	case len(wf.controlEndpoints) > 0:
		return nil, errors.New("--control-endpoints: with --engine vllm, use --peer-endpoint")
	}
	if err := wf.real.check("", -1, wf.dpSize); err != nil {
		return nil, err
	}
	if err := wf.realOpts.check(); err != nil {
		return nil, err
	}
	if err := wf.real.dialPeers(cmd.Context(), ""); err != nil {
		return nil, err
	}
	pinned := 0
	if cmd.Flags().Changed("block-size") {
		pinned = wf.sim.BlockSize
	}
	eng, err := openVLLM(cmd.Context(), &wf.real, &wf.realOpts, model, role, wf.dpSize, pinned, log)
	if err != nil {
		return nil, fmt.Errorf("--engine-url %s: %w", wf.real.url, err)
	}
	return eng, nil
}

// registerRelayMetrics exports the KV-event relay's counters on the
// worker's /metrics.
func registerRelayMetrics(reg prometheus.Registerer, r *remote.Relay) error {
	if r == nil {
		return nil
	}
	for _, c := range []struct {
		name, help string
		v          func(remote.RelayStats) uint64
	}{
		{"batches", "KV event batches relayed from the engine (live and replayed)", func(s remote.RelayStats) uint64 { return s.Batches }},
		{"replayed", "KV event batches fetched through the engine's replay socket", func(s remote.RelayStats) uint64 { return s.Replayed }},
		{"gaps", "sequence gaps seen in the engine's KV event stream", func(s remote.RelayStats) uint64 { return s.Gaps }},
		{"lost", "KV event batches neither live nor replay could supply", func(s remote.RelayStats) uint64 { return s.Lost }},
		{"cleared", "times the worker's holdings were cleared after lost batches", func(s remote.RelayStats) uint64 { return s.Cleared }},
		{"malformed", "KV event batches that failed to decode", func(s remote.RelayStats) uint64 { return s.Malformed }},
		{"block_size_mismatches", "stores whose block_size is not the worker's (dropped)", func(s remote.RelayStats) uint64 { return s.BlockSizeMismatches }},
	} {
		if err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvmesh_kv_event_relay_" + c.name + "_total", Help: c.help},
			func() float64 { return float64(c.v(r.Stats())) })); err != nil {
			return err
		}
	}
	return nil
}
