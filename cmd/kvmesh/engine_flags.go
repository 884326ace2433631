package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/remote"
	"github.com/kvmesh/kvmesh/engine/vllm"
	"github.com/kvmesh/kvmesh/kv"
)

// Flags of the real-engine adapters (--engine vllm and the kinds beside it
// in engineAdapters): every kind takes the same names. The worker takes one
// engine, serve a list aligned by position.

// engineAdapter opens one kind of real engine. Each kind registers itself
// in engineAdapters from its own file (engine_vllm.go).
type engineAdapter struct {
	// open attaches to one engine server; ctx bounds the wait for it to
	// become healthy.
	open func(ctx context.Context, a engineAttach) (attachedEngine, error)
	// checkEvents validates a --kv-events value; nil: a ZMQ publisher,
	// tcp://HOST:PORT, with --kv-events-replay beside it.
	checkEvents func(string) error
	// eventsAtEngineURL: the engine serves its KV events on its own HTTP
	// server (TensorRT-LLM's POST /kv_cache_events), so an unset
	// --kv-events polls --engine-url and --kv-events off polls nothing.
	eventsAtEngineURL bool
	// hintForms are the --hint-form values the engine takes, the first
	// its default; nil: native (default), bridge and off.
	hintForms []string
	// connectorConfig renders the engine-side configuration of the
	// worker's --connector (the engine loads the connector, not kvmesh);
	// nil: the engine kind takes none from kvmesh.
	connectorConfig func(k *kvbmFlags, role kv.Role) string
	// decodeCannotPrefill: the kind's decode servers serve only requests
	// paired with a prefill (SGLang's): their workers register decode_only,
	// so no router plans a local prefill or a whole request on them.
	decodeCannotPrefill bool
}

// engineAttach is what an adapter is opened with.
type engineAttach struct {
	flags *realEngineFlags
	opts  *engineOpts
	// model is the name to serve; "" takes the engine's.
	model string
	role  kv.Role
	// dpSize is the engine's data-parallel ranks; blockSize, when non-zero,
	// pins the block size (the engine's own must agree).
	dpSize, blockSize int
	log               *slog.Logger
}

// remote is the configuration every adapter shares, from the flags.
func (a engineAttach) remote() remote.Config {
	return remote.Config{URL: a.flags.url, Model: a.model, Role: a.role, DPSize: a.dpSize, BlockSize: a.blockSize,
		Events: a.flags.events, ReplayEvents: a.flags.replay, Topic: a.opts.topic,
		HealthInterval: a.opts.healthInterval, Logger: a.log}
}

// attachedEngine is what serve and worker need of an adapter.
type attachedEngine interface {
	engine.Engine
	// Relay is the engine's KV-event relay; nil when it relays none.
	Relay() *remote.Relay
}

// engineAdapters are the real-engine kinds --engine accepts besides sim.
var engineAdapters = map[string]engineAdapter{}

// engineKinds lists --engine's values for help and errors.
func engineKinds() string {
	kinds := []string{"sim"}
	for k := range engineAdapters {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds[1:])
	return strings.Join(kinds, ", ")
}

// lookupEngine returns the adapter for --engine, or an error naming the
// kinds there are.
func lookupEngine(kind string) (engineAdapter, error) {
	a, ok := engineAdapters[kind]
	if !ok {
		return engineAdapter{}, fmt.Errorf("--engine %q: want one of %s", kind, engineKinds())
	}
	return a, nil
}

// hintForms are --hint-form's values; each adapter says what they mean
// for its engine.
const (
	hintNative = "native"
	hintBridge = "bridge"
	hintOff    = "off"
)

// eventsOff is the --kv-events value that turns off events an engine would
// otherwise serve by default (TensorRT-LLM's, at --engine-url).
const eventsOff = "off"

// realEngineFlags are one engine's endpoints.
type realEngineFlags struct {
	url, events, replay string
	peers               []string // one per DP rank (worker) or one (serve)
}

// engineOpts are the options every adapter shares.
type engineOpts struct {
	topic, hintForm string
	// kvTransfer is vLLM's --kv-transfer ("" until given).
	kvTransfer     string
	timeout        time.Duration
	healthInterval time.Duration
}

