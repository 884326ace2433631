// Package kvcr is the worker's side of KVCR linker inventory (SGLang's
// unified-cache external linker with the kvcr backend): it validates what
// the linker reports (descriptor.go) and what the operator configured for
// it (config.go), derives the peer endpoints to advertise, all or none,
// refuses engine topologies the inventory cannot describe (topology.go),
// reads the engine's own account of both (serverinfo.go), and runs the
// state agent (agent.go) that subscribes to the linker's inventory events
// and owns them under the linker's stable cache-owner id, so an engine
// restart replaces the worker's KVCR holdings instead of orphaning or
// duplicating them. Publisher (publisher.go) speaks the linker's side for
// tests and the mock engines.
//
// It imports kv, engine (for EventSink) and events; it must not import
// worker, fleet, router, index, discovery or frontend: the worker takes
// the agent as one more event source and the endpoints as configuration.
package kvcr
