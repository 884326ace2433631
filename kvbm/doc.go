// Package kvbm is kvmesh's KV block manager: the host (G2), disk (G3) and
// object (G4) tiers behind the engine's device tier (G1), the
// registry and pools that hold blocks there, write-through offload and
// prefix onboarding, and the connector API engines drive it through, in
// two shapes (vLLM's KVConnectorBase_V1 and TensorRT-LLM's
// KvCacheConnectorScheduler/Worker) over one per-request slot state machine.
//
// It is a pure core in the style of engine/sim.Core: it starts no
// goroutines, takes its clock, its storage and the device's bytes as
// injected values, and does work only when its caller calls it. It imports
// kv, clock, internal/u64map (the registries: offload's evictions churn
// them) and the standard library only; in particular it must not import
// engine, worker, router or any network package: engines import it.
//
// # Blocks
//
// A block's identity is its kv.SeqHash (the LoRA and cache salt are already
// mixed into the local-hash seed, so different adapters or tenants never
// share a block). An engine without a request's tokens (the sim replaying
// a trace) gives it by its full blocks' local hashes instead (Request.Len,
// Local). Only full blocks are offloaded or matched. Every block
// moved carries the kv.Checksum of its bytes, computed once when it leaves
// the device and verified each time it is onboarded; a block that fails is
// dropped from its tier, counted, and the load stops at it (the engine
// recomputes from there).
//
// # Tiers, pools and eviction
//
// Each tier is a pool of fixed-size slots over a Storage. A slot is free
// (never used or dropped), active (pinned by a request that is onboarding
// it, or being written) or inactive (registered and evictable). Allocation
// takes a free slot first; only when none is left does it evict the
// inactive block with the lowest priority, and among equals the one
// returned least recently. Registering a hash a pool already holds is
// refused (dedup): the copy is skipped.
//
// # Offload and onboarding
//
// Every block that a forward pass completes is written through to the host
// tier. A host block goes on to disk when the frequency filter admits it
// (its counter doubles on every sighting, starting at 1, and it is admitted
// at ≥ 2; every 600 s all counters drop by one; at most 1M entries), so
// only blocks seen twice within the decay window wear the disk. With a disk
// tier and no host tier ("bypass host"), blocks go from the device straight
// to disk, unfiltered. Onboarding matches a contiguous prefix in host, then
// continues on disk from where host stopped; when the match would cover the
// whole prompt its last block is dropped so the engine computes at least
// one token. With a LoadCost (Connector.SetLoadCost) the connector then
// keeps only the prefix that is quicker to load than to recompute: loading
// k blocks costs the backlog of loads already queued plus each block's
// tier load time, recomputing them k·block size·the engine's prefill cost
// per token; it loads the k that saves the most, none when nothing saves
// time, and releases the rest (Stats.DeclinedLoad). Without a recompute
// cost every match loads. Loads are asynchronous in the connector's shape: the worker
// runs a request's load when it binds the step's metadata and reports it
// in GetFinished's finished-receiving list; the engine schedules the
// request once it is there (vLLM's WAITING_FOR_REMOTE_KVS), so other
// requests compute meanwhile. A peer may read host blocks too: PinHost pins a prefix and
// HostView hands out the arena's bytes while the pin lasts.
//
// # Disk layout and fsync policy
//
// The disk tier is one preallocated file per pool (DiskFile):
//
//	[0, 4096)          file header: "KVMESHG3", version, block bytes, slots, stride, data offset, checksum
//	[4096, …)          slot headers, 64 bytes each: magic, flags, sequence/local/parent hash, payload
//	                   checksum, priority, length, header checksum
//	[dataOff, …)       slot i's payload at dataOff + i·stride, dataOff on a 2 MiB boundary (the gap
//	                   before it stays sparse), stride = block bytes rounded up to 4 KiB
//
// A store writes the payload first and the slot header after it, each with
// one positioned write (pwrite), and never calls fsync: the disk tier is a
// cache, a lost block costs a recompute, and a torn or stale slot is caught
// by its checksums. Close (and Sync) fsyncs the file, so a clean shutdown
// leaves every stored block recoverable. Recovery (Manager.RecoverDisk)
// reopens the same file, scans the slot headers, re-reads every payload and
// verifies its checksum: valid blocks become inactive disk blocks again
// (with Stored events), corrupt ones are dropped and counted.
//
// # Object tier (G4)
//
// The object tier is a pool like the others over any Storage keyed by
// slot; kvbm/blobtier is the one over a gocloud.dev/blob bucket (one
// object per block, named by its sequence hash, the block header before
// its bytes). It sits behind the local tiers as a victim cache: a block
// the last local tier holding it evicts is written there first (so it is
// offloaded once per residency, not on every pass: object writes are slow
// and cost money). Onboarding continues in it from where disk stopped and
// bounces each block through a fresh host slot (verified there, a host
// block from then on), as Dynamo's G4 is always bounced through G2; with
// no host slot to spare it goes straight to the device. RecoverObject
// lists the bucket prefix at start like RecoverDisk scans the pool file.
// A plain Storage is written synchronously inside the call that evicts. An
// AsyncPutter (blobtier.Async) takes the write off that path: the block is
// copied into one of a bounded set of staging buffers the queue owns (so
// the local slot can be reused at once) and put by the storage's own
// goroutines; the object slot stays pinned and unfindable until Settle
// (run first by Offload and Match, and by the engine when the storage
// signals) sees the write completed and verified, and only then is the
// block registered and its Stored event (external tier) emitted. A full
// queue drops the object copy (Stats.DroppedObject) instead of waiting; a
// failed or unverified write frees its slot (FailedObject). The core still
// starts no goroutine: they belong to the storage, which its owner closes.
//
// blobtier registers file://, mem:// and s3:// (any S3-compatible store);
// gs:// is refused by name, its client being too heavy for the binary.
//
// # Events
//
// Every block entering or leaving a tier becomes a kv.Event with that tier
// (host, disk, external for the object tier: medium "EXTERNAL" on the
// wire) through an EventSink, so the router's index sees each tier. Engine hashes in these events are sequence hashes, as the sim
// reports them.
package kvbm
