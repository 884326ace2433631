package fleetkey

import (
	"bytes"
	"testing"
)

// Each purpose gets its own key, each token its own keys, and no token no
// key.
func TestDerive(t *testing.T) {
	if Derive("", NATS) != nil {
		t.Fatal("a key derived from no token")
	}
	seen := map[string]bool{}
	for _, tok := range []string{"token-one-0123456789", "token-two-0123456789"} {
		for _, p := range []string{NATS, Discovery, WorkerAPI} {
			k := Derive(tok, p)
			if len(k) != 32 || !bytes.Equal(k, Derive(tok, p)) {
				t.Fatalf("%s/%s: %x, not 32 stable bytes", tok, p, k)
			}
			seen[string(k)] = true
		}
	}
	if len(seen) != 6 {
		t.Fatalf("%d distinct keys for 2 tokens × 3 purposes", len(seen))
	}
}
