// Package attack is kvmesh's attacker suite: each test is a probe an
// outsider on the same host ran against a fleet (issue 23), written so it
// failed on the code before the fix and passes after. It runs the real
// binary and speaks only loopback.
//
// controlplane_test.go probes what travels between kvmesh processes: the
// embedded NATS server (a client without credentials; a worker identity
// touching another worker's discovery record or event subject), forged
// discovery records (a fake worker must get neither traffic nor a
// reusable secret), a forged event batch (one dump, not endless repairs),
// and the worker and transfer ports of `serve`'s in-process workers.
// frontdoor_test.go probes the OpenAI API. docs/security.md states the
// threat model and the results.
//
// The tests build no credential with kvmesh's own helpers where a
// stranger would not have them: NATS identities are derived here from the
// documented construction (docs/security.md), so the suite checks the
// wire, not the library against itself.
package attack
