package mockengine

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

func connector(role string, lease time.Duration) *KVTransferConfig {
	return &KVTransferConfig{Role: role, SideChannelHost: "127.0.0.1", LeaseDuration: lease, PullTimeout: 2 * time.Second}
}

// prefillLeg is the request a P/D proxy sends to the prefill engine.
func prefillLeg(prompt []kv.Token) map[string]any {
	return map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}
}

type handoff struct {
	DoRemotePrefill bool      `json:"do_remote_prefill"`
	DoRemoteDecode  bool      `json:"do_remote_decode"`
	RemoteBlockIDs  [][]int32 `json:"remote_block_ids"`
	RemoteEngineID  string    `json:"remote_engine_id"`
	RemoteRequestID string    `json:"remote_request_id"`
	RemoteHost      string    `json:"remote_host"`
	RemotePort      int       `json:"remote_port"`
	TPSize          int       `json:"tp_size"`
}

func runPrefill(t *testing.T, url string, prompt []kv.Token) (completion, json.RawMessage, handoff) {
	t.Helper()
	code, b := post(t, url+"/v1/completions", prefillLeg(prompt), map[string]string{"X-Request-Id": "pd-1"})
	if code != http.StatusOK {
		t.Fatalf("prefill %d: %s", code, b)
	}
	c := decode[completion](t, b)
	return c, c.KVTransferParams, decode[handoff](t, c.KVTransferParams)
}

func TestPrefillDecodePullsRealBlocks(t *testing.T) {
	pre, preURL := startVLLM(t, VLLMConfig{KVTransfer: connector(RoleProducer, time.Minute)})
	dec, decURL := startVLLM(t, VLLMConfig{KVTransfer: connector(RoleConsumer, time.Minute)})
	prompt := seqTokens(72, 300) // 4 full blocks of 16 and a tail of 8
	_, seqs := kv.NewHasher(16, "", "").Blocks(prompt)

	c, raw, h := runPrefill(t, preURL, prompt)
	switch {
	case c.Choices[0].FinishReason != "length" || c.Usage.CompletionTokens != 1:
		t.Fatalf("prefill finish %q, %d tokens", c.Choices[0].FinishReason, c.Usage.CompletionTokens)
	case !h.DoRemotePrefill || h.DoRemoteDecode || h.TPSize != 1:
		t.Fatalf("handoff flags %+v", h)
	case len(h.RemoteBlockIDs) != 1 || len(h.RemoteBlockIDs[0]) != 4:
		t.Fatalf("remote_block_ids %v, want one group of 4", h.RemoteBlockIDs)
	case h.RemoteEngineID != pre.EngineID() || h.RemoteHost != "127.0.0.1" || h.RemotePort != pre.SideChannelPort(0):
		t.Fatalf("handoff endpoint %+v (engine %s, port %d)", h, pre.EngineID(), pre.SideChannelPort(0))
	case len(h.RemoteRequestID) <= len("cmpl-pd-1-0-"):
		t.Fatalf("remote_request_id %q", h.RemoteRequestID)
	}
	if st := pre.LeaseStats(0); st.Held != 1 || st.Blocks != 4 {
		t.Fatalf("prefill leases %+v", st)
	}
	// The leased ids are the prefill's own blocks: the decode's pull must
	// bring exactly their bytes.
	var wantSums []uint64
	for _, s := range seqs {
		sum, ok := pre.Engine().BlockChecksum(s)
		if !ok {
			t.Fatalf("prefill does not hold block %x", s)
		}
		wantSums = append(wantSums, sum)
	}

	// The decode leg carries the prefill's params unchanged.
	code, b := post(t, decURL+"/v1/completions", map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 5,
		"kv_transfer_params": raw}, map[string]string{"X-Request-Id": "pd-1"})
	if code != http.StatusOK {
		t.Fatalf("decode %d: %s", code, b)
	}
	d := decode[completion](t, b)
	if d.Choices[0].FinishReason != "length" || d.Usage.CompletionTokens != 5 || d.Usage.PromptTokensDetails.CachedTokens != 64 {
		t.Fatalf("decode usage %+v, finish %q", d.Usage, d.Choices[0].FinishReason)
	}
	if ps := dec.PullStats(); ps.OK != 1 || ps.Blocks != 4 || ps.Notified != 1 || ps.Failed != 0 {
		t.Fatalf("decode pulls %+v", ps)
	}
	for i, s := range seqs {
		if sum, ok := dec.Engine().BlockChecksum(s); !ok || sum != wantSums[i] {
			t.Fatalf("block %d at decode: checksum %x (held %v), want %x", i, sum, ok, wantSums[i])
		}
	}
	if st := pre.LeaseStats(0); st.Held != 0 || st.Consumed != 1 || st.Expired != 0 {
		t.Fatalf("prefill leases after the notification %+v", st)
	}
	// The side channel drops its transfer pin just after its last frame.
	waitFor(t, "the prefill to free its blocks", func() bool {
		return pre.LeaseStats(0).Blocks == 0 && pre.Engine().Stats().UsedBlocks == 0
	})

	// A second decode of the same prompt finds every block cached: it only
	// notifies, and the prefill no longer holds that lease.
	post(t, decURL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": raw}, nil)
	if ps := dec.PullStats(); ps.LocalHits != 1 || ps.NotifyFailures != 1 {
		t.Fatalf("decode after a full local hit %+v", ps)
	}
}

