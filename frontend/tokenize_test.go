package frontend

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// With one tokenizer slot a second prompt waits for the first rather than
// being refused, and a waiter whose client leaves gives up its place.
func TestTokenizerSlots(t *testing.T) {
	m := testModel()
	entered, release := make(chan struct{}, 4), make(chan struct{})
	m.EncodeChatUpTo = func(msgs []Message, _ int) ([]uint32, bool, error) {
		entered <- struct{}{}
		<-release
		ids, err := m.EncodeChat(msgs)
		return ids, true, err
	}
	cfg := DefaultConfig()
	cfg.Tokenizers = 1
	reg := prometheus.NewRegistry()
	s := New(cfg, &fakeBackend{reply: "ok"}, models{m}, reg, reg)
	post := func(ctx context.Context) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`)).WithContext(ctx)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec
	}
	first := make(chan int)
	go func() { first <- post(context.Background()).Code }()
	<-entered // the first holds the only slot
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan int)
	go func() { gone <- post(ctx).Code }()
	cancel()
	if code := <-gone; code == http.StatusOK {
		t.Errorf("a client that left while waiting was served")
	}
	second := make(chan int)
	go func() { second <- post(context.Background()).Code }()
	close(release)
	if a, b := <-first, <-second; a != 200 || b != 200 {
		t.Errorf("first %d, second %d: want both served, the second after waiting", a, b)
	}
	if n := len(entered); n != 1 {
		t.Errorf("%d more prompts tokenized, want the second only", n)
	}
}
