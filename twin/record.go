package twin

import (
	"time"
)

// results is what a run measures, collected as it goes: the Result's
// counters, and the latency samples and span finishResult turns into it.
type results struct {
	res              Result
	ttft, itl, e2e   []float64
	qwait            []float64 // router queue waits (ms), Config.Queue
	firstAt, lastFin time.Time
	predicted        int64 // prompt tokens the router expected cached
	reachable        int64 // prompt tokens the best eligible holders held
}

// complete records a finished request's latencies and prefix hits.
func (t *twin) complete(st *request, now time.Time, nowNS int64) {
	m := st.seq.Metrics()
	ttft := m.FirstToken.Sub(st.arrival)
	e2e := m.Finished.Sub(st.arrival)
	t.ttft = append(t.ttft, ms(ttft))
	t.e2e = append(t.e2e, ms(e2e))
	if m.OutputTokens > 1 {
		t.itl = append(t.itl, ms(e2e-ttft)/float64(m.OutputTokens-1))
	}
	hm := m // the leg that computed the prompt
	if st.pd != nil {
		if st.pd.preSeq != st.seq {
			t.decodeDone(st.pd, m)
			hm = st.pd.preSeq.Metrics()
			t.res.Preemptions += int64(hm.Preemptions)
		}
		st.pd = nil
	}
	peers := min(hm.FetchedTokens, hm.CachedTokens)
	h := &t.res.Hit
	h.PromptTokens += int64(hm.PromptTokens)
	h.DeviceTokens += int64(hm.CachedTokens - peers - hm.HostTokens - hm.DiskTokens - hm.ObjectTokens)
	h.PeerTokens += int64(peers)
	h.HostTokens += int64(hm.HostTokens)
	h.DiskTokens += int64(hm.DiskTokens)
	h.ObjectTokens += int64(hm.ObjectTokens)
	t.res.OutputTokens += int64(m.OutputTokens)
	t.res.Requests++
	t.res.Preemptions += int64(m.Preemptions)
	if now.After(t.lastFin) {
		t.lastFin = now
	}
	st.dec, st.seq = nil, nil // let the GC have them
	t.arr.reissue(nowNS)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// finishResult turns the collected samples into the Result.
func (t *twin) finishResult() {
	r := &t.res
	r.TTFT, r.ITL, r.E2E = newDist(t.ttft), newDist(t.itl), newDist(t.e2e)
	r.TTFTSamples, r.ITLSamples = t.ttft, t.itl
	if r.Queue != nil {
		r.Queue.Wait = newDist(t.qwait)
	}
	r.Rejected = r.RejectedBusy + r.RejectedInvalid
	if !t.lastFin.IsZero() {
		r.SimSeconds = t.lastFin.Sub(t.firstAt).Seconds()
	}
	if r.SimSeconds > 0 {
		r.OutputTokPerS = float64(r.OutputTokens) / r.SimSeconds
		r.ReqPerS = float64(r.Requests) / r.SimSeconds
	}
	h := &r.Hit
	if h.PromptTokens > 0 {
		p := float64(h.PromptTokens)
		h.Device = float64(h.DeviceTokens) / p
		h.Peers = float64(h.PeerTokens) / p
		h.Host, h.Disk, h.Object = float64(h.HostTokens)/p, float64(h.DiskTokens)/p, float64(h.ObjectTokens)/p
		h.Total = float64(h.DeviceTokens+h.PeerTokens+h.HostTokens+h.DiskTokens+h.ObjectTokens) / p
		r.PredictedHit = float64(t.predicted) / p
		r.Reachable = float64(t.reachable) / p
	}
	t.finishPD()
	for i := range t.ws {
		c := t.ws[i].core.Counters()
		r.EvictedBlocks += int64(c.EvictedBlocks)
		r.FetchErrors += int64(c.FetchErrors)
	}
}
