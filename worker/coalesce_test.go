package worker

import (
	"fmt"
	"testing"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/kv"
)

// takeQueued joins the plain chunks already queued, stops at the first
// other one (held, not lost) or an empty queue, and leaves the engine's
// slice as it was.
func TestTakeQueued(t *testing.T) {
	ch := make(chan engine.Chunk, 8)
	first := []kv.Token{1}
	ch <- engine.Chunk{Tokens: []kv.Token{2}}
	ch <- engine.Chunk{Tokens: []kv.Token{3, 4}}
	ch <- engine.Chunk{Tokens: []kv.Token{5}, Finish: kv.FinishLength, Usage: &engine.Usage{PromptTokens: 9}}
	ch <- engine.Chunk{Tokens: []kv.Token{6}}
	toks, held, ok := takeQueued(ch, first[:1:1])
	if fmt.Sprint(toks) != "[1 2 3 4]" || !ok || held.Finish != kv.FinishLength || fmt.Sprint(held.Tokens) != "[5]" {
		t.Fatalf("got %v, held %+v (%v)", toks, held, ok)
	}
	if first[0] != 1 {
		t.Fatal("the engine's slice was written")
	}
	// Nothing waiting: nothing waited for.
	<-ch
	toks, _, ok = takeQueued(ch, []kv.Token{7})
	if fmt.Sprint(toks) != "[7]" || ok {
		t.Fatalf("empty queue: got %v (held %v)", toks, ok)
	}
	// A closed channel ends the taking; its end is the next receive's.
	ch <- engine.Chunk{Tokens: []kv.Token{8}}
	close(ch)
	toks, _, ok = takeQueued(ch, []kv.Token{7})
	if fmt.Sprint(toks) != "[7 8]" || ok {
		t.Fatalf("closed: got %v (held %v)", toks, ok)
	}
}
