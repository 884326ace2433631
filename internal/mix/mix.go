// Package mix owns kvmesh's one 64-bit mixer, splitmix64, from which the
// deterministic streams (trace tokens, simulated KV payloads, request seeds,
// the sim's model) and the index's table hashes are built. Everything here
// must stay inlinable and allocation-free: it runs per token and per block.
// It imports nothing.
package mix

// Golden is splitmix64's stream increment, 2^64/φ: odd, so multiplying by
// it is a bijection that spreads small keys over all 64 bits.
const Golden = 0x9E3779B97F4A7C15

// Mix64 is splitmix64's finaliser: a bijection of uint64 in which every
// input bit affects every output bit.
func Mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Next advances the splitmix64 stream whose state is *x and returns its
// next value.
func Next(x *uint64) uint64 {
	*x += Golden
	return Mix64(*x)
}