func TestPrefillLeaseExpires(t *testing.T) {
	pre, preURL := startVLLM(t, VLLMConfig{KVTransfer: connector(RoleBoth, 100*time.Millisecond)})
	_, _, h := runPrefill(t, preURL, seqTokens(40, 1))
	if len(h.RemoteBlockIDs[0]) != 2 || pre.LeaseStats(0).Held != 1 || pre.Engine().Stats().UsedBlocks != 2 {
		t.Fatalf("handoff %+v, leases %+v", h, pre.LeaseStats(0))
	}
	waitFor(t, "the lease to run out", func() bool { st := pre.LeaseStats(0); return st.Held == 0 && st.Expired == 1 })
	if got := pre.Engine().Stats().UsedBlocks; got != 0 {
		t.Fatalf("prefill still holds %d blocks", got)
	}
	// A late notification names no lease.
	err := Notify(context.Background(), net.JoinHostPort("127.0.0.1", strconv.Itoa(h.RemotePort)), h.RemoteRequestID, 1)
	if !errors.Is(err, ErrNoLease) {
		t.Fatalf("late notify: %v", err)
	}
}

// TestDecodeRecomputesWhenPullFails: a handoff naming another engine is
// refused by the side channel (the digest covers the engine id, as NIXL's
// handshake does); the decode computes the prompt itself and does not
// notify, so the prefill's lease stays until it runs out.
func TestDecodeRecomputesWhenPullFails(t *testing.T) {
	pre, preURL := startVLLM(t, VLLMConfig{KVTransfer: connector(RoleProducer, time.Minute)})
	dec, decURL := startVLLM(t, VLLMConfig{KVTransfer: connector(RoleConsumer, time.Minute)})
	prompt := seqTokens(40, 7)
	_, raw, _ := runPrefill(t, preURL, prompt)
	var params map[string]any
	if err := json.Unmarshal(raw, &params); err != nil {
		t.Fatal(err)
	}
	params["remote_engine_id"] = "someone-else"
	code, b := post(t, decURL+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 3, "kv_transfer_params": params}, nil)
	if code != http.StatusOK {
		t.Fatalf("decode %d: %s", code, b)
	}
	d := decode[completion](t, b)
	if d.Usage.PromptTokensDetails.CachedTokens != 0 || d.Usage.CompletionTokens != 3 {
		t.Fatalf("decode usage %+v", d.Usage)
	}
	if ps := dec.PullStats(); ps.Failed != 1 || ps.Blocks != 0 || ps.Notified != 0 {
		t.Fatalf("decode pulls %+v", ps)
	}
	if st := pre.LeaseStats(0); st.Held != 1 {
		t.Fatalf("prefill leases %+v", st)
	}
}

