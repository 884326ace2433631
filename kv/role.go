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
