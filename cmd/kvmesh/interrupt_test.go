package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/spf13/cobra"
)

func TestQuietOnInterrupt(t *testing.T) {
	other := errors.New("bind: address already in use")
	for _, c := range []struct {
		name    string
		runErr  error
		wantErr error
		stderr  string
	}{
		{"cancel during start is a clean stop", fmt.Errorf("worker 2: %w", context.Canceled), nil, "kvmesh serve: interrupted while starting\n"},
		{"other errors pass", other, other, ""},
		{"deadline is a failure", fmt.Errorf("start: %w", context.DeadlineExceeded), context.DeadlineExceeded, ""},
		{"success", nil, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := &cobra.Command{Use: "serve", RunE: func(*cobra.Command, []string) error { return c.runErr }}
			cmd.RunE = quietOnInterrupt(cmd.RunE)
			var errOut bytes.Buffer
			cmd.SetErr(&errOut)
			cmd.SetArgs(nil)
			cmd.SilenceErrors, cmd.SilenceUsage = true, true
			err := cmd.ExecuteContext(context.Background())
			if !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Errorf("err %v, want %v", err, c.wantErr)
			}
			if errOut.String() != c.stderr {
				t.Errorf("stderr %q, want %q", errOut.String(), c.stderr)
			}
		})
	}
	// A caller that cancelled the command's own context gets the error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cmd := &cobra.Command{Use: "serve", RunE: func(*cobra.Command, []string) error { return context.Canceled }}
	cmd.RunE = quietOnInterrupt(cmd.RunE)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(nil)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	if err := cmd.ExecuteContext(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("parent cancel: err %v", err)
	}
}