// TestPrefillWithoutConnectorIgnoresParams: like vLLM without
// --kv-transfer-config, the params change nothing.
func TestPrefillWithoutConnectorIgnoresParams(t *testing.T) {
	_, url := startVLLM(t, VLLMConfig{})
	c, raw, _ := runPrefill(t, url, seqTokens(40, 1))
	if string(raw) != "null" || c.Choices[0].FinishReason != "length" {
		t.Fatalf("kv_transfer_params %s", raw)
	}
}

func TestParseNotification(t *testing.T) {
	for _, tc := range []struct {
		in   string
		id   string
		n    int
		good bool
	}{
		{"cmpl-a-0-12345678:1", "cmpl-a-0-12345678", 1, true},
		{"a:b:2", "a:b", 2, true},
		{"nocolon", "", 0, false},
		{":1", "", 0, false},
		{"x:0", "", 0, false},
		{"x:y", "", 0, false},
	} {
		id, n, ok := parseNotification(tc.in)
		if ok != tc.good || (ok && (id != tc.id || n != tc.n)) {
			t.Errorf("%q: %q %d %v", tc.in, id, n, ok)
		}
	}
}

// A decode whose cache_salt differs from its prefill's pulls nothing over
// the side channel, even with the prefill's exact handoff: the producer
// serves a leased block only to a pull in the domain it was computed in,
// so no byte of one tenant's KV reaches another's request (it is
// recomputed, and no pull failed verification). The same salt pulls.
func TestDecodePullStaysInItsSaltDomain(t *testing.T) {
	pre, preURL := startVLLM(t, VLLMConfig{KVTransfer: connector(RoleProducer, time.Minute)})
	dec, decURL := startVLLM(t, VLLMConfig{KVTransfer: connector(RoleConsumer, time.Minute)})
	prompt := seqTokens(72, 900)
	leg := func(url string, salt string, extra map[string]any) completion {
		t.Helper()
		body := map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 1, "cache_salt": salt}
		for k, v := range extra {
			body[k] = v
		}
		code, b := post(t, url+"/v1/completions", body, nil)
		if code != http.StatusOK {
			t.Fatalf("%s (salt %s): %d %s", url, salt, code, b)
		}
		return decode[completion](t, b)
	}
	pf := prefillLeg(prompt)["kv_transfer_params"]
	p := leg(preURL, "tenant-a", map[string]any{"kv_transfer_params": pf})
	if h := decode[handoff](t, p.KVTransferParams); len(h.RemoteBlockIDs) != 1 || len(h.RemoteBlockIDs[0]) != 4 {
		t.Fatalf("handoff %+v", h)
	}
	d := leg(decURL, "tenant-b", map[string]any{"kv_transfer_params": p.KVTransferParams})
	if d.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("tenant b's decode found %d cached tokens", d.Usage.PromptTokensDetails.CachedTokens)
	}
	// Refused by the producer (nothing held in b's domain), not sent and
	// then rejected by the decode's verification.
	if ps := dec.PullStats(); ps.Blocks != 0 || ps.NotHeld != 1 || ps.Failed != 1 {
		t.Fatalf("tenant b's pull %+v: want one pull answered with no block", ps)
	}
	_, seqB := kv.NewHasher(16, "", "tenant-b").Blocks(prompt)
	if _, ok := dec.Engine().BlockChecksum(seqB[0]); !ok {
		t.Fatal("tenant b's decode did not compute its own blocks")
	}

	p = leg(preURL, "tenant-c", map[string]any{"kv_transfer_params": pf})
	d = leg(decURL, "tenant-c", map[string]any{"kv_transfer_params": p.KVTransferParams})
	if d.Usage.PromptTokensDetails.CachedTokens != 64 || dec.PullStats().Blocks != 4 {
		t.Fatalf("same salt: %d cached tokens, pulls %+v; want the 4 blocks pulled", d.Usage.PromptTokensDetails.CachedTokens, dec.PullStats())
	}
	if st := pre.LeaseStats(0); st.Consumed != 1 || st.Held != 1 {
		t.Fatalf("prefill leases %+v: want tenant c's consumed, tenant a's still held", st)
	}
}