func (o *engineOpts) register(f *pflag.FlagSet) {
	f.StringVar(&o.topic, "kv-events-topic", "", "real engine: ZMQ topic of the engine's KV events (its kv-events-config topic)")
	f.StringVar(&o.hintForm, "hint-form", "", "real engine: how KV hints reach the engine: native (its own hint field: kv_hints), bridge (the older form: vLLM's kv_transfer_params.kv_hint, SGLang's kv_router_hint) or off (take no hints); default: native, or off for an engine without a hint field (trtllm)")
	f.StringVar(&o.kvTransfer, "kv-transfer", "", "real engine P/D (vllm): how the prefill engine's KV connector hands the prompt's KV to the decode engine: params (it answers with kv_transfer_params, which the decode leg carries: NixlConnector) or shared-storage (it saves the KV where the decode engine reads it, found by the prompt, and answers none: vLLM's ExampleConnector with one shared_storage_path on both engines); default params")
	f.DurationVar(&o.timeout, "engine-timeout", 10*time.Minute, "real engine: how long to wait for the engine's /health at start (model loading takes minutes)")
	f.DurationVar(&o.healthInterval, "engine-health-interval", remote.DefaultHealthInterval, "real engine: how often the engine's /health is polled once attached; two failed checks in a row take its worker out of discovery (streams migrate) until one passes")
}

// check validates the shared options for an engine kind; an unset
// --hint-form becomes the kind's default.
func (o *engineOpts) check(kind string) error {
	forms := []string{hintNative, hintBridge, hintOff}
	if a, ok := engineAdapters[kind]; ok && a.hintForms != nil {
		forms = a.hintForms
	}
	if o.hintForm == "" {
		o.hintForm = forms[0]
	}
	if !slices.Contains(forms, o.hintForm) {
		if len(forms) == 1 {
			return fmt.Errorf("--hint-form %q: --engine %s takes only %s", o.hintForm, kind, forms[0])
		}
		return fmt.Errorf("--hint-form %q: want %s", o.hintForm, strings.Join(forms, ", "))
	}
	if _, err := vllm.Transfer(o.kvTransfer).WithDefault(); err != nil {
		return fmt.Errorf("--kv-transfer %w", err)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--engine-timeout %v: want > 0", o.timeout)
	}
	if o.healthInterval <= 0 {
		return fmt.Errorf("--engine-health-interval %v: want > 0", o.healthInterval)
	}
	return nil
}

// registerWorkerEngineFlags defines the worker's --engine-url, --kv-events,
// --kv-events-replay and --peer-endpoint.
func registerWorkerEngineFlags(f *pflag.FlagSet, e *realEngineFlags, o *engineOpts) {
	f.StringVar(&e.url, "engine-url", "", "real engine: the engine's base URL, http://HOST:PORT")
	f.StringVar(&e.events, "kv-events", "", "real engine: where the engine's KV events come from: its ZMQ publisher, tcp://HOST:PORT (DP rank r on port+r), or for trtllm the base URL whose POST /kv_cache_events is polled, http://HOST:PORT (default: --engine-url; off: none). Without events the router predicts the engine's cache from what it sent it (kv-approx)")
	f.StringVar(&e.replay, "kv-events-replay", "", "real engine: the engine's KV-event replay endpoint, tcp://HOST:PORT (rank r on port+r); repairs gaps")
	f.StringSliceVar(&e.peers, "peer-endpoint", nil, "real engine: the engine's KV peer service, tcp://HOST:PORT per DP rank; makes this worker a KV hint source")
	o.register(f)
}

