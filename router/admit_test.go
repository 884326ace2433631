package router

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

func routeReq(r *Router, req Request) (*Decision, error) {
	req.Model = "m"
	return r.Route(context.Background(), req)
}

func TestAdmitPrefillBacklog(t *testing.T) {
	// winfo: 8192 tokens per pass. One pass of backlog closes a worker.
	r := newRouter(t, Config{Mode: ModeRoundRobin, Admit: &AdmitConfig{PrefillPasses: 1, KVUsage: -1, Waiting: -1}}, 1, 2)
	big := func(seed int) Request { return Request{Tokens: prompt(seed, 9000)} }
	d1, err := routeReq(r, big(1))
	if err != nil {
		t.Fatal(err)
	}
	d2, err := routeReq(r, big(2))
	if err != nil || d2.Worker == d1.Worker {
		t.Fatalf("second request: %v on %v, want the other worker", err, d2)
	}
	_, err = routeReq(r, big(3))
	var be *kv.BusyError
	if !errors.As(err, &be) {
		t.Fatalf("third request with both workers a pass behind: %v, want a *kv.BusyError", err)
	}
	if r.Admitting("m", "") {
		t.Fatal("Admitting says yes with both workers a pass behind")
	}
	d1.FirstToken() // its prefill is done: worker 1 admits again
	if !r.Admitting("m", "") {
		t.Fatal("Admitting says no after a prefill finished")
	}
	d3, err := routeReq(r, big(3))
	if err != nil || d3.Worker != d1.Worker {
		t.Fatalf("after the first token: %v on %v, want worker %v", err, d3, d1.Worker)
	}
}

func TestAdmitKVAndIdle(t *testing.T) {
	// winfo: 1000 blocks of 16 tokens; admit up to 90% of them.
	r := newRouter(t, Config{Mode: ModeRoundRobin, Admit: &AdmitConfig{KVUsage: 0.9, PrefillPasses: -1, Waiting: -1}}, 1)
	// An idle worker admits even a prompt over the threshold.
	d, err := routeReq(r, Request{Tokens: prompt(1, 950*testBS)})
	if err != nil {
		t.Fatalf("idle worker refused a big prompt: %v", err)
	}
	d.Done()
	d, err = routeReq(r, Request{Tokens: prompt(1, 880*testBS)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := routeReq(r, Request{Tokens: prompt(2, 30*testBS)}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("30 blocks beside 880 of 1000 at 90%%: %v, want busy", err)
	}
	// A prompt whose blocks are already active there needs nothing new.
	d2, err := routeReq(r, Request{Tokens: prompt(1, 880*testBS)})
	if err != nil {
		t.Fatalf("a prompt already active there: %v", err)
	}
	d.Done()
	d2.Done()
	if _, err := routeReq(r, Request{Tokens: prompt(2, 30*testBS)}); err != nil {
		t.Fatalf("after the requests ended: %v", err)
	}
	// A fresh load report counts too: 950 of 1000 used.
	r.UpdateLoad(key(1), 950, 1000, 3, 0)
	if _, err := routeReq(r, Request{Tokens: prompt(3, testBS)}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("reported 95%% used: %v, want busy", err)
	}
}

func TestAdmitWaitingReport(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeRoundRobin, Admit: &AdmitConfig{Waiting: 0.5, KVUsage: -1, PrefillPasses: -1}}, 1)
	r.UpdateLoad(key(1), 10, 1000, 4, 3) // 3 waiting > 0.5·4
	if _, err := routeReq(r, Request{Tokens: prompt(1, testBS)}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("3 waiting per 4 running at 0.5: %v, want busy", err)
	}
	r.UpdateLoad(key(1), 10, 1000, 4, 2)
	if _, err := routeReq(r, Request{Tokens: prompt(1, testBS)}); err != nil {
		t.Fatalf("2 waiting per 4 running at 0.5: %v", err)
	}
}

