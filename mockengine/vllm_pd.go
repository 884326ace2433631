package mockengine

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/sim"
	"github.com/kvmesh/kvmesh/kv"
	"github.com/kvmesh/kvmesh/transfer"
)

// decodeParams is a usable do_remote_prefill handoff: the prefill
// response's kv_transfer_params as vLLM's decode side reads them.
type decodeParams struct {
	engineID  string
	requestID string
	host      string
	port      int
	blockIDs  []int64 // group 0 (the sim has one KV-cache group)
}

// pullState is one decode request's handoff, looked up by the sim's
// Fetcher under the request's id.
type pullState struct {
	p         decodeParams
	attempted atomic.Bool
	notified  atomic.Bool
}

// prefillParams is the prefill response's top-level kv_transfer_params, in
// the order and with the fields of vLLM's pull-mode NixlConnector
// (request_finished). remote_blocks_expiry_time is null on a prefill node.
type prefillParams struct {
	DoRemotePrefill        bool      `json:"do_remote_prefill"`
	DoRemoteDecode         bool      `json:"do_remote_decode"`
	RemoteBlockIDs         [][]int32 `json:"remote_block_ids"`
	RemoteEngineID         string    `json:"remote_engine_id"`
	RemoteRequestID        string    `json:"remote_request_id"`
	RemoteHost             string    `json:"remote_host"`
	RemotePort             int       `json:"remote_port"`
	TPSize                 int       `json:"tp_size"`
	DCPSize                int       `json:"dcp_size"`
	PPSize                 int       `json:"pp_size"`
	RemoteNumTokens        int       `json:"remote_num_tokens"`
	RemoteBlocksExpiryTime *float64  `json:"remote_blocks_expiry_time"`
	TransferMode           string    `json:"transfer_mode"`
}

// connectorParams reads kv_transfer_params for the NixlConnector: a
// prefill leg (do_remote_decode) or a decode leg's handoff. A handoff that
// lacks remote_block_ids or any of remote_engine_id, remote_request_id,
// remote_host, remote_port is not pulled (vLLM warns and computes).
func (v *VLLM) connectorParams(j *job, params map[string]json.RawMessage) *APIError {
	var flag = func(k string) (bool, *APIError) {
		raw, ok := params[k]
		if !ok || isNull(raw) {
			return false, nil
		}
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return false, badRequest("kv_transfer_params."+k+" must be a boolean", "kv_transfer_params")
		}
		return b, nil
	}
	dec, ae := flag("do_remote_decode")
	if ae != nil {
		return ae
	}
	pre, ae := flag("do_remote_prefill")
	if ae != nil {
		return ae
	}
	j.prefill = dec
	if !pre {
		return nil
	}
	var p decodeParams
	str := func(k string, dst *string) bool {
		raw, ok := params[k]
		return ok && !isNull(raw) && json.Unmarshal(raw, dst) == nil && *dst != ""
	}
	okFields := str("remote_engine_id", &p.engineID) && str("remote_request_id", &p.requestID) &&
		str("remote_host", &p.host)
	if raw, ok := params["remote_port"]; !ok || json.Unmarshal(raw, &p.port) != nil || p.port <= 0 || p.port > 65535 {
		okFields = false
	}
	ids, idsOK := blockIDs(params["remote_block_ids"])
	if !okFields || !idsOK {
		v.log.Warn("kv_transfer_params without a usable handoff; computing the prompt", "request", j.internalID)
		return nil
	}
	p.blockIDs = ids
	j.decode = &p
	return nil
}

// blockIDs reads remote_block_ids: a list of lists (one per KV-cache group,
// current vLLM; group 0 is used) or a flat list (older vLLM). ok is false
// when absent, empty or malformed.
func blockIDs(raw json.RawMessage) ([]int64, bool) {
	if isNull(raw) {
		return nil, false
	}
	var groups [][]int64
	if json.Unmarshal(raw, &groups) == nil {
		if len(groups) == 0 {
			return nil, false
		}
		return groups[0], true
	}
	var flat []int64
	if json.Unmarshal(raw, &flat) == nil && len(flat) > 0 {
		return flat, true
	}
	return nil, false
}

