package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/hints"
)

// maxHintFile bounds what `hints validate` reads; real hints are kilobytes.
const maxHintFile = 64 << 20

func init() { rootCmd.AddCommand(newHintsCmd()) }

// newHintsCmd builds `kvmesh hints …` (a constructor so tests get a fresh tree).
func newHintsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hints",
		Short: "Inspect KV hint envelopes",
		RunE:  groupRun,
	}
	var engine string
	validate := &cobra.Command{
		Use:   "validate [FILE|-]",
		Short: "Validate a KV hint envelope and print it normalised",
		Long: `Reads a KV hint envelope (JSON) from FILE or standard input, validates it and
prints the normalised envelope as indented JSON. A malformed hint prints the
precise error, naming the field, and exits 1; so does a hint whose
protocol_version is unknown (consumers would ignore it).
With --engine, prints the envelope in that engine's wire form instead.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "-"
			if len(args) == 1 {
				path = args[0]
			}
			return validateHint(cmd.InOrStdin(), path, engine, cmd.OutOrStdout())
		},
	}
	validate.Flags().StringVar(&engine, "engine", "", "print the engine wire form: vllm, vllm-bridge, sglang or trtllm")
	cmd.AddCommand(validate)
	return cmd
}

// validateHint reads the hint at path ("-" = stdin), validates it and writes
// the normalised envelope (or its engine form) to out. The returned error is
// the precise validation error; main prints it to stderr and exits 1.
func validateHint(stdin io.Reader, path, engine string, out io.Writer) error {
	var eng hints.Engine
	if engine != "" {
		var err error
		if eng, err = hints.ParseEngine(engine); err != nil {
			return fmt.Errorf("--engine: %w", err)
		}
	}
	in := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	data, err := io.ReadAll(io.LimitReader(in, maxHintFile+1))
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxHintFile {
		return fmt.Errorf("read %s: larger than %d bytes", path, maxHintFile)
	}
	env, err := hints.Parse(data)
	if err != nil {
		return err
	}
	wire := env.Marshal()
	if eng != "" {
		if wire, err = hints.Encode(eng, env); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, wire, "", "  "); err != nil {
		return fmt.Errorf("indent: %w", err) // cannot happen: Marshal emits valid JSON
	}
	buf.WriteByte('\n')
	_, err = out.Write(buf.Bytes())
	return err
}
