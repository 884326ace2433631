package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// withEnv gives every flag of cmd an environment variable,
// KVMESH_<prefix><FLAG> (--max-seqs with prefix "" is KVMESH_MAX_SEQS),
// names it in the flag's help, and applies it before the command runs to
// every flag not given on the command line. Call it after defining flags.
func withEnv(cmd *cobra.Command, prefix string) *cobra.Command {
	fs := cmd.Flags()
	fs.VisitAll(func(fl *pflag.Flag) { fl.Usage += " [" + envName(prefix, fl.Name) + "]" })
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if err := applyEnv(c.Flags(), prefix); err != nil {
			return err
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
	return cmd
}

func envName(prefix, flag string) string {
	return "KVMESH_" + prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func applyEnv(fs *pflag.FlagSet, prefix string) error {
	var err error
	fs.VisitAll(func(fl *pflag.Flag) {
		if err != nil || fl.Changed {
			return
		}
		name := envName(prefix, fl.Name)
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(fl.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

// traceFromEnv is the default of every --trace flag: KVMESH_TRACE, shared by
// the commands that replay traces.
func traceFromEnv() string { return os.Getenv("KVMESH_TRACE") }
