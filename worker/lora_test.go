package worker

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/engine/sim"
)

// A worker registers the LoRA adapters it serves and refuses a request for
// another one (InvalidArgument, so the frontend answers 400 and does not
// migrate); a bad adapter list fails New naming it.
func TestWorkerLoRAs(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.BlockSize, cfg.SpeedupRatio = "m", 4, 0
	eng, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, c := startWorkerWith(t, nil, eng, Config{LoRAs: []string{"sql-lora"}})
	if in := w.Instance(); !slices.Equal(in.LoRAs, []string{"sql-lora"}) || in.Validate() != nil {
		t.Fatalf("registered loras %v (%v)", in.LoRAs, in.Validate())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	run := func(lora string) error {
		st, err := c.Generate(ctx, &api.GenerateRequest{Tokens: prompt(1, 12), MaxTokens: 2, Lora: lora})
		for err == nil {
			_, err = st.Recv()
		}
		if err == io.EOF {
			return nil
		}
		return err
	}
	for _, l := range []string{"", "sql-lora"} {
		if err := run(l); err != nil {
			t.Fatalf("lora %q: %v", l, err)
		}
	}
	if err := run("chat-lora"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "chat-lora") {
		t.Fatalf("unserved adapter: %v, want InvalidArgument naming it", err)
	}
	for _, bad := range [][]string{{""}, {"a b"}, {"m"}, {"x", "x"}} {
		if _, err := New(Config{LoRAs: bad}, eng, nil); err == nil || !strings.Contains(err.Error(), "lora") {
			t.Errorf("loras %q: %v, want an error", bad, err)
		}
	}
}
