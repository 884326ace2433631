// Package kv is kvmesh's shared vocabulary: tokens, blocks and their three
// hash domains (LocalHash, SeqHash, EngineHash: defined types, so a value of
// one domain is never passed for another without a visible conversion),
// tiers, worker keys, KV events, block payloads, roles, finish reasons,
// sampling parameters, typed KV hints, the request plane's words
// (GenerateRequest, TokenStream, its errors) and the one control-endpoint
// rule (ParseEndpoint). Every other package speaks it, so it stays small and
// imports nothing of kvmesh but internal/mix, and nothing outside the
// standard library but its hash function.
package kv
