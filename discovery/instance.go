package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/natsbus"
)

// Instance is one worker's discovery record (JSON in the KV bucket).
type Instance struct {
	ID uint64 `json:"instance_id"`
	// Incarnation is drawn at random by each worker process at start: a
	// record under a known ID with a new incarnation is a restarted
	// process (its event ids start over and its holdings are its own),
	// not the same process moving or changing metadata.
	Incarnation uint64 `json:"incarnation,omitempty"`
	Model       string `json:"model"`
	// Role is aggregated, prefill or decode.
	Role kv.Role `json:"role"`
	// GRPCAddr is host:port of the worker API (api.Worker).
	GRPCAddr string `json:"grpc_addr"`
	DPSize   int    `json:"dp_size"`
	// BlockSize is tokens per KV block.
	BlockSize int `json:"block_size"`
	// KVCapacity is blocks per tier, keyed by tier name (device, host, …).
	KVCapacity       map[string]int `json:"kv_capacity,omitempty"`
	MaxBatchedTokens int            `json:"max_batched_tokens,omitempty"`
	// MaxModelLen is the engine's own context length, prompt plus
	// completion (vLLM's max_model_len); 0: the engine sets none beyond
	// its KV capacity.
	MaxModelLen int `json:"max_model_len,omitempty"`
	// Digest names the KV layout; only equal digests share blocks.
	Digest string `json:"compat_digest,omitempty"`
	// ControlEndpoints is tcp://host:port per DP rank for peer KV transfer:
	// all ranks or none.
	ControlEndpoints []string `json:"control_endpoints,omitempty"`
	// AcceptsHints says whether the worker consumes KV hints as a target;
	// absent (older records, sim workers) it does exactly when it has
	// control endpoints. A real engine's worker may take hints without
	// serving its own blocks, or serve them and take none.
	AcceptsHints *bool `json:"accepts_hints,omitempty"`
	// Engine names the engine kind behind the worker (sim, vllm, …), for
	// operators and the dashboard; routing does not read it.
	Engine string `json:"engine,omitempty"`
	// LoRAs are the LoRA adapters the worker serves besides its base
	// model, by the name requests use in their model field (vLLM's
	// --lora-modules names). Requests for an adapter go only to workers
	// that list it.
	LoRAs []string `json:"loras,omitempty"`
	// DecodeOnly: a decode worker whose engine cannot prefill alone
	// (SGLang's decode servers): routers send it disaggregated decode legs
	// only, never a whole request.
	DecodeOnly bool `json:"decode_only,omitempty"`
	// TLS: the worker API speaks only TLS (the fleet's mutual TLS), so a
	// caller without the fleet's client certificate cannot reach it.
	TLS bool `json:"tls,omitempty"`
	// FleetToken: the worker API answers only calls that prove the fleet
	// token (workerclient.WithFleetToken).
	FleetToken bool `json:"fleet_token,omitempty"`
	// SignedAt and Sig are the signature of a fleet with a key (sign.go);
	// Register sets them.
	SignedAt int64  `json:"signed_at,omitempty"`
	Sig      string `json:"sig,omitempty"`
	// NoKVEvents: the worker relays no KV events (a real engine started
	// without --kv-events), so routers cannot see its cache: they credit
	// it with what they sent it (kv-approx) and say so.
	NoKVEvents bool `json:"no_kv_events,omitempty"`
}

// ServesLoRA reports whether the worker serves adapter name ("" is the
// base model, which every worker serves).
func (in *Instance) ServesLoRA(name string) bool {
	return name == "" || slices.Contains(in.LoRAs, name)
}

// HintTarget reports whether routers may send the worker KV hints.
func (in *Instance) HintTarget() bool {
	if in.AcceptsHints != nil {
		return *in.AcceptsHints
	}
	return len(in.ControlEndpoints) > 0
}

