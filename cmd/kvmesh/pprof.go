package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
)

// pprofEnv names a loopback address on which any kvmesh command serves
// Go's profiler (/debug/pprof/), for measuring a running process (e.g.
// serve's CPU per request, docs/benchmarks.md §9.9). Off when unset; it is
// an environment variable, not a flag, so that every subcommand has it
// without each registering one.
const pprofEnv = "KVMESH_PPROF"

// startPprof serves the profiler on addr; only loopback addresses are
// taken, since the profiler has no authentication.
func startPprof(addr string) (net.Addr, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", pprofEnv, addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%s=%q: a loopback address only (the profiler has no authentication)", pprofEnv, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pprofEnv, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	go http.Serve(ln, mux) //nolint:errcheck // lives as long as the process
	return ln.Addr(), nil
}
