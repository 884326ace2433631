package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/hints"
)

func runHints(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newHintsCmd()
	var out, errOut bytes.Buffer
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String(), err
}

func TestHintsValidate(t *testing.T) {
	const hint = `{"message_id":"sel-1","protocol_version":"0.1","actions":[{"action_id":"a1","action_type":"kv.source_locations","action_version":"1.0","payload":{"mode":"copy","block_hashes":[18446744073709551615],"source_control_endpoint":"tcp://[FD00::7]:23280"}}]}`
	const want = `{
  "protocol_version": "0.1",
  "message_id": "sel-1",
  "actions": [
    {
      "action_id": "a1",
      "action_type": "kv.fetch",
      "action_version": "1.0",
      "payload": {
        "source_control_endpoint": "tcp://[fd00::7]:23280",
        "block_hashes": [
          18446744073709551615
        ]
      }
    }
  ]
}
`
	t.Run("stdin", func(t *testing.T) {
		out, err := runHints(t, hint, "validate")
		if err != nil {
			t.Fatal(err)
		}
		if out != want {
			t.Errorf("got\n%s\nwant\n%s", out, want)
		}
	})
	t.Run("dash and file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "hint.json")
		if err := os.WriteFile(path, []byte(hint), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"validate", "-"}, {"validate", path}} {
			stdin := hint
			if args[1] != "-" {
				stdin = ""
			}
			out, err := runHints(t, stdin, args...)
			if err != nil || out != want {
				t.Errorf("%v: err %v out\n%s", args, err, out)
			}
		}
	})
	t.Run("engine form", func(t *testing.T) {
		out, err := runHints(t, hint, "validate", "--engine", "sglang")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, `"mode": "copy"`) {
			t.Errorf("sglang form lacks explicit mode:\n%s", out)
		}
		if _, err := runHints(t, hint, "validate", "--engine", "tgi"); err == nil {
			t.Error("unknown engine accepted")
		}
	})
	t.Run("malformed", func(t *testing.T) {
		bad := strings.Replace(hint, "18446744073709551615", "18446744073709551616", 1)
		out, err := runHints(t, bad, "validate")
		if out != "" {
			t.Errorf("printed output for a bad hint: %s", out)
		}
		want := "actions[0].payload.block_hashes[0]: must be an integer in [0, 2^64), got 18446744073709551616"
		if err == nil || err.Error() != want || !errors.Is(err, hints.ErrMalformed) {
			t.Errorf("got %v, want %s", err, want)
		}
	})
	t.Run("ignored protocol", func(t *testing.T) {
		_, err := runHints(t, `{"protocol_version":"0.2","message_id":"","actions":[]}`, "validate")
		if !errors.Is(err, hints.ErrIgnored) {
			t.Errorf("got %v", err)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		_, err := runHints(t, "", "validate", filepath.Join(t.TempDir(), "nope.json"))
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("got %v", err)
		}
	})
	t.Run("too many args", func(t *testing.T) {
		if _, err := runHints(t, "", "validate", "a", "b"); err == nil {
			t.Error("two files accepted")
		}
	})
}
