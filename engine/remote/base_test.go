package remote

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The block size is the server's, else the pinned one, else the engine's
// default with a warning; a pinned size the server contradicts is an
// error naming both.
func TestSettleBlockSize(t *testing.T) {
	var logs bytes.Buffer
	b := &Base{log: slog.New(slog.NewTextHandler(&logs, nil)), url: "http://127.0.0.1:1"}
	rule := BlockSizeRule{Default: 16, Engine: "vLLM engine", Uses: "uses blocks of %d tokens", Key: "block_size", Unknown: "no block size"}
	for _, c := range []struct{ reported, pinned, want int }{{32, 0, 32}, {32, 32, 32}, {0, 64, 64}, {0, 0, 16}} {
		if got, err := b.SettleBlockSize(c.reported, c.pinned, rule); err != nil || got != c.want {
			t.Errorf("reported %d pinned %d: %d, %v; want %d", c.reported, c.pinned, got, err, c.want)
		}
	}
	if n := strings.Count(logs.String(), `msg="no block size" block_size=16`); n != 1 {
		t.Errorf("warned %d times, want once (only with neither size):\n%s", n, logs.String())
	}
	_, err := b.SettleBlockSize(16, 32, rule)
	if want := "--block-size 32 but the vLLM engine at http://127.0.0.1:1 uses blocks of 16 tokens"; err == nil || err.Error() != want {
		t.Fatalf("mismatch: %v, want %q", err, want)
	}
}
