package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// quietOnInterrupt wraps a long-running command's RunE: a Ctrl-C or SIGTERM
// during start-up cancels its context, and the context.Canceled that
// surfaces from whatever step was running (discovery, worker start, the
// readiness wait) is the requested stop, not a failure: exit 0.
func quietOnInterrupt(run func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := run(cmd, args)
		if errors.Is(err, context.Canceled) && cmd.Context().Err() == nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "kvmesh %s: interrupted while starting\n", cmd.Name())
			return nil
		}
		return err
	}
}
