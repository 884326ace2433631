// Package kv is kvmesh's shared vocabulary: tokens, blocks, block hashes,
// tiers, worker keys, KV events, block payloads and the request plane's
// words (GenerateRequest, TokenStream, its errors). Every other package
// speaks it, so it stays small and depends on nothing but a hash function
// and internal/mix.
package kv