// Workers returns the worker keys (one per DP rank) of the instance.
func (in *Instance) Workers() []kv.WorkerKey {
	n := max(in.DPSize, 1)
	ws := make([]kv.WorkerKey, n)
	for r := range ws {
		ws[r] = kv.WorkerKey{Instance: in.ID, DPRank: uint32(r)}
	}
	return ws
}

// Validate checks a record before it is registered or trusted.
func (in *Instance) Validate() error {
	if in.ID == 0 {
		return errors.New("instance: zero instance_id")
	}
	if in.Model == "" {
		return errors.New("instance: empty model")
	}
	if !in.Role.Valid() {
		return fmt.Errorf("instance %x: role %q (want aggregated, prefill or decode)", in.ID, in.Role)
	}
	if err := validHostPort(in.GRPCAddr); err != nil {
		return fmt.Errorf("instance %x: grpc_addr: %w", in.ID, err)
	}
	if in.DPSize < 1 || in.DPSize > 1024 {
		return fmt.Errorf("instance %x: dp_size %d out of range 1..1024", in.ID, in.DPSize)
	}
	if in.BlockSize < 1 {
		return fmt.Errorf("instance %x: block_size %d < 1", in.ID, in.BlockSize)
	}
	if in.MaxModelLen < 0 {
		return fmt.Errorf("instance %x: max_model_len %d < 0", in.ID, in.MaxModelLen)
	}
	for name, n := range in.KVCapacity {
		if _, err := kv.ParseTier(name); err != nil {
			return fmt.Errorf("instance %x: kv_capacity: %w", in.ID, err)
		}
		if n < 0 {
			return fmt.Errorf("instance %x: kv_capacity %s: negative %d", in.ID, name, n)
		}
	}
	for i, l := range in.LoRAs {
		if err := ValidLoRAName(l); err != nil {
			return fmt.Errorf("instance %x: loras: %w", in.ID, err)
		}
		if l == in.Model || slices.Contains(in.LoRAs[:i], l) {
			return fmt.Errorf("instance %x: loras: %q repeats the model or another adapter", in.ID, l)
		}
	}
	if len(in.ControlEndpoints) != 0 {
		if len(in.ControlEndpoints) != in.DPSize {
			return fmt.Errorf("instance %x: %d control endpoints for dp_size %d (all ranks or none)", in.ID, len(in.ControlEndpoints), in.DPSize)
		}
		for r, ep := range in.ControlEndpoints {
			if _, err := kv.ParseEndpoint(ep); err != nil {
				return fmt.Errorf("instance %x: control endpoint of rank %d: %w", in.ID, r, err)
			}
		}
	}
	return nil
}

// ValidLoRAName checks an adapter name: non-empty, at most 256 bytes,
// printable ASCII without spaces or commas (it travels in a flag's list and
// in a request's model field).
func ValidLoRAName(name string) error {
	if name == "" || len(name) > 256 {
		return fmt.Errorf("adapter name %q: want 1..256 bytes", name)
	}
	for _, c := range []byte(name) {
		if c <= ' ' || c >= 0x7f || c == ',' {
			return fmt.Errorf("adapter name %q: only printable ASCII without spaces or commas", name)
		}
	}
	return nil
}

func validHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("%q: %w", hp, err)
	}
	if host == "" || host == "*" {
		return fmt.Errorf("%q: missing host", hp)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%q: wildcard address is not reachable", hp)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: bad port", hp)
	}
	return nil
}

// parseInstance decodes and validates a record.
func parseInstance(b []byte) (Instance, error) {
	var in Instance
	if err := json.Unmarshal(b, &in); err != nil {
		return Instance{}, fmt.Errorf("instance record: %w", err)
	}
	if err := in.Validate(); err != nil {
		return Instance{}, err
	}
	return in, nil
}

func instanceKey(model string, id uint64) string {
	return natsbus.ModelToken(model) + "." + natsbus.InstanceToken(id)
}
