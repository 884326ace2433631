package main

import (
	"fmt"
	"net"
	"strconv"
)

// listenHTTP binds the frontend's --listen address.
func listenHTTP(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--listen %s: %w", addr, err)
	}
	return ln, nil
}

// parseNATSListen reads serve's --nats-listen HOST:PORT.
func parseNATSListen(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("--nats-listen %q: want HOST:PORT: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", 0, fmt.Errorf("--nats-listen %q: port %q, want 0 to 65535", addr, port)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, p, nil
}
