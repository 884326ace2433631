// Command kvmesh is the single binary of the kvmesh serving fabric. Each
// subcommand lives in its own file and registers itself on rootCmd (or a
// parent such as benchCmd) in init, so commands stay independent.
//
// It is flags and wiring only: it may import any room, and nothing imports
// it.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

var rootCmd = &cobra.Command{
	Use:   "kvmesh",
	Short: "KV-cache-aware LLM serving fabric",
	Long: `kvmesh routes LLM requests to the worker that already holds their KV cache,
tells workers to fetch KV blocks from peers instead of recomputing them, and
measures what that saves.`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	if addr := os.Getenv(pprofEnv); addr != "" {
		at, err := startPprof(addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kvmesh:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "kvmesh: profiler at http://%s/debug/pprof/\n", at)
	}
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvmesh:", err)
		os.Exit(1)
	}
}
