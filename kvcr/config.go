package kvcr

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/kvmesh/kvmesh/kv"
)

// ExtraConfigOption is the engine option that carries KVCR's settings
// (SGLang's); the worker reads the same JSON from ExtraConfigFlag, and
// errors about a setting name both, since the operator sets it in both.
const (
	ExtraConfigOption = "--hicache-storage-backend-extra-config"
	ExtraConfigFlag   = "--kvcr-extra-config"
)

// LinkerConfig is the part of KVCR's extra config the worker needs; other
// keys are KVCR's own and ignored here.
type LinkerConfig struct {
	// PublishInventory must be on: without it the linker publishes nothing.
	PublishInventory bool `json:"publish_inventory"`
	// AdvertiseHost is the host peers dial for this engine's KVCR control
	// channel: an IP literal or a hostname, no port.
	AdvertiseHost string `json:"advertise_host"`
	// ControlPort is DP rank 0's control port; rank r binds ControlPort+r.
	ControlPort int `json:"control_port"`
	// ServiceSocket must be null: linker mode runs KVCR in the engine
	// process, not behind a KVCR service (Guard) socket.
	ServiceSocket *string `json:"kvcr_service_socket_path"`
}

// ParseLinkerConfig reads KVCR's extra config as SGLang takes it: JSON
// text, or @path of a file holding it; it must be a JSON object.
func ParseLinkerConfig(raw string) (LinkerConfig, error) {
	var c LinkerConfig
	text := strings.TrimSpace(raw)
	if text == "" {
		return c, fmt.Errorf("%s is empty: give KVCR's extra config (the JSON of %s)", ExtraConfigFlag, ExtraConfigOption)
	}
	if path, ok := strings.CutPrefix(text, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("%s: %w", ExtraConfigFlag, err)
		}
		text = strings.TrimSpace(string(b))
	}
	if !strings.HasPrefix(text, "{") {
		return c, fmt.Errorf("%s: want a JSON object, as %s takes", ExtraConfigFlag, ExtraConfigOption)
	}
	if err := json.Unmarshal([]byte(text), &c); err != nil {
		return c, fmt.Errorf("%s: %w", ExtraConfigFlag, err)
	}
	return c, nil
}

// setting names one KVCR setting the way an operator finds it.
func setting(key string) string {
	return fmt.Sprintf("%s in %s (and %s)", key, ExtraConfigOption, ExtraConfigFlag)
}

// Check validates the settings linker inventory depends on.
func (c LinkerConfig) Check() error {
	if !c.PublishInventory {
		return fmt.Errorf("%s is not true: the linker publishes no inventory", setting("publish_inventory"))
	}
	if c.ServiceSocket != nil {
		return fmt.Errorf("%s is %q: linker inventory needs it null (KVCR in the engine process, not behind a service socket)", setting("kvcr_service_socket_path"), *c.ServiceSocket)
	}
	return nil
}

// Endpoints are the control endpoints to advertise for dpSize ranks, rank
// r on ControlPort+r: all of them or an error, never a partial list (a
// router would pick a rank no peer can reach).
func (c LinkerConfig) Endpoints(dpSize int) ([]string, error) {
	if dpSize < 1 {
		return nil, fmt.Errorf("kvcr endpoints: %d DP ranks", dpSize)
	}
	host, err := AdvertiseHost(c.AdvertiseHost)
	if err != nil {
		return nil, err
	}
	if c.ControlPort < 1 || c.ControlPort+dpSize-1 > 65535 {
		return nil, fmt.Errorf("%s is %d: want a port that keeps every one of the %d DP ranks within 1..65535", setting("control_port"), c.ControlPort, dpSize)
	}
	out := make([]string, dpSize)
	for r := range dpSize {
		ep, err := kv.NewEndpoint(host, c.ControlPort+r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", setting("advertise_host"), err)
		}
		out[r] = ep.String()
	}
	return out, nil
}

// AdvertiseHost checks advertise_host and returns it canonical (IPv6
// bracketed). It refuses an empty host, a wildcard (0.0.0.0, ::), a host
// that carries a port and an IPv6 address with a port but no brackets;
// every error names the setting the operator fixes.
func AdvertiseHost(h string) (string, error) {
	h = strings.TrimSpace(h)
	if h == "" {
		return "", fmt.Errorf("%s is not set: give the address peers dial for this engine's KVCR control channel", setting("advertise_host"))
	}
	if strings.HasPrefix(h, "[") {
		if inner, ok := strings.CutSuffix(h[1:], "]"); ok {
			h = inner
		} else {
			return "", fmt.Errorf("%s %q carries a port or an unclosed bracket: give the address alone ([v6] or v6 without a port); the port is control_port", setting("advertise_host"), h)
		}
	}
	if ip := net.ParseIP(h); ip == nil {
		switch n := strings.Count(h, ":"); {
		case n == 1:
			return "", fmt.Errorf("%s %q carries a port: give the host alone; the port is control_port", setting("advertise_host"), h)
		case n > 1:
			return "", fmt.Errorf("%s %q is not an IPv6 address (an IPv6 address with a port must be bracketed, [addr]:port, and advertise_host takes no port)", setting("advertise_host"), h)
		}
	}
	ep, err := kv.NewEndpoint(h, 1)
	if err != nil {
		if errors.Is(err, kv.ErrWildcardHost) {
			return "", fmt.Errorf("%s %q is a wildcard, which no peer can dial: give this host's reachable address", setting("advertise_host"), h)
		}
		return "", fmt.Errorf("%s: %w", setting("advertise_host"), err)
	}
	return ep.Host, nil
}
