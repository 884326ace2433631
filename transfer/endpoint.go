package transfer

import (
	"fmt"
	"sort"

	"github.com/kvmesh/kvmesh/kv"
)

// AdvertiseEndpoint builds the control endpoint a worker advertises,
// tcp://host:port, under kv's one endpoint rule (kv.NewEndpoint): IP
// literals canonicalised (IPv6 bracketed), hostnames lower-cased, loopback
// allowed (valid on one host only); wildcard (kv.ErrWildcardHost),
// multicast and broadcast addresses and empty hosts are rejected.
func AdvertiseEndpoint(advertiseHost string, port int) (string, error) {
	ep, err := kv.NewEndpoint(advertiseHost, port)
	if err != nil {
		return "", fmt.Errorf("control endpoint advertise host %q port %d: %w", advertiseHost, port, err)
	}
	return ep.String(), nil
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
		if _, err := kv.ParseEndpoint(eps[r]); err != nil {
			return fmt.Errorf("control endpoints: rank %d: %w", r, err)
		}
	}
	return nil
}
