// Package fleet is kvmesh's live backend. It owns one instance table, fed
// by discovery, that drives the router's worker set, each model's event
// feed (which fills the router's index) and the gRPC client pool; load
// reports feed the router's busy thresholds, and replica sync shares load
// bookings with other frontend replicas. Its request path routes a
// tokenized request, calls the chosen worker over gRPC and streams the
// tokens back, telling a lost worker (kv.ErrWorkerLost: migrate, and the
// router inhibits it) from a rejected request (kv.ErrRejected). A model
// with prefill and decode workers is served prefill first (disagg.go): a
// KV-routed, hinted prefill leg whose connector parameters become, whole,
// the decode leg's, routed by load, unless conditional disaggregation keeps
// the prefill on the decode worker.
//
// It speaks the request plane's vocabulary of package kv (GenerateRequest,
// TokenStream), so the HTTP frontend can use it through its own Backend
// interface; it must not import frontend (or anything HTTP), and nothing
// below it (router, index, discovery, eventplane, workerclient) may import it.
package fleet
