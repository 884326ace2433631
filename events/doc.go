// Package events speaks vLLM's KV-event wire in both directions.
//
// The wire is a ZMQ PUB stream of three-frame messages: topic, an 8-byte
// big-endian sequence number (0, 1, 2, … per batch) and a msgpack
// EventBatch [ts, events, data_parallel_rank]. Events are BlockStored,
// BlockRemoved and AllBlocksCleared, encoded either positionally (tag first)
// or as maps tagged by "type". A ROUTER socket replays buffered batches:
// a request [identity, "", start_seq] gets every buffered (seq, payload)
// with seq ≥ start, then the end marker seq = -1 with an empty payload.
//
// Publisher turns kv events (from engine/sim) into that wire, byte for byte
// as vLLM does. Subscriber consumes real vLLM and SGLang publishers: it
// accepts every shape seen in the field, repairs sequence gaps through the
// replay socket, recomputes local hashes from token ids and hands kv events
// to a callback. Bad input is logged, counted and skipped; it never panics.
//
// It imports only kv: it must not import the event plane (eventplane), the
// worker or the router, which use it.
package events
