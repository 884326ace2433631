package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// groupRun is the RunE of a command that only groups subcommands: cobra
// would print the help and exit 0 for `kvmesh bench laod`, so a typo looked
// like success. Without arguments it prints the help; with one it fails.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's own default
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return errors.New(msg)
}
