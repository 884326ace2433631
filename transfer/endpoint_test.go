package transfer

import (
	"errors"
	"strings"
	"testing"
)

func TestAdvertiseEndpoint(t *testing.T) {
	cases := []struct {
		host    string
		port    int
		want    string
		errPart string
	}{
		{"10.0.0.7", 23280, "tcp://10.0.0.7:23280", ""},
		{"127.0.0.1", 9000, "tcp://127.0.0.1:9000", ""},
		{"::1", 9000, "tcp://[::1]:9000", ""},
		{"[::1]", 9000, "tcp://[::1]:9000", ""},
		{"2001:DB8:0:0::1", 1, "tcp://[2001:db8::1]:1", ""},
		{"worker-3.example.com", 65535, "tcp://worker-3.example.com:65535", ""},
		{"Worker-3", 80, "tcp://worker-3:80", ""},
		{"localhost", 80, "tcp://localhost:80", ""},
		{"", 9000, "", "empty"},
		{"0.0.0.0", 9000, "", "wildcard"},
		{"::", 9000, "", "wildcard"},
		{"[::]", 9000, "", "wildcard"},
		{"::ffff:0.0.0.0", 9000, "", "wildcard"},
		{"224.0.0.1", 9000, "", "multicast"},
		{"255.255.255.255", 9000, "", "broadcast"},
		{"10.0.0.7", 0, "", "1..65535"},
		{"10.0.0.7", 65536, "", "1..65535"},
		{"10.0.0.7", -1, "", "1..65535"},
		{" host", 1, "", "whitespace"},
		{"bad_host", 1, "", "invalid character"},
		{"-bad", 1, "", "starts or ends"},
		{"a..b", 1, "", "label"},
		{"[10.0.0.1]", 1, "", "not an IPv6"},
		{"[::1", 1, "", "unbalanced"},
		{"1:2:3", 1, "", "neither"},
		{strings.Repeat("a", 64) + ".com", 1, "", "1..63"},
	}
	for _, c := range cases {
		got, err := AdvertiseEndpoint(c.host, c.port)
		if c.errPart == "" {
			if err != nil || got != c.want {
				t.Errorf("AdvertiseEndpoint(%q, %d) = %q, %v; want %q", c.host, c.port, got, err, c.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.errPart) {
			t.Errorf("AdvertiseEndpoint(%q, %d) = %q, %v; want error containing %q", c.host, c.port, got, err, c.errPart)
		}
	}
	if _, err := AdvertiseEndpoint("0.0.0.0", 1); !errors.Is(err, ErrWildcardHost) {
		t.Errorf("wildcard error %v does not wrap ErrWildcardHost", err)
	}
}

func TestParseEndpoint(t *testing.T) {
	cases := []struct {
		in      string
		host    string
		port    int
		errPart string
	}{
		{"tcp://10.0.0.7:23280", "10.0.0.7", 23280, ""},
		{"tcp://[::1]:9000", "::1", 9000, ""},
		{"tcp://[fe80::1%eth0]:9000", "fe80::1%eth0", 9000, ""},
		{"tcp://Host.Example:1", "host.example", 1, ""},
		{"", "", 0, "empty"},
		{"10.0.0.7:9000", "", 0, "missing tcp://"},
		{"udp://10.0.0.7:9000", "", 0, `scheme "udp"`},
		{"tcp://10.0.0.7", "", 0, "missing port"},
		{"tcp://10.0.0.7:", "", 0, "missing port"},
		{"tcp://10.0.0.7:abc", "", 0, "1..65535"},
		{"tcp://10.0.0.7:+80", "", 0, "1..65535"},
		{"tcp://10.0.0.7:70000", "", 0, "1..65535"},
		{"tcp://10.0.0.7:0", "", 0, "1..65535"},
		{"tcp://::1:9000", "", 0, "bracketed"},
		{"tcp://0.0.0.0:9000", "", 0, "wildcard"},
		{"tcp://[::]:9000", "", 0, "wildcard"},
		{"tcp://:9000", "", 0, "empty"},
		{"tcp://host:9000/path", "", 0, "no path"},
		{"tcp://user@host:9000", "", 0, "no path"},
	}
	for _, c := range cases {
		ep, err := ParseEndpoint(c.in)
		if c.errPart == "" {
			if err != nil || ep.Host != c.host || ep.Port != c.port {
				t.Errorf("ParseEndpoint(%q) = %+v, %v; want %s:%d", c.in, ep, err, c.host, c.port)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.errPart) {
			t.Errorf("ParseEndpoint(%q) = %+v, %v; want error containing %q", c.in, ep, err, c.errPart)
		}
	}
	// Round trip: whatever AdvertiseEndpoint emits parses back to itself.
	for _, h := range []string{"10.1.2.3", "::1", "node-a"} {
		s, err := AdvertiseEndpoint(h, 4242)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := ParseEndpoint(s)
		if err != nil || ep.String() != s {
			t.Errorf("round trip %q: %+v %v", s, ep, err)
		}
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
