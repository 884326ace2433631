package kv

import (
	"encoding/json"
	"testing"
)

func TestParseRole(t *testing.T) {
	for _, r := range []Role{RoleAggregated, RolePrefill, RoleDecode} {
		if got, err := ParseRole(string(r)); err != nil || got != r {
			t.Errorf("ParseRole(%q) = %q, %v", r, got, err)
		}
	}
	for _, s := range []string{"", "Prefill", " decode", "x"} {
		if _, err := ParseRole(s); err == nil || err.Error() != `unknown role "`+s+`" (want aggregated, prefill or decode)` {
			t.Errorf("ParseRole(%q): %v", s, err)
		}
	}
	if Role("").Norm() != RoleAggregated || RoleDecode.Norm() != RoleDecode {
		t.Error("Norm")
	}
	// The discovery record carries the role as its plain string.
	b, _ := json.Marshal(struct{ R Role }{RolePrefill})
	if string(b) != `{"R":"prefill"}` {
		t.Errorf("JSON %s", b)
	}
}
