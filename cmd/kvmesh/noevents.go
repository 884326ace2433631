package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/fleet"
	"github.com/kvmesh/kvmesh/router"
)

// A real engine started without an event source (vLLM or SGLang without
// --kv-events, TensorRT-LLM with --kv-events off) leaves the KV router
// blind to its cache. Its worker registers no_kv_events; routers in kv
// mode credit it with what they sent it (kv-approx for its picks) and list
// it in /health's warnings and on the dashboard. serve, which sees every
// engine's flags, routes a fleet with no events at all kv-approx outright,
// and stops on an explicit --router-mode kv.

// warnNoEvents is the worker's start-up warning for an engine without events.
func warnNoEvents(log *slog.Logger, kind string) {
	log.Warn(fleet.NoEventsWarning+": this worker relays no KV events, so routers predict its cache from what they send it; give --kv-events for KV-aware routing",
		"engine", kind)
}

// serveRouterMode settles serve's router mode for real engines, given how
// many of them relay no KV events: all of them turns the default kv into
// kv-approx (an explicit --router-mode kv stops, naming --kv-events). It
// returns what the start-up line adds after the mode ("" if nothing).
func serveRouterMode(cmd *cobra.Command, ff *frontendFlags, list []servedEngine) (string, error) {
	blind := 0
	for _, se := range list {
		if se.flags.events == "" {
			blind++
		}
	}
	switch {
	case blind == 0 || ff.routerMode != string(router.ModeKV):
		return "", nil // kv-approx or a mode that reads no cache: as asked
	case blind < len(list):
		return fmt.Sprintf("; kv-approx for the %d engines without KV events", blind), nil
	case cmd.Flags().Changed("router-mode"):
		return "", fmt.Errorf("--router-mode kv: no engine relays KV events; give --kv-events (or --prefill-kv-events and --decode-kv-events), or --router-mode kv-approx")
	}
	ff.routerMode = string(router.ModeKVApprox)
	return ": no KV events from the engines", nil
}
