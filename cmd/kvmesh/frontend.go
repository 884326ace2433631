package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/runtime"
)

func init() { rootCmd.AddCommand(newFrontendCmd()) }

func newFrontendCmd() *cobra.Command {
	ff := &frontendFlags{}
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "frontend",
		Short: "Run the OpenAI frontend and KV router against workers registered on NATS",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := workerLogger(ff.logLevel, os.Stderr)
			if err != nil {
				return err
			}
			if err := ff.validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			nc, err := runtime.Connect(nf.conn("kvmesh-frontend", log))
			if err != nil {
				return err
			}
			defer nc.Close()
			disc, err := runtime.OpenDiscovery(ctx, nc, runtime.DiscoveryConfig{Logger: log})
			if err != nil {
				return err
			}
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