// grant pins a finished prefill's prompt blocks under a lease named by its
// request id and returns the kv_transfer_params its response carries.
func (v *VLLM) grant(j *job) *prefillParams {
	_, seqs := kv.NewHasher(v.cfg.Sim.BlockSize, j.lora, j.salt).Blocks(j.prompt)
	ids := v.leases[j.rank].Grant(j.internalID, kv.Seed(j.lora, j.salt), seqs)
	if ids == nil {
		ids = []int32{}
	}
	return &prefillParams{
		DoRemotePrefill: true,
		RemoteBlockIDs:  [][]int32{ids},
		RemoteEngineID:  v.engID,
		RemoteRequestID: j.internalID,
		RemoteHost:      v.cfg.KVTransfer.SideChannelHost,
		RemotePort:      v.sides[j.rank].Port(),
		TPSize:          1,
		DCPSize:         1,
		PPSize:          1,
		RemoteNumTokens: len(ids) * v.cfg.Sim.BlockSize,
		TransferMode:    "pull",
	}
}

// fetch is the sim's Fetcher: for a decode request with a handoff it pulls
// the missing prompt blocks by the producer's block ids over the side
// channel, inserts them (the sim checks every byte against the block's
// own derivation), and notifies the producer. Whatever fails is
// recomputed; the producer's lease then frees its blocks.
func (v *VLLM) fetch(ctx context.Context, req *engine.Request, m sim.Missing, into sim.Inserter) error {
	val, ok := v.pulls.Load(req.ID)
	if !ok {
		return nil
	}
	ps := val.(*pullState)
	ps.attempted.Store(true)
	n := min(len(m.Seq), len(ps.p.blockIDs)-m.Start)
	if n <= 0 {
		// Nothing the producer holds is missing here: only notify.
		v.stats.localHits.Add(1)
		v.notify(ctx, ps)
		return nil
	}
	inserted, wanted, err := pullBlocks(ctx, v.client, blockPull{addr: net.JoinHostPort(ps.p.host, strconv.Itoa(ps.p.port)),
		digest: sideDigest(ps.p.engineID, v.digest), ids: leadingIDs(ps.p.blockIDs[m.Start : m.Start+n]), lora: req.LoRA, salt: req.CacheSalt},
		req, m, v.cfg.Sim, into)
	v.stats.pullBlocks.Add(uint64(inserted))
	if err != nil {
		v.stats.pullFailed.Add(1)
		if re := (*transfer.RemoteError)(nil); errors.As(err, &re) && re.Code == transfer.CodeNotFound {
			v.stats.pullNotHeld.Add(1)
		}
		v.log.Warn("kv pull failed; recomputing the rest", "request", req.ID, "remote_request", ps.p.requestID,
			"pulled", inserted, "wanted", wanted, "err", err)
		return err
	}
	v.stats.pullOK.Add(1)
	v.notify(ctx, ps)
	return nil
}

// notify tells the producer that this consumer is done with the handoff's
// blocks, once.
func (v *VLLM) notify(ctx context.Context, ps *pullState) {
	sent, err := notifyProducer(ctx, &ps.notified, net.JoinHostPort(ps.p.host, strconv.Itoa(ps.p.port)), ps.p.requestID)
	switch {
	case !sent:
	case err != nil:
		v.stats.notifyFailed.Add(1)
		v.log.Warn("kv notification failed; the producer frees its blocks when the lease runs out",
			"remote_request", ps.p.requestID, "err", err)
	default:
		v.stats.notified.Add(1)
	}
}

// afterPrefill notifies a decode's producer when the sim never called the
// Fetcher (every full prompt block was cached here, or the prompt has
// none): vLLM's full-prefix-hit path sends only the notification.
func (v *VLLM) afterPrefill(ctx context.Context, ps *pullState) {
	if ps == nil || ps.attempted.Load() {
		return
	}
	v.stats.localHits.Add(1)
	v.notify(ctx, ps)
}