// check validates one engine's flags; prefix names the flag family
// ("" or "prefill-"/"decode-") and i the position in a list (-1: none).
func (e *realEngineFlags) check(kind, prefix string, i, dpSize int) error {
	at := func(flag string) string {
		if i < 0 {
			return "--" + prefix + flag
		}
		return fmt.Sprintf("--%s%s (entry %d)", prefix, flag, i+1)
	}
	if e.url == "" {
		return fmt.Errorf("%s is required with --engine %s", at("engine-url"), kind)
	}
	if _, err := remote.CheckURL(e.url); err != nil {
		return fmt.Errorf("%s: %w", at("engine-url"), err)
	}
	if a, ok := engineAdapters[kind]; ok && a.eventsAtEngineURL {
		switch e.events {
		case "":
			e.events = e.url
		case eventsOff:
			e.events = ""
		}
	}
	if a, ok := engineAdapters[kind]; ok && a.checkEvents != nil {
		if e.events != "" {
			if err := a.checkEvents(e.events); err != nil {
				return fmt.Errorf("%s: %w", at("kv-events"), err)
			}
		}
		if e.replay != "" {
			return fmt.Errorf("%s: --engine %s has no replay endpoint", at("kv-events-replay"), kind)
		}
	}
	for _, ep := range []struct{ flag, v string }{{"kv-events", e.events}, {"kv-events-replay", e.replay}} {
		if a, ok := engineAdapters[kind]; ep.v == "" || ok && a.checkEvents != nil {
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

// acceptsHints is what a real-engine worker registers: hints are lowered
// unless --hint-form off.
func (o *engineOpts) acceptsHints() *bool {
	on := o.hintForm != hintOff
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
	f.StringVar(&s.engine, "engine", "sim", "engine behind the workers: sim (started here) or a real engine's kind, "+engineKinds()[len("sim, "):]+" (running servers, one worker each)")
	f.StringSliceVar(&s.urls, "engine-url", nil, "real engine: aggregated engines' base URLs, http://HOST:PORT,…")
	f.StringSliceVar(&s.events, "kv-events", nil, "real engine: their KV-event publishers, tcp://HOST:PORT,… (aligned with --engine-url); trtllm: the URLs polled, default each --engine-url (off: none). Engines without events are routed kv-approx")
	f.StringSliceVar(&s.replays, "kv-events-replay", nil, "real engine: their KV-event replay endpoints (aligned)")
	f.StringSliceVar(&s.peers, "peer-endpoint", nil, "real engine: their KV peer services (aligned); makes them KV hint sources")
	f.StringSliceVar(&s.prefillURLs, "prefill-engine-url", nil, "real engine P/D: prefill engines' base URLs")
	f.StringSliceVar(&s.prefillEvents, "prefill-kv-events", nil, "real engine P/D: prefill engines' KV-event publishers (aligned)")
	f.StringSliceVar(&s.prefillReplays, "prefill-kv-events-replay", nil, "real engine P/D: prefill engines' replay endpoints (aligned)")
	f.StringSliceVar(&s.prPeer, "prefill-peer-endpoint", nil, "real engine P/D: prefill engines' KV peer services (aligned)")
	f.StringSliceVar(&s.decodeURLs, "decode-engine-url", nil, "real engine P/D: decode engines' base URLs")
	f.StringSliceVar(&s.decodeEvents, "decode-kv-events", nil, "real engine P/D: decode engines' KV-event publishers (aligned)")
	f.StringSliceVar(&s.decodeReplays, "decode-kv-events-replay", nil, "real engine P/D: decode engines' replay endpoints (aligned)")
	s.opts.register(f)
}

// servedEngine is one engine serve attaches a worker to.
type servedEngine struct {
	flags  realEngineFlags
	role   kv.Role
	prefix string
}

// list zips the aligned lists of one role.
func zipEngines(kind, prefix string, role kv.Role, urls, evs, reps, peers []string) ([]servedEngine, error) {
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
		if err := se.flags.check(kind, prefix, i, 1); err != nil {
			return nil, err
		}
		out[i] = se
	}
	return out, nil
}

// engines validates the lists and returns the engines to attach.
func (s *serveEngineFlags) engines() ([]servedEngine, error) {
	if s.engine == "sim" {
		for _, l := range [][]string{s.urls, s.prefillURLs, s.decodeURLs} {
			if len(l) > 0 {
				return nil, errors.New("--engine-url, --prefill-engine-url and --decode-engine-url need a real engine's --engine (" + engineKinds()[len("sim, "):] + ")")
			}
		}
		return nil, nil
	}
	if _, err := lookupEngine(s.engine); err != nil {
		return nil, err
	}
	if err := s.opts.check(s.engine); err != nil {
		return nil, err
	}
	agg, err := zipEngines(s.engine, "", kv.RoleAggregated, s.urls, s.events, s.replays, s.peers)
	if err != nil {
		return nil, err
	}
	pre, err := zipEngines(s.engine, "prefill-", kv.RolePrefill, s.prefillURLs, s.prefillEvents, s.prefillReplays, s.prPeer)
	if err != nil {
		return nil, err
	}
	dec, err := zipEngines(s.engine, "decode-", kv.RoleDecode, s.decodeURLs, s.decodeEvents, s.decodeReplays, nil)
	if err != nil {
		return nil, err
	}
	switch {
	case len(pre) > 0 != (len(dec) > 0):
		return nil, errors.New("--prefill-engine-url and --decode-engine-url come together (a P/D fleet needs both)")
	case s.opts.kvTransfer != "" && len(pre) == 0:
		return nil, errors.New("--kv-transfer: only prefill engines (--prefill-engine-url) hand KV over")
	case len(agg)+len(pre) == 0:
		return nil, fmt.Errorf("--engine %s needs --engine-url (aggregated) or --prefill-engine-url and --decode-engine-url (P/D)", s.engine)
	}
	return append(append(agg, pre...), dec...), nil
}

// decodeOnly says whether a worker of engine kind for role registers
// decode_only: a decode server that cannot prefill alone.
func decodeOnly(kind string, role kv.Role) bool {
	a, ok := engineAdapters[kind]
	return ok && a.decodeCannotPrefill && role == kv.RoleDecode
}

// refuseLocalPrefill refuses an explicit --disagg-local-prefill-tokens
// asking for local prefill on decode servers that cannot prefill alone
// (their workers register decode_only, so routers never plan one).
func (s *serveEngineFlags) refuseLocalPrefill(cmd *cobra.Command, list []servedEngine, ff *frontendFlags) error {
	a, ok := engineAdapters[s.engine]
	if !ok || !a.decodeCannotPrefill {
		return nil
	}
	decode := false
	for _, se := range list {
		decode = decode || se.role == kv.RoleDecode
	}
	if !decode {
		return nil
	}
	if cmd.Flags().Changed("disagg-local-prefill-tokens") && ff.localPrefillTokens != 0 {
		return fmt.Errorf("--disagg-local-prefill-tokens %d: %s decode servers cannot prefill alone (want 0)", ff.localPrefillTokens, s.engine)
	}
	return nil
}

// startRealWorkerEngine checks the worker's real-engine flags, checks its
// peer endpoints dial, and attaches to the engine (waiting for it to be
// healthy).
func startRealWorkerEngine(cmd *cobra.Command, wf *workerFlags, model string, role kv.Role, log *slog.Logger) (attachedEngine, error) {
	adapter, err := lookupEngine(wf.engine)
	if err != nil {
		return nil, err
	}
	switch {
	case wf.controlListen != "":
		return nil, errors.New("--control-listen serves the sim's blocks; a real engine's peer service is its own: name it with --peer-endpoint")
	case len(wf.controlEndpoints) > 0:
		return nil, fmt.Errorf("--control-endpoints: with --engine %s, use --peer-endpoint", wf.engine)
	}
	if err := wf.real.check(wf.engine, "", -1, wf.dpSize); err != nil {
		return nil, err
	}
	if err := wf.realOpts.check(wf.engine); err != nil {
		return nil, err
	}
	if err := wf.real.dialPeers(cmd.Context(), ""); err != nil {
		return nil, err
	}
	pinned := 0
	if cmd.Flags().Changed("block-size") {
		pinned = wf.sim.BlockSize
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), wf.realOpts.timeout)
	defer cancel()
	eng, err := adapter.open(ctx, engineAttach{flags: &wf.real, opts: &wf.realOpts, model: model, role: role,
		dpSize: wf.dpSize, blockSize: pinned, log: log})
	if err != nil {
		return nil, fmt.Errorf("--engine-url %s: %w", wf.real.url, err)
	}
	return eng, nil
}

// eventStatser is an engine whose KV events come another way than a
// ZMQ relay (TensorRT-LLM's polled events) but are counted alike.
type eventStatser interface {
	EventStats() remote.RelayStats
}

// registerRelayMetrics exports the KV-event relay's counters on the
// worker's /metrics.
func registerRelayMetrics(reg prometheus.Registerer, eng attachedEngine) error {
	var r interface{ Stats() remote.RelayStats }
	switch {
	case eng.Relay() != nil:
		r = eng.Relay()
	default:
		es, ok := eng.(eventStatser)
		if !ok {
			return nil
		}
		r = statsFunc(es.EventStats)
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

// statsFunc adapts a stats method to registerRelayMetrics.
type statsFunc func() remote.RelayStats

func (f statsFunc) Stats() remote.RelayStats { return f() }
