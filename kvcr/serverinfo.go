package kvcr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ServerInfoPath is SGLang's server-info endpoint.
const ServerInfoPath = "/get_server_info"

// ServerInfo is what the worker reads of an engine's /get_server_info:
// its topology (SGLang's server args) and the linker's inventory
// descriptor, when the scheduler reports one.
type ServerInfo struct {
	Topology Topology
	// Inventory is nil when the engine reports no linker inventory.
	Inventory *Descriptor
}

// serverInfoWire is the subset of SGLang's answer read here. Context
// parallel has had several names across SGLang versions; any above 1
// counts.
type serverInfoWire struct {
	TP               int             `json:"tp_size"`
	DP               int             `json:"dp_size"`
	PP               int             `json:"pp_size"`
	AttentionDP      bool            `json:"enable_dp_attention"`
	NNodes           int             `json:"nnodes"`
	TokenizerWorkers int             `json:"tokenizer_worker_num"`
	AttnCP           int             `json:"attn_cp_size"`
	CP               int             `json:"cp_size"`
	DCP              int             `json:"dcp_size"`
	Inventory        *Descriptor     `json:"kvcr_inventory"`
	Internal         []internalState `json:"internal_states"`
}

type internalState struct {
	Inventory *Descriptor `json:"kvcr_inventory"`
}

// ParseServerInfo decodes a /get_server_info body. The inventory may sit
// at the top level or in the first scheduler's internal state.
func ParseServerInfo(body []byte) (ServerInfo, error) {
	var w serverInfoWire
	if err := json.Unmarshal(body, &w); err != nil {
		return ServerInfo{}, fmt.Errorf("%s: %w", ServerInfoPath, err)
	}
	si := ServerInfo{Topology: Topology{TP: w.TP, DP: w.DP, PP: w.PP, CP: max(w.AttnCP, w.CP), DCP: w.DCP,
		AttentionDP: w.AttentionDP, NNodes: w.NNodes, TokenizerWorkers: w.TokenizerWorkers}, Inventory: w.Inventory}
	if si.Inventory == nil {
		for _, st := range w.Internal {
			if st.Inventory != nil {
				si.Inventory = st.Inventory
				break
			}
		}
	}
	return si, nil
}

// ErrNoServerInfo: the engine has no /get_server_info (not SGLang).
var ErrNoServerInfo = errors.New("the engine serves no " + ServerInfoPath)

// FetchServerInfo reads baseURL's /get_server_info; ErrNoServerInfo when
// the engine answers 404.
func FetchServerInfo(ctx context.Context, c *http.Client, baseURL string) (ServerInfo, error) {
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(baseURL, "/")+ServerInfoPath, nil)
	if err != nil {
		return ServerInfo{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return ServerInfo{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return ServerInfo{}, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return ServerInfo{}, ErrNoServerInfo
	case resp.StatusCode != http.StatusOK:
		return ServerInfo{}, fmt.Errorf("%s: HTTP %d", ServerInfoPath, resp.StatusCode)
	}
	return ParseServerInfo(body)
}
