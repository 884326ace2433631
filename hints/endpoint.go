package hints

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ParseEndpoint validates a peer control endpoint of the form tcp://host:port
// and returns its canonical spelling (IP literals canonicalised, IPv6
// bracketed, port without leading zeros). Hostnames pass through unchanged.
// Rejected: anything but the tcp scheme, a missing host or port, a port
// outside 1..65535, an unbracketed IPv6 literal, an IPv6 zone, and the
// wildcard addresses 0.0.0.0 and :: (a peer cannot dial them).
// The error text names no field; callers prefix their own path.
func ParseEndpoint(s string) (string, error) {
	if s == "" {
		return "", errors.New("must be a non-empty tcp://host:port endpoint")
	}
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return "", fmt.Errorf("must be a tcp://host:port endpoint, got %s", quote(s))
	}
	if i := strings.IndexAny(rest, "/?#@ \t\r\n"); i >= 0 {
		return "", fmt.Errorf("must be tcp://host:port with nothing else, got %s", quote(s))
	}
	var host, port string
	v6 := false
	if strings.HasPrefix(rest, "[") {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return "", fmt.Errorf("unterminated IPv6 bracket in %s", quote(s))
		}
		host, v6 = rest[1:end], true
		after := rest[end+1:]
		if !strings.HasPrefix(after, ":") {
			return "", fmt.Errorf("missing port in %s", quote(s))
		}
		port = after[1:]
	} else {
		switch strings.Count(rest, ":") {
		case 0:
			return "", fmt.Errorf("missing port in %s", quote(s))
		case 1:
			host, port, _ = strings.Cut(rest, ":")
		default:
			return "", fmt.Errorf("IPv6 host must be bracketed as tcp://[addr]:port, got %s", quote(s))
		}
	}
	if host == "" {
		return "", fmt.Errorf("missing host in %s", quote(s))
	}
	p, err := parsePort(port)
	if err != nil {
		return "", fmt.Errorf("port must be an integer in [1, 65535], got %s", quote(port))
	}
	canon, err := canonicalHost(host, v6)
	if err != nil {
		return "", fmt.Errorf("%v in %s", err, quote(s))
	}
	return "tcp://" + canon + ":" + strconv.Itoa(p), nil
}

func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 {
		return 0, errors.New("bad port")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, errors.New("bad port")
		}
	}
	p, _ := strconv.Atoi(s)
	if p < 1 || p > 65535 {
		return 0, errors.New("bad port")
	}
	return p, nil
}

// canonicalHost validates host (the bracket content when v6) and returns it
// ready to place before ":port".
func canonicalHost(host string, v6 bool) (string, error) {
	if v6 {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() {
			return "", fmt.Errorf("invalid IPv6 address %s", quote(host))
		}
		if a.Zone() != "" {
			return "", errors.New("IPv6 zone not allowed")
		}
		if a.IsUnspecified() || a.Unmap().IsUnspecified() {
			return "", fmt.Errorf("wildcard host %s is not dialable", quote(host))
		}
		return "[" + a.String() + "]", nil
	}
	if isDigitsAndDots(host) {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is4() {
			return "", fmt.Errorf("invalid IPv4 address %s", quote(host))
		}
		if a.IsUnspecified() {
			return "", fmt.Errorf("wildcard host %s is not dialable", quote(host))
		}
		return a.String(), nil
	}
	if !validHostname(host) {
		return "", fmt.Errorf("invalid hostname %s", quote(host))
	}
	return host, nil
}

func isDigitsAndDots(s string) bool {
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '.' {
			return false
		}
	}
	return true
}

// validHostname accepts RFC 1123 names: dot-separated labels of letters,
// digits and hyphens (underscore tolerated, as in container names), 1..63
// bytes each, not starting or ending with a hyphen, 253 bytes at most.
func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// quote renders a string for an error message, truncated (on the quoted
// length, since escapes expand) so a hostile value cannot blow up logs.
func quote(s string) string {
	const max = 72
	q := strconv.Quote(s)
	if len(q) <= max {
		return q
	}
	n := min(len(s), max)
	for n > 0 && len(strconv.Quote(s[:n])) > max {
		n--
	}
	return strconv.Quote(s[:n]) + "…"
}
