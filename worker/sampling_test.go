package worker

import (
	"context"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvmesh/kvmesh/api"
	"github.com/kvmesh/kvmesh/engine"
	"github.com/kvmesh/kvmesh/engine/enginetest"
	"github.com/kvmesh/kvmesh/kv"
)

// lastRequest is the last request eng recorded.
func lastRequest(t *testing.T, eng *enginetest.Recorder) engine.Request {
	t.Helper()
	reqs := eng.Take()
	if len(reqs) == 0 {
		t.Fatal("the engine got no request")
	}
	return reqs[len(reqs)-1]
}

// Every sampling parameter of a GenerateRequest reaches engine.Request
// unchanged; an absent top_p arrives as 0 (unset), an explicit 1 as 1.
func TestSamplingParamsReachEngine(t *testing.T) {
	_, nc := startNATS(t)
	eng := &enginetest.Recorder{Engine: &testEngine{tick: time.Millisecond}}
	_, c := startWorker(t, nc, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// sampling is the part of engine.Request this test is about.
	type sampling struct {
		ID                                     string
		MaxTokens                              int
		StopTokens                             []kv.Token
		Seed                                   uint64
		Temperature, TopP, Presence, Frequency float64
	}
	of := func(r engine.Request) sampling {
		return sampling{r.ID, r.MaxTokens, r.StopTokens, r.Seed, r.Temperature, r.TopP, r.PresencePenalty, r.FrequencyPenalty}
	}
	for _, tc := range []struct {
		name string
		req  *api.GenerateRequest
		want sampling
	}{
		{"all set", &api.GenerateRequest{RequestId: "all", MaxTokens: 3, StopTokenIds: []uint32{7, 9}, Seed: 1<<63 + 5,
			Temperature: 0.25, TopP: proto.Float64(0.125), PresencePenalty: -1.5, FrequencyPenalty: 1.75},
			sampling{"all", 3, []kv.Token{7, 9}, 1<<63 + 5, 0.25, 0.125, -1.5, 1.75}},
		{"defaults", &api.GenerateRequest{RequestId: "none", MaxTokens: 2},
			sampling{ID: "none", MaxTokens: 2}},
		{"top_p 1", &api.GenerateRequest{RequestId: "one", MaxTokens: 1, Temperature: 2, TopP: proto.Float64(1), PresencePenalty: 2, FrequencyPenalty: -2},
			sampling{ID: "one", MaxTokens: 1, Temperature: 2, TopP: 1, Presence: 2, Frequency: -2}},
	} {
		tc.req.Tokens = prompt(1, 10)
		st, err := c.Generate(ctx, tc.req)
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := st.Recv(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		if got := of(lastRequest(t, eng)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: engine got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// Out-of-range sampling parameters from a direct gRPC client are
// InvalidArgument (the frontend checks its own clients' before routing).
func TestSamplingParamsOutOfRange(t *testing.T) {
	_, nc := startNATS(t)
	eng := &enginetest.Recorder{Engine: &testEngine{tick: time.Millisecond}}
	_, c := startWorker(t, nc, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		req  *api.GenerateRequest
	}{
		{"temperature", &api.GenerateRequest{Temperature: -0.5}},
		{"temperature", &api.GenerateRequest{Temperature: math.NaN()}},
		{"top_p", &api.GenerateRequest{TopP: proto.Float64(0)}},
		{"top_p", &api.GenerateRequest{TopP: proto.Float64(1.5)}},
		{"presence_penalty", &api.GenerateRequest{PresencePenalty: 2.5}},
		{"frequency_penalty", &api.GenerateRequest{FrequencyPenalty: math.Inf(-1)}},
	} {
		tc.req.Tokens, tc.req.MaxTokens = prompt(1, 10), 2
		st, err := c.Generate(ctx, tc.req)
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s %v: got %v, want InvalidArgument naming it", tc.name, tc.req, err)
		}
	}
	if n := len(eng.Take()); n != 0 {
		t.Fatalf("the engine got %d invalid requests", n)
	}
}
