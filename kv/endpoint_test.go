package kv

import (
	"errors"
	"strings"
	"testing"
)

// TestParseEndpoint is the one endpoint rule's table. "was" notes which of
// the three validators it replaces (discovery's, the hint envelope's,
// transfer's) accepted an input the rule now refuses: those are the
// disagreements that let an endpoint pass one room and fail in the next.
func TestParseEndpoint(t *testing.T) {
	cases := []struct {
		in, want string // want: canonical form, "" for a rejection
		errPart  string
		was      string
	}{
		{in: "tcp://127.0.0.1:23280", want: "tcp://127.0.0.1:23280"},
		{in: "tcp://localhost:1", want: "tcp://localhost:1"},
		{in: "tcp://Worker-3.example.com:65535", want: "tcp://worker-3.example.com:65535"},
		{in: "tcp://host.:80", want: "tcp://host.:80"},
		{in: "tcp://10.0.0.7:0080", want: "tcp://10.0.0.7:80"},
		{in: "tcp://[::1]:5", want: "tcp://[::1]:5"},
		{in: "tcp://[FD00:0:0::1]:5", want: "tcp://[fd00::1]:5"},
		{in: "tcp://[::ffff:10.0.0.1]:5", want: "tcp://[::ffff:10.0.0.1]:5"},

		{in: "tcp://my_host:9000", errPart: "invalid character '_'", was: "discovery, hints"},
		{in: "tcp://[fe80::1%eth0]:9000", errPart: "zones", was: "discovery, transfer"},
		{in: "tcp://224.0.0.1:9000", errPart: "multicast", was: "discovery, hints"},
		{in: "tcp://[ff02::1]:9000", errPart: "multicast", was: "discovery, hints"},
		{in: "tcp://255.255.255.255:9000", errPart: "broadcast", was: "discovery, hints"},
		{in: "tcp://1.2.3:4", errPart: "not an IPv4", was: "discovery, transfer"},
		{in: "tcp://01.2.3.4:5", errPart: "not an IPv4", was: "discovery, transfer"},
		{in: "tcp://123:80", errPart: "not an IPv4", was: "discovery, hints, transfer"},
		{in: "tcp://[10.0.0.1]:5", errPart: "not an IPv6", was: "discovery, transfer"},
		{in: "tcp://u@h:1", errPart: "no path, query, user or spaces", was: "discovery"},
		{in: "tcp://h :1", errPart: "no path, query, user or spaces", was: "discovery"},
		{in: "tcp://10.0.0.7:+80", errPart: "1..65535", was: "discovery"},
		{in: "tcp://h\x00:1", errPart: "no path, query, user or spaces", was: "discovery"},
		{in: "tcp://héllo:1", errPart: "no path, query, user or spaces", was: "discovery"},

		{in: "", errPart: "empty"},
		{in: "tcp://", errPart: "missing port"},
		{in: "10.0.0.7:9000", errPart: "missing tcp://"},
		{in: "udp://10.0.0.7:9000", errPart: `scheme "udp"`},
		{in: "TCP://h:1", errPart: `scheme "TCP"`},
		{in: "tcp://h", errPart: "missing port"},
		{in: "tcp://h:", errPart: "missing port"},
		{in: "tcp://h:0", errPart: "1..65535"},
		{in: "tcp://h:65536", errPart: "1..65535"},
		{in: "tcp://h:123456", errPart: "1..65535"},
		{in: "tcp://h:1x", errPart: "1..65535"},
		{in: "tcp://h:-1", errPart: "1..65535"},
		{in: "tcp://h:1?x", errPart: "no path"},
		{in: "tcp://host:9000/path", errPart: "no path"},
		{in: "tcp://::1:5", errPart: "bracketed"},
		{in: "tcp://[::1]5", errPart: "missing port"},
		{in: "tcp://[::1", errPart: "unterminated"},
		{in: "tcp://[]:5", errPart: "host is empty"},
		{in: "tcp://:9000", errPart: "host is empty"},
		{in: "tcp://[zz]:5", errPart: "not an IPv6"},
		{in: "tcp://0.0.0.0:1", errPart: "wildcard"},
		{in: "tcp://[::]:1", errPart: "wildcard"},
		{in: "tcp://[0:0::0]:1", errPart: "wildcard"},
		{in: "tcp://[::ffff:0.0.0.0]:1", errPart: "wildcard"},
		{in: "tcp://*:9000", errPart: "invalid character '*'"},
		{in: "tcp://a..b:1", errPart: "label"},
		{in: "tcp://a_-:1", errPart: "starts or ends"},
		{in: "tcp://-a:1", errPart: "starts or ends"},
		{in: "tcp://" + strings.Repeat("a", 64) + ".com:1", errPart: "1..63"},
		{in: "tcp://" + strings.Repeat("a.", 130) + "a:1", errPart: "1..253"},
		{in: "tcp://" + strings.Repeat("\x01", 300) + ":1", errPart: "no path"},
	}
	for _, c := range cases {
		ep, err := ParseEndpoint(c.in)
		if c.want != "" {
			if err != nil || ep.String() != c.want {
				t.Errorf("ParseEndpoint(%q) = %q, %v; want %q", c.in, ep, err, c.want)
				continue
			}
			if again, err := ParseEndpoint(ep.String()); err != nil || again != ep {
				t.Errorf("ParseEndpoint(%q) = %+v, %v; the canonical form is not a fixed point", ep, again, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.errPart) {
			t.Errorf("ParseEndpoint(%q) = %+v, %v; want an error containing %q (was accepted by: %s)", c.in, ep, err, c.errPart, c.was)
			continue
		}
		if len(err.Error()) > 200 {
			t.Errorf("error for a %d-byte input is %d bytes: not bounded", len(c.in), len(err.Error()))
		}
		if strings.Contains(c.errPart, "wildcard") != errors.Is(err, ErrWildcardHost) {
			t.Errorf("ParseEndpoint(%q): %v; wraps ErrWildcardHost: %v", c.in, err, errors.Is(err, ErrWildcardHost))
		}
	}
}

func TestNewEndpoint(t *testing.T) {
	cases := []struct {
		host    string
		port    int
		want    string
		errPart string
	}{
		{"10.0.0.7", 23280, "tcp://10.0.0.7:23280", ""},
		{"::1", 9000, "tcp://[::1]:9000", ""},
		{"[::1]", 9000, "tcp://[::1]:9000", ""},
		{"2001:DB8:0:0::1", 1, "tcp://[2001:db8::1]:1", ""},
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
		{" host", 1, "", "spaces"},
		{"bad_host", 1, "", "invalid character"},
		{"[10.0.0.1]", 1, "", "not an IPv6"},
		{"[::1", 1, "", "not an IPv6"},
		{"1:2:3", 1, "", "not an IPv6"},
		{"fe80::1%eth0", 1, "", "zones"},
	}
	for _, c := range cases {
		ep, err := NewEndpoint(c.host, c.port)
		if c.errPart == "" {
			if err != nil || ep.String() != c.want {
				t.Errorf("NewEndpoint(%q, %d) = %q, %v; want %q", c.host, c.port, ep, err, c.want)
			}
			if back, err := ParseEndpoint(ep.String()); err != nil || back != ep {
				t.Errorf("NewEndpoint(%q, %d) = %q does not parse back: %+v, %v", c.host, c.port, ep, back, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.errPart) {
			t.Errorf("NewEndpoint(%q, %d) = %q, %v; want an error containing %q", c.host, c.port, ep, err, c.errPart)
		}
	}
}
