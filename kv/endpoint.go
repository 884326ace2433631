package kv

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// EndpointScheme is the only control-endpoint scheme kvmesh speaks.
const EndpointScheme = "tcp://"

// Endpoint is a worker's control endpoint, tcp://host:port, as peers dial
// it. The zero value is no endpoint.
type Endpoint struct {
	Host string // lower-case hostname or canonical IP literal, never bracketed
	Port int
}

// Addr is the host:port form for net.Dial (IPv6 bracketed).
func (e Endpoint) Addr() string {
	if strings.IndexByte(e.Host, ':') >= 0 {
		return "[" + e.Host + "]:" + strconv.Itoa(e.Port)
	}
	return e.Host + ":" + strconv.Itoa(e.Port)
}

// String is the canonical advertised form, tcp://host:port. ParseEndpoint
// of it gives e back.
func (e Endpoint) String() string { return EndpointScheme + e.Addr() }

// ErrWildcardHost is wrapped by every error that rejects 0.0.0.0 or ::: a
// peer cannot dial a wildcard, so advertising one would publish an
// undialable source.
var ErrWildcardHost = errors.New("wildcard address is bind-only and cannot be advertised")

// ParseEndpoint is kvmesh's one endpoint rule, used by discovery, hints and
// transfer alike so that whatever one accepts the others can dial:
// tcp://host:port and nothing else (no path, query, user or spaces); the
// host a dialable IP literal (not a wildcard, multicast or broadcast
// address, no IPv6 zone, IPv6 in brackets) or an RFC 1123 hostname (letters,
// digits and hyphens: no underscore); the port 1..65535. IP literals and
// hostnames come back canonical (see Endpoint.String). Errors name the value
// but no field or flag: callers wrap them with the name the operator set.
func ParseEndpoint(s string) (Endpoint, error) {
	if s == "" {
		return Endpoint{}, errors.New("endpoint is empty, want tcp://host:port")
	}
	rest, ok := strings.CutPrefix(s, EndpointScheme)
	if !ok {
		if i := strings.Index(s, "://"); i >= 0 {
			return Endpoint{}, fmt.Errorf("endpoint %s: scheme %s unsupported, want tcp://host:port", quote(s), quote(s[:i]))
		}
		return Endpoint{}, fmt.Errorf("endpoint %s: missing tcp:// scheme", quote(s))
	}
	if i := strings.IndexFunc(rest, func(r rune) bool {
		return r <= ' ' || r == 0x7f || strings.ContainsRune("/?#@", r) || r >= 0x80
	}); i >= 0 {
		return Endpoint{}, fmt.Errorf("endpoint %s: want tcp://host:port with no path, query, user or spaces", quote(s))
	}
	var host, port string
	bracketed := strings.HasPrefix(rest, "[")
	if bracketed {
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			return Endpoint{}, fmt.Errorf("endpoint %s: unterminated IPv6 bracket", quote(s))
		}
		host = rest[1:end]
		after, ok := strings.CutPrefix(rest[end+1:], ":")
		if !ok {
			return Endpoint{}, fmt.Errorf("endpoint %s: missing port", quote(s))
		}
		port = after
	} else {
		switch strings.Count(rest, ":") {
		case 0:
			return Endpoint{}, fmt.Errorf("endpoint %s: missing port", quote(s))
		case 1:
			host, port, _ = strings.Cut(rest, ":")
		default:
			return Endpoint{}, fmt.Errorf("endpoint %s: IPv6 host must be bracketed, as in tcp://[::1]:9000", quote(s))
		}
	}
	if port == "" {
		return Endpoint{}, fmt.Errorf("endpoint %s: missing port", quote(s))
	}
	p, err := parsePort(port)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %s: %w", quote(s), err)
	}
	h, err := endpointHost(host, bracketed)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %s: %w", quote(s), err)
	}
	return Endpoint{Host: h, Port: p}, nil
}

