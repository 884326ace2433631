package transfer

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// Scheme is the only control-endpoint scheme kvmesh speaks.
const Scheme = "tcp://"

// Endpoint is a parsed control endpoint.
type Endpoint struct {
	Host string // hostname or canonical IP literal, never bracketed
	Port int
}

// Addr is the host:port form for net.Dial (IPv6 bracketed).
func (e Endpoint) Addr() string { return net.JoinHostPort(e.Host, strconv.Itoa(e.Port)) }

// String is the advertised form, tcp://host:port.
func (e Endpoint) String() string { return Scheme + e.Addr() }

// ErrWildcardHost is wrapped by every error that rejects 0.0.0.0 or ::: a
// peer cannot dial a wildcard, so advertising one would publish an
// undialable source.
var ErrWildcardHost = errors.New("wildcard address is bind-only and cannot be advertised")

// AdvertiseEndpoint builds the control endpoint a worker advertises:
// tcp://host:port. IP literals are canonicalised (IPv6 bracketed), hostnames
// pass through (lower-cased), loopback is allowed (valid on one host only),
// and the wildcard addresses (0.0.0.0, ::) and empty hosts are rejected.
func AdvertiseEndpoint(advertiseHost string, port int) (string, error) {
	host, err := normalizeHost(advertiseHost)
	if err != nil {
		return "", fmt.Errorf("control endpoint advertise host %q: %w", advertiseHost, err)
	}
	if port < 1 || port > 65535 {
		return "", fmt.Errorf("control endpoint port %d: must be in 1..65535", port)
	}
	return Endpoint{Host: host, Port: port}.String(), nil
}

// ParseEndpoint parses and validates tcp://host:port. It applies the same
// host rules as AdvertiseEndpoint, so whatever it accepts is dialable.
func ParseEndpoint(s string) (Endpoint, error) {
	if s == "" {
		return Endpoint{}, errors.New("control endpoint is empty")
	}
	if !strings.HasPrefix(s, Scheme) {
		if i := strings.Index(s, "://"); i >= 0 {
			return Endpoint{}, fmt.Errorf("control endpoint %q: scheme %q unsupported, want tcp://host:port", s, s[:i])
		}
		return Endpoint{}, fmt.Errorf("control endpoint %q: missing tcp:// scheme", s)
	}
	rest := s[len(Scheme):]
	if strings.ContainsAny(rest, "/?#@ \t\r\n") {
		return Endpoint{}, fmt.Errorf("control endpoint %q: want tcp://host:port with no path, query, user or spaces", s)
	}
	hostPart, portPart, err := net.SplitHostPort(rest)
	if err != nil {
		return Endpoint{}, fmt.Errorf("control endpoint %q: %w (IPv6 hosts must be bracketed: tcp://[::1]:9000)", s, err)
	}
	if portPart == "" {
		return Endpoint{}, fmt.Errorf("control endpoint %q: missing port", s)
	}
	port, err := strconv.Atoi(portPart)
	if err != nil || port < 1 || port > 65535 || strings.HasPrefix(portPart, "+") {
		return Endpoint{}, fmt.Errorf("control endpoint %q: port %q must be a number in 1..65535", s, portPart)
	}
	if strings.Contains(hostPart, ":") && !strings.HasPrefix(rest, "[") {
		return Endpoint{}, fmt.Errorf("control endpoint %q: IPv6 host must be bracketed", s)
	}
	host, err := normalizeHost(hostPart)
	if err != nil {
		return Endpoint{}, fmt.Errorf("control endpoint %q: host: %w", s, err)
	}
	return Endpoint{Host: host, Port: port}, nil
}

