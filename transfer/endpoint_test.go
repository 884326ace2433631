package transfer

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/kv"
)

// The host rule itself is kv.ParseEndpoint's table; here, that the
// advertised form is canonical and errors name the host the operator set.
func TestAdvertiseEndpoint(t *testing.T) {
	for host, want := range map[string]string{
		"10.0.0.7":        "tcp://10.0.0.7:23280",
		"[::1]":           "tcp://[::1]:23280",
		"2001:DB8:0:0::1": "tcp://[2001:db8::1]:23280",
		"Worker-3":        "tcp://worker-3:23280",
	} {
		if got, err := AdvertiseEndpoint(host, 23280); err != nil || got != want {
			t.Errorf("AdvertiseEndpoint(%q) = %q, %v; want %q", host, got, err, want)
		}
	}
	_, err := AdvertiseEndpoint("0.0.0.0", 1)
	if !errors.Is(err, kv.ErrWildcardHost) || !strings.Contains(err.Error(), `advertise host "0.0.0.0"`) {
		t.Errorf("wildcard: %v; want it to wrap kv.ErrWildcardHost and name the host", err)
	}
	if _, err := AdvertiseEndpoint("bad_host", 1); err == nil || !strings.Contains(err.Error(), "invalid character '_'") {
		t.Errorf("underscore host: %v", err)
	}
}

func TestRankEndpoints(t *testing.T) {
	got, err := RankEndpoints("::1", 2, 2, []int{9000, 9001})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[2] != "tcp://[::1]:9000" || got[3] != "tcp://[::1]:9001" {
		t.Fatalf("RankEndpoints = %v", got)
	}
	if err := ValidateRankEndpoints(got, 2, 2); err != nil {
		t.Fatalf("ValidateRankEndpoints(own output) = %v", err)
	}
	bad := []struct {
		host    string
		start   int
		size    int
		ports   []int
		errPart string
	}{
		{"10.0.0.1", 0, 2, []int{9000}, "1 control ports for 2 DP ranks"},
		{"10.0.0.1", 0, 2, []int{9000, 9000}, "share port"},
		{"10.0.0.1", 0, 2, []int{9000, 0}, "rank 1"},
		{"0.0.0.0", 0, 1, []int{9000}, "wildcard"},
		{"10.0.0.1", -1, 1, []int{9000}, "negative"},
		{"10.0.0.1", 0, 0, nil, "must be positive"},
	}
	for _, c := range bad {
		m, err := RankEndpoints(c.host, c.start, c.size, c.ports)
		if err == nil || m != nil || !strings.Contains(err.Error(), c.errPart) ||
			!strings.Contains(err.Error(), "all managed DP ranks") {
			t.Errorf("RankEndpoints(%q,%d,%d,%v) = %v, %v; want error containing %q", c.host, c.start, c.size, c.ports, m, err, c.errPart)
		}
	}
}

func TestValidateRankEndpoints(t *testing.T) {
	if err := ValidateRankEndpoints(nil, 0, 4); err != nil {
		t.Errorf("none must be valid: %v", err)
	}
	cases := []struct {
		eps     map[int]string
		errPart string
	}{
		{map[int]string{0: "tcp://a:1"}, "missing ranks [1]"},
		{map[int]string{0: "tcp://a:1", 1: "tcp://a:2", 5: "tcp://a:3"}, "outside"},
		{map[int]string{0: "tcp://a:1", 1: "tcp://0.0.0.0:2"}, "rank 1"},
		{map[int]string{0: "tcp://a:1", 1: ""}, "rank 1"},
	}
	for _, c := range cases {
		if err := ValidateRankEndpoints(c.eps, 0, 2); err == nil || !strings.Contains(err.Error(), c.errPart) {
			t.Errorf("ValidateRankEndpoints(%v) = %v; want error containing %q", c.eps, err, c.errPart)
		}
	}
}
