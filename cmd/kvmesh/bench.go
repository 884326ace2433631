package main

import "github.com/spf13/cobra"

// benchCmd groups the benchmarks: `bench index`, `bench route`, `bench load`.
var benchCmd = &cobra.Command{
	Use:   "bench",
	Short: "Measure kvmesh components and deployments",
	RunE:  groupRun,
}

func init() { rootCmd.AddCommand(benchCmd) }
