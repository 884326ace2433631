// Package transfer moves KV blocks between peer workers: a control-endpoint
// server that serves a BlockSource, a client that fetches from it, and the
// helpers workers use to advertise and validate their endpoints.
//
// A transfer is destination-initiated, as in KVCR: the router's hint names a
// source endpoint and an ordered list of sequence hashes (the engine's hash
// domain, uint64); the target connects and asks; the source pins what it
// holds and sends the longest contiguous available prefix, then says done,
// then releases the pin. Unlike KVCR every block carries an XXH3 checksum of
// its payload, and the target may also verify the bytes themselves.
//
// # Wire protocol, version 1
//
// Plain TCP; the client connects to tcp://host:port. A connection carries
// one fetch at a time and may carry many in sequence (clients pool them).
// Everything is little-endian. Every frame starts with a 12-byte header:
//
//	off size field
//	0   2    magic "KT"
//	2   1    version (1)
//	3   1    type: 1 fetch, 2 block, 3 done, 4 refuse, 8 release
//	         (5-7: authentication, below)
//	4   4    op: operation id chosen by the client, echoed by the source
//	8   4    length: payload bytes that follow
//
// fetch (target → source), length = 14 + digest_len + 8·count (+ 8 with
// the domain flag):
//
//	u32 timeout_ms   remaining operation time, > 0
//	u32 flags        bit 0: a salt domain follows the hashes; any other bit
//	                 is refused
//	u16 digest_len   ≤ 255, then digest_len bytes of compatibility digest
//	u32 count        1..65536, then count × u64 sequence hashes
//	u64 domain       only with flag bit 0: the salt domain (kv.Seed of the
//	                 request's LoRA and cache salt); without it the domain
//	                 is kv.BaseSeed (no LoRA, no salt)
//
// A source that knows each block's domain (BlockDomainer) serves only the
// prefix of blocks stored in the fetch's domain; a block of another domain
// ends the prefix as if the source did not hold it (counted in
// kvmesh_transfer_refused_total{reason="salt_domain"}). So a target never
// reads blocks of another tenant's salt, even naming their exact hashes. A
// source that cannot tell domains serves by hash alone. Old sources refuse
// the flag (bad_request): the target then recomputes, it never crosses.
//
// block (source → target), one per delivered block, in request order from
// index 0 with no gaps; length = 20 + payload size (same for every block):
//
//	u32 index, u64 hash (= the request's hash at index), u64 checksum
//	(kv.Checksum, XXH3-64 of the payload), payload (all layers concatenated)
//
// done (source → target) ends a served fetch; refuse (source → target) ends
// a fetch that was not served. Both share one layout, frozen across
// versions so a source can refuse a version it does not speak:
//
//	u32 completed    blocks sent (done) / 0 (refuse)
//	u8  success      1 if every pinned block was sent
//	u8  code         ok, not_found, digest_mismatch, bad_request,
//	                 unsupported_version, busy, timeout, source_error, shutdown,
//	                 unauthenticated
//	u16 msg_len      ≤ 1024, then a human-readable reason
//
// Exchanges: fetch → block* done, or fetch → refuse. A fetch whose digest is
// non-empty and differs from the source's is refused (digest_mismatch). A
// source holding none of the blocks answers done{0, false, not_found}; a
// source holding the first k answers k blocks then done{k, true}. A source
// that fails to read block j answers done{j, false, source_error} after
// blocks 0..j-1. A version mismatch, a malformed frame or a frame of any
// type but fetch is refused and the connection closed; frames larger than
// the limits (request 512 KiB + 277 bytes, status 1032 bytes, block
// MaxBlockBytes) are refused before anything is allocated for them. A peer
// that does not send the magic is disconnected silently. Connections past
// Server.MaxConns get refuse{busy} and are closed.
//
// # Release
//
// release (target → source), length = 2 + id_len: u16 id_len (1..255), then
// the handoff id (a disaggregated prefill answer's request id). The decode
// side sends it when it is done with a prefill answer's pinned blocks: it
// read them, failed to, or already held them and needed none. A source
// that pins handoffs (HandoffReleaser) unpins at once and answers
// done{0, true, ok}, or done{0, false, not_found} when it pins nothing by
// that id (already read, released or expired); the connection stays
// usable. A source that pins no handoffs answers refuse{bad_request} and
// keeps the connection. A source older than this frame refuses it as an
// unexpected frame (bad_request) and closes the connection: the release is
// advisory, so the target only counts the failure and the source's own
// expiry (the handoff TTL) frees the pin as before. A release frame longer
// than 257 bytes, or whose id does not fill it exactly, is refused and the
// connection closed. Any peer that may fetch may release (the fleet token
// authenticates both); it can only free a pin early, never read a block.
//
// # Authentication
//
// A source configured with a fleet token (Server.Token, `--fleet-token-file`)
// reads nothing from a new connection but this handshake; a client with the
// same token (ClientOptions.Token) runs it right after connecting. The
// frames use the common header (op 0) and three more types:
//
//	hello     (5, target → source) length 16: u8[16] client nonce cn
//	challenge (6, source → target) length 48: u8[16] source nonce sn,
//	          u8[32] HMAC-SHA256(token, "kvmesh transfer v1 source" ‖ cn ‖ sn)
//	auth      (7, target → source) length 32:
//	          u8[32] HMAC-SHA256(token, "kvmesh transfer v1 target" ‖ cn ‖ sn)
//
// Nonces are fresh random bytes per connection, so a recorded handshake
// cannot be replayed, and each side proves it holds the token without
// sending it. The target checks the source's proof before it sends its own
// (a target never shows block hashes to a source without the token). A
// first frame other than a hello, a wrong proof, or no auth within 5 s gets
// refuse{unauthenticated (9)} and the connection is closed before any fetch
// is read; the refusal is counted in kvmesh_transfer_refused_total
// {reason="unauthenticated"} and logged once per peer host. A source
// without a token refuses a hello like any unexpected frame (bad_request).
// The token authenticates; it does not encrypt: block bytes still cross
// the network in the clear.
//
// # Sources
//
// A BlockSource pins and reads blocks (Layered adapts one that reads layer
// by layer, like engine/sim). Optional extensions make serving cheaper:
// BlockViewer hands out pinned payloads without a copy (the server sends
// them with writev, one call per response of up to 64 MiB / 2048 blocks;
// a copying source is staged in 2 MiB writes), and BlockChecksummer
// supplies checksums taken when the blocks were stored, so the server does
// not hash every payload and a block that rotted at the source fails the
// target's check. worker.SimSource serves engine/sim this way: a sim
// block's layers are contiguous in its slab, a pin keeps them from being
// evicted or rewritten, and their checksum is taken when the block is
// computed or inserted. Server.MaxActive bounds fetches served at once
// (others wait for a slot until their deadline, then get refuse{busy}).
//
// # Deadlines
//
// The client's deadline is its operation timeout (default 1 s) or its
// context's deadline, whichever is earlier; it sends the remaining time and
// the source stops at receipt + min(that, MaxOpTimeout), answering
// done{k, false, timeout}. On the client the deadline is absolute: a done
// that arrives after it is a failure, never a success, and a timed-out or
// cancelled fetch delivers no blocks. A connection refused by the peer
// fails at once (OutcomeUnreachable), with no wait for the deadline.
//
// # Results
//
// FetchResult.Blocks is always a verified contiguous prefix of the request.
// A block whose checksum (or Verify callback) fails cuts the prefix before
// it (OutcomeCorrupt); a broken connection keeps what verified before it.
// A response of 1 MiB or more is verified by a second goroutine trailing
// the socket reads (loopback TCP runs markedly faster when the reader goes
// straight back to the socket than when it hashes between reads); Verify
// is still called once per block, in order, never concurrently, and a bad
// block still cuts the prefix and ends the fetch.
// Success means the source delivered its whole available prefix in time:
// a shorter prefix than requested is success with OutcomePartial.
// Payloads are received in place, in chunks that grow with the response
// (never sized from a declared length); FetchRequest.Buffer lets a caller
// receive into memory it reuses, and FetchResult.Release recycles the
// client's own chunks once the caller is done with the payloads.
//
// # Metrics
//
// kvmesh_transfer_duration_seconds{scope,result}, kvmesh_transfer_bytes_total
// {operation}, kvmesh_transfer_blocks_total{operation} and
// kvmesh_transfer_in_flight{operation}, scope/operation ∈ {fetch, serve},
// result ∈ Outcome names. Labels never hold endpoints or hashes.
//
// It imports only kv: the worker and the mock engines serve and fetch
// through it; it must not import them.
package transfer
