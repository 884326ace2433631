package workerclient

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvmesh/kvmesh/internal/fleetkey"
)

// ProofMetadataKey carries a caller's proof that it holds the fleet token,
// made afresh for every worker API call. The token itself never travels:
// a frontend learns worker addresses from discovery, and whoever answers
// at such an address must not receive a secret it could reuse.
//
// The value is "v1 <unix seconds> <nonce: 32 hex> <mac: 64 hex>", the mac
// being HMAC-SHA256 under fleetkey.Derive(token, fleetkey.WorkerAPI) of
//
//	"v1\n" + authority + "\n" + method + "\n" + unix seconds + "\n" + nonce
//
// where authority is the host:port the caller dialed and method the full
// gRPC method. A worker accepts a proof only for its own advertised
// address, within ProofWindow of its clock, and each nonce once: a proof
// a stranger captured is good neither at another worker nor twice.
const ProofMetadataKey = "kvmesh-fleet-proof"

// ProofWindow is how far a proof's time may be from the worker's clock.
const ProofWindow = time.Minute

// WithFleetToken is the dial option that proves token on every call of a
// Pool's connections (NewPool(WithFleetToken(t))).
func WithFleetToken(token string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(proofCreds{key: fleetkey.Derive(token, fleetkey.WorkerAPI)})
}

type proofCreds struct{ key []byte }

func (p proofCreds) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	info, ok := credentials.RequestInfoFromContext(ctx)
	if !ok || len(uri) == 0 {
		return nil, errors.New("fleet proof: no call information")
	}
	u, err := url.Parse(uri[0])
	if err != nil {
		return nil, fmt.Errorf("fleet proof: audience %q: %w", uri[0], err)
	}
	var nonce [16]byte
	rand.Read(nonce[:])
	return map[string]string{ProofMetadataKey: MakeProof(p.key, u.Host, info.Method, time.Now(), hex.EncodeToString(nonce[:]))}, nil
}

// RequireTransportSecurity is false: the proof is also the credential of
// plaintext fleets on a private network (TLS is configured separately).
func (proofCreds) RequireTransportSecurity() bool { return false }

// MakeProof is the proof value for one call (see ProofMetadataKey).
func MakeProof(key []byte, authority, method string, at time.Time, nonce string) string {
	ts := strconv.FormatInt(at.Unix(), 10)
	return "v1 " + ts + " " + nonce + " " + hex.EncodeToString(proofMAC(key, authority, method, ts, nonce))
}

func proofMAC(key []byte, authority, method, ts, nonce string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("v1\n" + authority + "\n" + method + "\n" + ts + "\n" + nonce))
	return m.Sum(nil)
}

// Proof is a parsed proof value.
type Proof struct {
	At    time.Time
	Nonce string
	ts    string
	mac   []byte
}

// ParseProof reads a proof value's fields.
func ParseProof(v string) (Proof, error) {
	f := strings.Split(v, " ")
	if len(f) != 4 || f[0] != "v1" || len(f[2]) != 32 || len(f[3]) != 64 {
		return Proof{}, errors.New("malformed fleet proof")
	}
	sec, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return Proof{}, errors.New("malformed fleet proof time")
	}
	mac, err := hex.DecodeString(f[3])
	if err != nil {
		return Proof{}, errors.New("malformed fleet proof mac")
	}
	return Proof{At: time.Unix(sec, 0), Nonce: f[2], ts: f[1], mac: mac}, nil
}

// Valid reports whether the proof's mac is key's for a call of method to
// authority; its time and nonce are the verifier's to judge.
func (p Proof) Valid(key []byte, authority, method string) bool {
	return hmac.Equal(p.mac, proofMAC(key, authority, method, p.ts, p.Nonce))
}