// NewEndpoint builds the endpoint a worker advertises from a host (an IPv6
// literal bracketed or not) and a port, under the same rule as ParseEndpoint.
func NewEndpoint(host string, port int) (Endpoint, error) {
	bracketed := strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") && len(host) >= 2
	if bracketed {
		host = host[1 : len(host)-1]
	}
	if i := strings.IndexFunc(host, func(r rune) bool { return r <= ' ' || r == 0x7f || r >= 0x80 }); i >= 0 {
		return Endpoint{}, fmt.Errorf("host %s: spaces and control characters are not allowed", quote(host))
	}
	h, err := endpointHost(host, bracketed || strings.IndexByte(host, ':') >= 0)
	if err != nil {
		return Endpoint{}, err
	}
	if port < 1 || port > 65535 {
		return Endpoint{}, fmt.Errorf("port %d must be a number in 1..65535", port)
	}
	return Endpoint{Host: h, Port: port}, nil
}

func parsePort(s string) (int, error) {
	bad := fmt.Errorf("port %s must be a number in 1..65535", quote(s))
	if len(s) > 5 {
		return 0, bad
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad
		}
	}
	p, _ := strconv.Atoi(s)
	if p < 1 || p > 65535 {
		return 0, bad
	}
	return p, nil
}

// endpointHost validates a dialable host (v6: it was bracketed, or must be
// an IPv6 literal) and returns its canonical unbracketed form.
func endpointHost(host string, v6 bool) (string, error) {
	if host == "" {
		return "", errors.New("host is empty (0.0.0.0 and :: are bind-only; name the host peers dial)")
	}
	if v6 || isDigitsAndDots(host) {
		a, err := netip.ParseAddr(host)
		switch {
		case err != nil && strings.IndexByte(host, '%') >= 0:
			return "", fmt.Errorf("host %s: IPv6 zones are not allowed", quote(host))
		case v6 && (err != nil || !a.Is6()):
			return "", fmt.Errorf("host %s is not an IPv6 address", quote(host))
		case !v6 && (err != nil || !a.Is4()):
			return "", fmt.Errorf("host %s is not an IPv4 address", quote(host))
		case a.Zone() != "":
			return "", fmt.Errorf("host %s: IPv6 zones are not allowed", quote(host))
		}
		u := a.Unmap()
		switch {
		case u.IsUnspecified():
			return "", fmt.Errorf("host %s: %w", quote(a.String()), ErrWildcardHost)
		case u.IsMulticast():
			return "", fmt.Errorf("host %s is a multicast address", quote(a.String()))
		case u == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			return "", fmt.Errorf("host %s is the broadcast address", quote(a.String()))
		}
		return a.String(), nil
	}
	if err := validHostname(host); err != nil {
		return "", err
	}
	return strings.ToLower(host), nil
}

func isDigitsAndDots(s string) bool {
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '.' {
			return false
		}
	}
	return true
}

// validHostname applies RFC 1123 syntax: dot-separated labels of letters,
// digits and hyphens, 1..63 bytes each, not starting or ending with a
// hyphen, 253 bytes in all (one trailing dot allowed). An underscore is
// refused: resolvers and dialers disagree on it.
func validHostname(h string) error {
	name := strings.TrimSuffix(h, ".")
	if len(name) == 0 || len(name) > 253 {
		return fmt.Errorf("hostname %s: length must be 1..253", quote(h))
	}
	for label := range strings.SplitSeq(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return fmt.Errorf("hostname %s: each label must be 1..63 characters", quote(h))
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("hostname %s: a label starts or ends with '-'", quote(h))
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("hostname %s: invalid character %q", quote(h), c)
			}
		}
	}
	return nil
}

// quote renders a value for an error message, truncated (on the quoted
// length, since escapes expand) so a hostile value cannot blow up logs.
func quote(s string) string {
	const max = 48
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