// normalizeHost validates an advertisable host and returns its canonical
// unbracketed form.
func normalizeHost(h string) (string, error) {
	if h == "" {
		return "", errors.New("host is empty (set an advertise host; 0.0.0.0 and :: are bind-only)")
	}
	if strings.TrimSpace(h) != h {
		return "", errors.New("host has surrounding whitespace")
	}
	if strings.HasPrefix(h, "[") || strings.HasSuffix(h, "]") {
		if !(strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]")) || len(h) < 3 {
			return "", errors.New("unbalanced brackets")
		}
		inner := h[1 : len(h)-1]
		a, err := netip.ParseAddr(inner)
		if err != nil || !a.Is6() {
			return "", fmt.Errorf("brackets hold %q, which is not an IPv6 address", inner)
		}
		h = inner
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.IsUnspecified() || (a.Is4In6() && a.Unmap().IsUnspecified()) {
			return "", fmt.Errorf("%s: %w", a, ErrWildcardHost)
		}
		if a.IsMulticast() {
			return "", fmt.Errorf("%s is a multicast address", a)
		}
		if a.Is4() && a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return "", fmt.Errorf("%s is the broadcast address", a)
		}
		return a.String(), nil
	}
	if strings.Contains(h, ":") {
		return "", fmt.Errorf("%q is neither an IP address nor a hostname", h)
	}
	if err := validHostname(h); err != nil {
		return "", err
	}
	return strings.ToLower(h), nil
}

// validHostname applies RFC 1123 syntax (letters, digits, hyphens; labels of
// 1..63 characters not starting or ending with a hyphen; 253 in all).
func validHostname(h string) error {
	name := strings.TrimSuffix(h, ".")
	if len(name) == 0 || len(name) > 253 {
		return fmt.Errorf("hostname %q: length must be 1..253", h)
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return fmt.Errorf("hostname %q: label %q must be 1..63 characters", h, label)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("hostname %q: label %q starts or ends with '-'", h, label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("hostname %q: invalid character %q", h, c)
			}
		}
	}
	return nil
}

// RankEndpoints builds the control endpoint of every DP rank a worker manages:
// ranks dpStart..dpStart+len(ports)-1 on advertiseHost, keyed by global DP
// rank. It is all or nothing: if any rank cannot be advertised the whole
// call fails, because a half-advertised worker would send peers to an
// undialable or wrong rank.
func RankEndpoints(advertiseHost string, dpStart, dpSize int, ports []int) (map[int]string, error) {
	const why = "peer KV transfer requires advertisable control endpoints for all managed DP ranks"
	if dpStart < 0 {
		return nil, fmt.Errorf("%s: dp start %d is negative", why, dpStart)
	}
	if dpSize <= 0 {
		return nil, fmt.Errorf("%s: dp size %d must be positive", why, dpSize)
	}
	if len(ports) != dpSize {
		return nil, fmt.Errorf("%s: %d control ports for %d DP ranks (want one per rank, local order)", why, len(ports), dpSize)
	}
	seen := make(map[int]int, len(ports))
	out := make(map[int]string, len(ports))
	for i, p := range ports {
		rank := dpStart + i
		if prev, dup := seen[p]; dup {
			return nil, fmt.Errorf("%s: ranks %d and %d share port %d", why, prev, rank, p)
		}
		seen[p] = rank
		ep, err := AdvertiseEndpoint(advertiseHost, p)
		if err != nil {
			return nil, fmt.Errorf("%s: rank %d: %w", why, rank, err)
		}
		out[rank] = ep
	}
	return out, nil
}

// ValidateRankEndpoints checks a registered endpoint map (global DP rank →
// endpoint) for ranks dpStart..dpStart+dpSize-1: either empty (the worker
// can be a hint target but not a source) or one valid endpoint per rank and
// nothing else.
func ValidateRankEndpoints(eps map[int]string, dpStart, dpSize int) error {
	if len(eps) == 0 {
		return nil
	}
	if dpStart < 0 || dpSize <= 0 {
		return fmt.Errorf("control endpoints: invalid DP range start %d size %d", dpStart, dpSize)
	}
	var missing, extra []int
	for r := dpStart; r < dpStart+dpSize; r++ {
		if _, ok := eps[r]; !ok {
			missing = append(missing, r)
		}
	}
	for r := range eps {
		if r < dpStart || r >= dpStart+dpSize {
			extra = append(extra, r)
		}
	}
	sort.Ints(extra)
	if len(missing) > 0 {
		return fmt.Errorf("control endpoints: all DP ranks or none; missing ranks %v", missing)
	}
	if len(extra) > 0 {
		return fmt.Errorf("control endpoints: ranks %v are outside the worker's DP range %d..%d", extra, dpStart, dpStart+dpSize-1)
	}
	for r := dpStart; r < dpStart+dpSize; r++ {
		if _, err := ParseEndpoint(eps[r]); err != nil {
			return fmt.Errorf("control endpoints: rank %d: %w", r, err)
		}
	}
	return nil
}
