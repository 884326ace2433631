package kv

import "fmt"

// Role is a worker's part in (dis)aggregated serving. Its string is the wire
// value (the discovery record's "role", the --role flag).
type Role string

const (
	RoleAggregated Role = "aggregated"
	RolePrefill    Role = "prefill"
	RoleDecode     Role = "decode"
)

// Valid reports whether r is a known role (the empty role is not).
func (r Role) Valid() bool {
	return r == RoleAggregated || r == RolePrefill || r == RoleDecode
}

// Norm maps the empty role, which callers use for "not said", to
// RoleAggregated.
func (r Role) Norm() Role {
	if r == "" {
		return RoleAggregated
	}
	return r
}

// ParseRole parses a role's wire value exactly (no case folding or
// trimming: the value travels between processes and must match).
func ParseRole(s string) (Role, error) {
	if r := Role(s); r.Valid() {
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q (want aggregated, prefill or decode)", s)
}

// Leg is a request's part in disaggregated prefill/decode: the whole
// request on one worker, or its prefill or decode leg.
type Leg uint8

const (
	LegWhole   Leg = iota // prefill and decode on one worker
	LegPrefill            // compute the prompt, keep its KV for a decode worker, answer with connector parameters
	LegDecode             // take the prompt's KV through the prefill's connector parameters (recompute on failure), then decode
)

func (l Leg) String() string {
	switch l {
	case LegWhole:
		return "whole"
	case LegPrefill:
		return "prefill"
	case LegDecode:
		return "decode"
	}
	return fmt.Sprintf("leg(%d)", uint8(l))
}
