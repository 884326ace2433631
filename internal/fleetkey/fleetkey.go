// Package fleetkey derives purpose-bound keys from the fleet token, so the
// one shared secret yields unrelated keys for NATS identities, discovery
// signatures and worker API proofs: what one of them leaks (a signature, a
// public key) reveals neither the others nor the token.
package fleetkey

import (
	"crypto/hmac"
	"crypto/sha256"
)

// Purposes of the derived keys; each names one use and nothing else.
const (
	NATS      = "nats-identity"
	Discovery = "discovery-record"
	WorkerAPI = "worker-api-proof"
)

// Derive returns the 32-byte key for purpose: HMAC-SHA256(token,
// "kvmesh/"+purpose). An empty token gives nil: no key.
func Derive(token, purpose string) []byte {
	if token == "" {
		return nil
	}
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("kvmesh/" + purpose))
	return mac.Sum(nil)
}
