package main

import (
	"testing"

	"github.com/spf13/cobra"
)

func TestWithEnv(t *testing.T) {
	var seqs int
	var mode string
	var ran bool
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { ran = true; return nil }}
	cmd.Flags().IntVar(&seqs, "max-seqs", 1, "sequences")
	cmd.Flags().StringVar(&mode, "router-mode", "kv", "mode")
	withEnv(cmd, "T_")
	if u := cmd.Flags().Lookup("max-seqs").Usage; u != "sequences [KVMESH_T_MAX_SEQS]" {
		t.Fatalf("usage %q", u)
	}
	t.Setenv("KVMESH_T_MAX_SEQS", "7")
	t.Setenv("KVMESH_T_ROUTER_MODE", "random")
	cmd.SetArgs([]string{"--router-mode", "round-robin"})
	if err := cmd.Execute(); err != nil || !ran {
		t.Fatal(err)
	}
	// The environment fills flags not given; the command line wins.
	if seqs != 7 || mode != "round-robin" {
		t.Fatalf("seqs %d mode %q", seqs, mode)
	}
	bad := &cobra.Command{Use: "y", RunE: func(*cobra.Command, []string) error { return nil }}
	bad.Flags().IntVar(&seqs, "max-seqs", 1, "sequences")
	withEnv(bad, "T_")
	t.Setenv("KVMESH_T_MAX_SEQS", "many")
	bad.SetArgs(nil)
	if err := bad.Execute(); err == nil {
		t.Fatal("a malformed variable must be an error")
	}
}
