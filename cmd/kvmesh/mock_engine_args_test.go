package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestPositionalModel: the engine CLIs' positional MODEL sets the model,
// agrees with an equal --model and refuses a different one.
func TestPositionalModel(t *testing.T) {
	for _, c := range []struct {
		flags []string
		args  []string
		want  string
		err   string
	}{
		{nil, nil, "kvmesh-sim", ""},
		{nil, []string{"llama"}, "llama", ""},
		{[]string{"--model", "llama"}, []string{"llama"}, "llama", ""},
		{[]string{"--model", "qwen"}, []string{"llama"}, "", `model given twice: "llama" and --model "qwen"`},
	} {
		var model string
		cmd := &cobra.Command{Use: "x"}
		cmd.Flags().StringVar(&model, "model", "kvmesh-sim", "")
		if err := cmd.Flags().Parse(c.flags); err != nil {
			t.Fatal(err)
		}
		err := positionalModel(cmd, c.args, &model)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v %v: %v, want %q", c.flags, c.args, err, c.err)
			}
			continue
		}
		if err != nil || model != c.want {
			t.Errorf("%v %v: model %q, %v; want %q", c.flags, c.args, model, err, c.want)
		}
	}
}
