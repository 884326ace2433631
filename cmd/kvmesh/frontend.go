package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/natsbus"
)

func init() { rootCmd.AddCommand(newFrontendCmd()) }

func newFrontendCmd() *cobra.Command {
	ff := &frontendFlags{}
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "frontend",
		Short: "Run the OpenAI frontend and KV router against workers registered on NATS",
		Long: `frontend serves the OpenAI-compatible API (/v1/chat/completions, /v1/completions,
/v1/models, /health, /live, /metrics, and a live dashboard at /dashboard) and routes each request with the KV-aware
router to the workers of its model found in the NATS discovery bucket (start
them with kvmesh worker, or join a kvmesh serve through the NATS URL it prints).
/health answers 503 until every --model has a worker. SIGINT or SIGTERM stops
accepting requests, gives those in flight 1 s, then cuts them. Every flag has a
KVMESH_* environment variable. OpenTelemetry traces follow the standard OTEL_* variables
(OTEL_EXPORTER_OTLP_ENDPOINT turns them on; off when unset).

On startup it prints one line to stdout:
  kvmesh frontend: models [<names>] (router <mode>); OpenAI API at http://<host:port>/v1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := workerLogger(ff.logLevel, os.Stderr)
			if err != nil {
				return err
			}
			if err := ff.validate(); err != nil {
				return err
			}
			warnOpenListen(log, ff)
			tracer, stopTracing, err := setupTracing(cmd.Context(), "kvmesh-frontend", log)
			if err != nil {
				return err
			}
			defer stopTracing()
			ff.tracer = tracer
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			token, err := ff.fleet.token()
			if err != nil {
				return err
			}
			if err := nf.identify(token, natsbus.FrontendIdentity()); err != nil {
				return err
			}
			nc, disc, err := nf.controlPlane(ctx, "kvmesh-frontend", log)
			if err != nil {
				return err
			}
			defer nc.Close()
			rf, err := startFrontend(ctx, ff, nc, disc, log)
			if err != nil {
				return err
			}
			defer rf.shutdown()
			fmt.Fprintf(cmd.OutOrStdout(), "kvmesh frontend: models %v (router %s); OpenAI API at %s\n", ff.models, ff.routerMode, rf.url())
			select {
			case <-ctx.Done():
				log.Info("shutting down")
				return nil
			case err := <-rf.errc:
				if errors.Is(err, http.ErrServerClosed) {
					return nil
				}
				return err
			}
		},
	}
	f := cmd.Flags()
	ff.register(f, []string{"kvmesh-sim"})
	nf.register(f)
	cmd.RunE = quietOnInterrupt(cmd.RunE)
	return withEnv(cmd, "")
}
