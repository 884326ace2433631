package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/events"
)

// eventsCmd groups tools for engine KV-event feeds.
var eventsCmd = &cobra.Command{
	Use:   "events",
	Short: "Inspect engine KV-event feeds (vLLM/SGLang ZMQ)",
	RunE:  groupRun,
}

func newEventsListenCmd() *cobra.Command {
	cfg := events.ListenConfig{}
	cmd := &cobra.Command{
		Use:   "listen",
		Short: "Subscribe to a vLLM/SGLang KV-event publisher and print one JSON line per event",
		Long: `listen connects to an engine's ZMQ KV-event publisher (vLLM's --kv-events-config
endpoint), repairs sequence gaps through the replay endpoint when one is given, and
prints one JSON line per decoded event:

  {"seq":S,"dp_rank":R,"type":"stored|removed|cleared","engine_hashes":[...],
   "parent":P|null,"token_ids":[...],"block_size":N,"medium":M|null,"lora_name":L|null}

A store that names a cache salt (vLLM sends it in the first block's extra_keys) adds
"cache_salt":S at the end; a continuation of a salted chain names none on the wire.

With --count N it exits 0 after N events, and non-zero if --timeout hits first.
Without --count, --timeout is how long to listen: it then exits 0 and prints the
number of events seen to stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Endpoint == "" {
				return fmt.Errorf("--endpoint is required (e.g. tcp://127.0.0.1:5557)")
			}
			if cfg.Count < 0 {
				return fmt.Errorf("--count %d: want ≥ 0 (0: until the timeout or Ctrl-C)", cfg.Count)
			}
			if cfg.Timeout < 0 {
				return fmt.Errorf("--timeout %v: want ≥ 0 (0: wait forever)", cfg.Timeout)
			}
			if cfg.BlockSize < 0 {
				return fmt.Errorf("--block-size %d: want ≥ 0 (0: trust the wire)", cfg.BlockSize)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			n, err := events.Listen(ctx, cfg, cmd.OutOrStdout())
			if err != nil {
				return fmt.Errorf("events listen: %w", err)
			}
			if cfg.Count == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "events listen: %d events\n", n)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Endpoint, "endpoint", os.Getenv("KVMESH_EVENTS_ENDPOINT"), "publisher PUB endpoint, e.g. tcp://127.0.0.1:5557 [KVMESH_EVENTS_ENDPOINT]")
	f.StringVar(&cfg.ReplayEndpoint, "replay-endpoint", os.Getenv("KVMESH_EVENTS_REPLAY_ENDPOINT"), "publisher replay (ROUTER) endpoint; enables gap repair [KVMESH_EVENTS_REPLAY_ENDPOINT]")
	f.StringVar(&cfg.Topic, "topic", os.Getenv("KVMESH_EVENTS_TOPIC"), "topic prefix to subscribe to; empty receives all [KVMESH_EVENTS_TOPIC]")
	f.IntVar(&cfg.BlockSize, "block-size", 0, "worker block size for conversion checks; 0 trusts the wire")
	f.IntVar(&cfg.Count, "count", 0, "exit after this many events; 0 runs until the timeout or Ctrl-C")
	f.DurationVar(&cfg.Timeout, "timeout", 0*time.Second, "with --count: give up (exit 1) after this long; without: listen this long, then exit 0; 0 waits forever")
	return cmd
}

func init() {
	eventsCmd.AddCommand(newEventsListenCmd())
	rootCmd.AddCommand(eventsCmd)
}
