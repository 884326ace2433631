package kvcr

import (
	"fmt"
	"strings"

	"github.com/kvmesh/kvmesh/kv"
)

// Hash domains: how an engine derives the block hashes its events carry.
// The worker expects its engine kind's; inventory in another domain would
// name blocks the router cannot match to the engine's own events or hints.
const (
	// HashDomainSGLang: the first 8 bytes of SGLang's chained SHA-256 over
	// the page's tokens, as a signed int64.
	HashDomainSGLang = "sglang_sha256_i64"
	// HashDomainVLLM: the last 8 bytes of vLLM's block SHA-256, unsigned.
	HashDomainVLLM = "vllm_sha256_u64"
)

// ScopeProcessLocal is the one inventory scope the agent accepts: the
// inventory names only blocks this engine process's KVCR holds, so the
// worker may credit them to itself.
const ScopeProcessLocal = "process_local"

// Descriptor is the inventory a linker reports (SGLang's scheduler puts
// it in /get_server_info as "kvcr_inventory").
type Descriptor struct {
	// CacheOwner is the stable id KVCR keeps across engine restarts.
	CacheOwner string `json:"cache_owner_id"`
	// Topic is the ZMQ topic the inventory is published on; it must be
	// this owner's (it names CacheOwner), not a topic shared with others.
	Topic string `json:"topic"`
	// BlockSize is tokens per block of the inventory's events.
	BlockSize  int    `json:"block_size"`
	HashDomain string `json:"hash_domain"`
	// Scope is what the inventory covers; see ScopeProcessLocal.
	Scope string `json:"inventory_scope"`
	// Media are the media the inventory's events use.
	Media []string `json:"media"`
	// HintForwarding says the engine hands kv hints to KVCR: without it a
	// hint would be dropped at the engine, so the worker takes none.
	HintForwarding bool `json:"kv_hint_forwarding"`
}

// Expect is what the worker requires of a descriptor.
type Expect struct {
	BlockSize  int    // the worker's
	HashDomain string // the worker's engine kind's
	// CacheOwner, when set, pins the owner (--kvcr-cache-owner); a
	// descriptor naming another is refused.
	CacheOwner string
}

// Validate checks d against want before any event is taken; the error
// says what is wrong and where it is set.
func (d Descriptor) Validate(want Expect) error {
	const pre = "kvcr inventory: "
	if d.CacheOwner == "" {
		return fmt.Errorf(pre + "the linker reports no cache_owner_id: without a stable owner an engine restart would orphan or duplicate holdings")
	}
	if strings.ContainsFunc(d.CacheOwner, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return fmt.Errorf(pre+"cache_owner_id %q: spaces and control characters are not allowed", d.CacheOwner)
	}
	if want.CacheOwner != "" && d.CacheOwner != want.CacheOwner {
		return fmt.Errorf(pre+"cache_owner_id %q, but --kvcr-cache-owner is %q: this engine's KVCR is another owner's", d.CacheOwner, want.CacheOwner)
	}
	if !ownerTopic(d.Topic, d.CacheOwner) {
		return fmt.Errorf(pre+"topic %q is not owner-specific: it must name cache_owner_id %q as its last segment (after '.', '/', ':' or '-'), so no other owner's inventory is taken", d.Topic, d.CacheOwner)
	}
	if d.BlockSize != want.BlockSize {
		return fmt.Errorf(pre+"block_size %d, but this worker's block size is %d (set the engine's --page-size and the worker's --block-size alike)", d.BlockSize, want.BlockSize)
	}
	if want.HashDomain == "" || d.HashDomain != want.HashDomain {
		return fmt.Errorf(pre+"hash_domain %q, but the router matches this engine's blocks in %q", d.HashDomain, want.HashDomain)
	}
	if d.Scope != ScopeProcessLocal {
		return fmt.Errorf(pre+"inventory_scope %q: want %q (only this engine process's blocks may be credited to this worker)", d.Scope, ScopeProcessLocal)
	}
	if len(d.Media) == 0 {
		return fmt.Errorf(pre + "no media listed: the inventory's tiers are unknown")
	}
	for _, m := range d.Media {
		if _, ok := kv.TierFromMedium(m); !ok {
			return fmt.Errorf(pre+"medium %q names no tier kvmesh knows", m)
		}
	}
	if !d.HintForwarding {
		return fmt.Errorf(pre + "kv_hint_forwarding is off: the engine would drop the hints a router sends it (turn on enable_remote_hint)")
	}
	return nil
}

// ownerTopic reports whether topic ends in owner as a whole segment with
// something before it.
func ownerTopic(topic, owner string) bool {
	rest, ok := strings.CutSuffix(topic, owner)
	return ok && rest != "" && strings.ContainsAny(rest[len(rest)-1:], "./:-")
}

// TopicFor is the topic Publisher uses by default for owner.
func TopicFor(owner string) string { return "kvcr-inventory." + owner }
