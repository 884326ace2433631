// Package sidecar is the Go half of kvmesh's KV block manager inside a
// real engine (vLLM, TensorRT-LLM): the engine loads the Python package
// kvmesh_kvbm (python/ in the repository), whose scheduler side forwards
// every connector call here and whose worker side copies KV blocks between
// the engine's device tensors and a shared-memory arena this server owns.
// Matching, slots, offload decisions, eviction, the tiers, checksums,
// recovery and KV events stay in package kvbm, driven through its
// connector leaders exactly as the simulated engine drives them.
//
// # Wire
//
// One Unix socket (mode 0600; peers of another uid are refused). Each
// connection says hello, then sends one request frame at a time and reads
// one reply. A frame is an 8-byte header and a JSON payload:
//
//	[0:2]  "KB"
//	[2]    wire version (Version)
//	[3]    kind: 1 request, 2 reply, 3 error
//	[4:8]  payload length, big-endian uint32 (≤ MaxPayload)
//	[8:]   payload: a JSON object
//
// A request's payload has "op" and that op's fields; a reply carries the
// op's result, an error frame {"code", "error"}. A header that is out of
// step (bad magic, version or length) is answered with an error frame and
// the connection closed; a bad payload, an unknown op or a refused call is
// answered with an error frame and the connection stays. The ops, in the
// order the engines call them (docs/engines.md has the full field list):
//
//	hello        {shape: vllm|trtllm, role}          → {version, registered, block_size, arena}
//	register     {block_bytes, block_size, device_blocks, piece_bytes, staging_align} (worker)
//	                                                  → {arena, arena_bytes, block_bytes, host_slots,
//	                                                     staging_offset, staging_slots, piece_bytes}
//	match        {req: {id, tokens, lora, salt, priority, generation_only}, num_computed}
//	                                                  → {tokens, async}
//	alloc        {id, block_ids, num_external (vllm) | context_position (trtllm)} → {}
//	build        {new: [...], cached: [...], num_scheduled: {id: n}} → {iteration, loads, stores}
//	finished     {id, block_ids}                     → {delay}
//	bind         {iteration} (worker)                → {loads, stores: [{req, device, slots}], load_errors}
//	saved        {iteration} (worker)                → {}
//	get_finished {} (worker)                         → {sending, recving}
//	stats        {slot}                              → {registered, stats, protocol_errors, staging_dropped, slots, slot}
//
// # The arena
//
// The engine's worker registers its KV cache's block bytes (and, optionally,
// how a block splits into pieces: piece_bytes); the server then creates the
// arena file in /dev/shm (mode 0600, exclusively, removed at Close): a
// header, the host tier's slots from offset 4096, then the staging slots,
// staging_align bytes past a page boundary (arena.go has the layout), each
// a whole block (version 1) or, with piece_bytes, piece by piece (version
// 2). A bound step's device blocks are each given a staging
// slot: a load's block is read from its tier into the slot and verified
// before bind answers, and the engine's worker copies it onto the device; a
// store's block is copied by the engine's worker into its slot after the
// forward pass (saved), and get_finished writes it through to the tiers,
// checksummed. A step that needs more staging slots than there are drops
// the excess (loads become load errors the engine recomputes; stores stay
// uncached), counted as staging_dropped.
package sidecar
