package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/discovery"
	"github.com/kvmesh/kvmesh/worker"
)

// startEngineWorkers attaches one worker to each real engine named by
// serve's flags and registers it. The model name comes from the engines
// (they must agree) unless --model names it; ff.models is set to it. Every
// engine runs dpSize DP ranks (rank r's events on the --kv-events port +
// r, as for worker); blockSize, when --block-size is set, pins theirs.
func startEngineWorkers(ctx context.Context, cmd *cobra.Command, ef *serveEngineFlags, ff *frontendFlags, nc *nats.Conn,
	dpSize, blockSize int, stallTimeout time.Duration, reg prometheus.Registerer, log *slog.Logger) ([]*worker.Worker, error) {
	list, err := ef.engines()
	if err != nil {
		return nil, err
	}
	adapter, err := lookupEngine(ef.engine)
	if err != nil {
		return nil, err
	}
	if !cmd.Flags().Changed("block-size") {
		blockSize = 0
	}
	model := ""
	if cmd.Flags().Changed("model") {
		model = ff.models[0]
	}
	// serve's token (its own random one when none is given): the workers
	// sign their records with it and require it of their callers.
	token, err := ff.fleet.token()
	if err != nil {
		return nil, err
	}
	var ws []*worker.Worker
	closeAll := func() {
		for _, w := range ws {
			_ = w.Close()
		}
	}
	for i, se := range list {
		if len(se.flags.peers) > 0 && dpSize > 1 {
			closeAll()
			return nil, fmt.Errorf("--%speer-endpoint takes one endpoint per engine, so it needs --dp-size 1 (--dp-size is %d); run a worker per engine for peer endpoints per rank", se.prefix, dpSize)
		}
		if err := se.flags.dialPeers(ctx, se.prefix); err != nil {
			closeAll()
			return nil, err
		}
		wlog := log.With("engine", se.flags.url)
		octx, cancel := context.WithTimeout(ctx, ef.opts.timeout)
		eng, err := adapter.open(octx, engineAttach{flags: &se.flags, opts: &ef.opts, model: model, role: se.role, dpSize: dpSize,
			blockSize: blockSize, log: wlog})
		cancel()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("--%sengine-url %s: %w", se.prefix, se.flags.url, err)
		}
		if m := eng.Config().Model; model == "" {
			model = m
		} else if m != model {
			eng.Close()
			closeAll()
			return nil, fmt.Errorf("--%sengine-url %s serves %q, the engines before it %q: serve runs one model", se.prefix, se.flags.url, m, model)
		}
		w, err := worker.New(worker.Config{Model: model, Role: se.role, Logger: wlog, ControlEndpoints: se.flags.peers,
			AcceptsHints: ef.opts.acceptsHints(), StallTimeout: stallTimeoutConfig(stallTimeout), Registerer: reg, Tracer: ff.tracer, Engine: ef.engine,
			DecodeOnly: decodeOnly(ef.engine, se.role), NoKVEvents: se.flags.events == "",
			Discovery: discovery.Config{Logger: log}, FleetToken: token, LocalEvents: ff.localEvents}, eng, nc)
		if err != nil {
			eng.Close()
			closeAll()
			return nil, err
		}
		if err := w.Start(ctx); err != nil {
			_ = w.Close()
			closeAll()
			return nil, fmt.Errorf("engine %d (%s): %w", i+1, se.flags.url, err)
		}
		ws = append(ws, w)
	}
	ff.models = []string{model}
	return ws, nil
}