// In a cost mode a request waits for the worker holding its prefix when
// that one is full, rather than recompute on an idle one; once aged, it
// takes the idle one.
func TestAdmitWaitsForPrefixHolder(t *testing.T) {
	ix := newFakeIndex()
	now := time.Unix(100, 0)
	r := newRouter(t, Config{Matcher: ix, Now: func() time.Time { return now }, Admit: &AdmitConfig{PrefillPasses: 1, KVUsage: -1, Waiting: -1}}, 1, 2)
	conv := prompt(7, 6000)
	ix.store(key(1), kv.TierDevice, seqOf(conv[:5000]))
	// Worker 1 gets a pass of other prefill: it cannot admit.
	if _, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(8, 9000), Exclude: []kv.WorkerKey{key(2)}}); err != nil {
		t.Fatal(err)
	}
	_, err := routeReq(r, Request{Tokens: conv})
	var we *WaitError
	if !errors.As(err, &we) || we.Worker != key(1) || !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("request whose prefix is on a full worker: %v, want a WaitError for worker 1", err)
	}
	d, err := routeReq(r, Request{Tokens: conv, Aged: true})
	if err != nil || d.Worker != key(2) {
		t.Fatalf("aged request: %v on %v, want worker 2 (it admits now)", err, d)
	}
	// A cold request goes to the worker that admits it.
	d, err = routeReq(r, Request{Tokens: prompt(9, 3000)})
	if err != nil || d.Worker != key(2) {
		t.Fatalf("cold request: %v on %v, want worker 2", err, d)
	}
}

// A decode worker behind on prefill (a local prefill booked there) still
// admits decode legs, which bring their prompt computed; a full KV cache
// keeps every leg out.
func TestAdmittingDecodeLeg(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeRoundRobin, Admit: &AdmitConfig{PrefillPasses: 1, KVUsage: 0.9, Waiting: -1}})
	w := winfo(1)
	w.Role = kv.RoleDecode
	if err := r.AddWorker(w); err != nil {
		t.Fatal(err)
	}
	if !r.AdmittingDecodeLeg("m") {
		t.Fatal("an idle decode worker admits no decode leg")
	}
	d, err := routeReq(r, Request{Tokens: prompt(1, 9000), Role: kv.RoleDecode})
	if err != nil {
		t.Fatal(err)
	}
	if r.Admitting("m", kv.RoleDecode) || !r.AdmittingDecodeLeg("m") {
		t.Fatalf("a pass of prefill booked: Admitting %v, AdmittingDecodeLeg %v; want false, true",
			r.Admitting("m", kv.RoleDecode), r.AdmittingDecodeLeg("m"))
	}
	d.FirstToken()
	r.UpdateLoad(key(1), 950, 1000, 3, 0)
	if r.AdmittingDecodeLeg("m") {
		t.Fatal("a decode worker reporting 95% of its KV used admits decode legs at 90%")
	}
}

// Eligible answers, worker by worker, what Route's filters would: a
// refused request's owner asks it instead of routing the request again.
func TestEligible(t *testing.T) {
	now := time.Unix(1000, 0)
	r := newRouter(t, Config{Mode: ModeRoundRobin, Now: func() time.Time { return now },
		Admit: &AdmitConfig{KVUsage: 0.9, PrefillPasses: -1, Waiting: 0.5}}, 1, 2)
	elig := func(tokens []kv.Token, w uint64) bool {
		return r.Eligible(Request{Model: "m", Tokens: tokens}, key(w))
	}
	d1, err := routeReq(r, Request{Tokens: prompt(1, 880*testBS)})
	if err != nil {
		t.Fatal(err)
	}
	d2, err := routeReq(r, Request{Tokens: prompt(2, 880*testBS)})
	if err != nil || d2.Worker == d1.Worker {
		t.Fatalf("second request: %v on %v", err, d2)
	}
	small := prompt(3, 30*testBS)
	if _, err := routeReq(r, Request{Tokens: small}); !errors.Is(err, kv.ErrAllBusy) {
		t.Fatalf("30 blocks beside 880 of 1000 at 90%% on both: %v, want busy", err)
	}
	if elig(small, 1) || elig(small, 2) {
		t.Fatal("a worker Route refused is eligible")
	}
	// Its own prompt is active on worker 1 only; a worker the pool lacks
	// never is.
	if !elig(prompt(1, 880*testBS), uint64(d1.Worker.Instance)) || elig(prompt(1, 880*testBS), uint64(d2.Worker.Instance)) || elig(small, 3) {
		t.Fatal("eligibility by the active prefix")
	}
	d1.Done()
	if !elig(small, uint64(d1.Worker.Instance)) || elig(small, uint64(d2.Worker.Instance)) {
		t.Fatal("after worker 1's request ended")
	}
	// A load report's refusal lasts while the report counts.
	d2.Done()
	r.UpdateLoad(key(2), 10, 1000, 2, 3) // 3 waiting > 0.5·2
	if elig(small, 2) || !elig(small, 1) {
		t.Fatal("3 waiting per 2 running at 0.5")
	}
	now = now.Add(r.LoadReportTTL() + time.Second)
	if !elig(small, 2) {
		t.Fatal("refused by a report that no longer counts")
	}
}
