// Package workerclient owns the router side's gRPC connections to workers:
// Pool, one connection per instance redialled when its address changes,
// and Repairer, which fetches event ranges and dumps for the event feed
// over the worker API.
//
// It must not import eventplane (it satisfies eventplane.Repairer without
// naming it), router, index or natsbus; it builds on discovery, api and kv.
package workerclient
