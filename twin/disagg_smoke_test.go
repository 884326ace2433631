package twin

import (
	"context"
	"testing"
)

func TestPDSmoke(t *testing.T) {
	wl, err := LoadWorkload(conversationTrace(), LoadOptions{MaxRequests: 2000})
	if err != nil {
		t.Skip(err)
	}
	for _, c := range []Config{{Mode: "kv", Seed: 1}, {Mode: "kv", PrefillWorkers: 4, DecodeWorkers: 4, Seed: 1}, {Mode: "kv+hints", PrefillWorkers: 2, DecodeWorkers: 6, Seed: 1}} {
		r, err := Run(context.Background(), wl, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v %+v hit %.3f ttft %+v itl %+v", c, r.Paths, r.Hit.Total, r.TTFT, r.ITL)
	}
}
