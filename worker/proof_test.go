package worker

import (
	"log/slog"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/fleetkey"
	"github.com/kvmesh/kvmesh/workerclient"
)

// A fleet proof opens one call, of the method it names, at the worker
// whose address it names, near its time: one captured by whoever answered
// at another address (a forged discovery record) or replayed is refused.
func TestProofGuardAcceptsEachProofOnceAndOnlyHere(t *testing.T) {
	const token, here, method = "the-fleet-token-0123", "127.0.0.1:7001", "/kvmesh.api.v1.Worker/Generate"
	g := newProofGuard(&Worker{log: slog.New(slog.DiscardHandler)}, token, here)
	key := fleetkey.Derive(token, fleetkey.WorkerAPI)
	now := time.Unix(1_800_000_000, 0)
	nonce := func(i byte) string { return string(append([]byte("0123456789abcdef0123456789abcde"), 'a'+i)) }
	good := workerclient.MakeProof(key, here, method, now, nonce(0))
	if !g.accept(good, method, now) {
		t.Fatal("a valid proof was refused")
	}
	cases := []struct {
		name, proof, method string
		at                  time.Time
	}{
		{"the same proof again", good, method, now},
		{"a proof made for another address", workerclient.MakeProof(key, "127.0.0.1:9999", method, now, nonce(1)), method, now},
		{"a proof for another method", workerclient.MakeProof(key, here, "/kvmesh.api.v1.Worker/Dump", now, nonce(2)), method, now},
		{"a proof from two minutes ago", workerclient.MakeProof(key, here, method, now.Add(-2*time.Minute), nonce(3)), method, now},
		{"a proof under another token", workerclient.MakeProof(fleetkey.Derive("another-fleet-token-9", fleetkey.WorkerAPI), here, method, now, nonce(4)), method, now},
		{"the fleet token itself", "Bearer " + token, method, now},
		{"the first proof replayed 90 s later", good, method, now.Add(90 * time.Second)},
	}
	for _, c := range cases {
		if g.accept(c.proof, c.method, c.at) {
			t.Errorf("%s: accepted", c.name)
		}
	}
	// Nonces are forgotten only once their proofs are too old anyway.
	later := now.Add(3 * workerclient.ProofWindow)
	if !g.accept(workerclient.MakeProof(key, here, method, later, nonce(5)), method, later) {
		t.Error("a fresh proof after the nonce rotation was refused")
	}
}
