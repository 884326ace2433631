package frontend

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/tokenizer"
)

// parsed is r without the chat memo's bookkeeping: what a request means.
func parsed(r *chatRequest) *chatRequest {
	if r == nil {
		return nil
	}
	c := *r
	c.body, c.split, c.memo, c.keys = nil, chatSplit{}, nil, memoKeys{}
	return &c
}

// memoHistory is a chat body's start, long enough for the memo, with the
// salt before (first) or after the messages (as the OpenAI client puts an
// extra body's fields); it returns the body and where its last message
// ends.
func memoHistory(saltFirst bool, salt string) (string, int) {
	msgs := `[{"role":"system","content":"` + strings.Repeat("be brief. ", 300) + `"},{"role":"user","content":"hi \"there\""}`
	if saltFirst {
		head := `{"model":"m","cache_salt":"` + salt + `","messages":`
		return head + msgs + `]}`, len(head) + len(msgs)
	}
	return `{"messages":` + msgs + `],"model":"m","cache_salt":"` + salt + `"}`, len(`{"messages":`) + len(msgs)
}

// FuzzChatMemo holds a body parsed from a memo entry to the body parsed
// whole: the same request or the same error, whatever follows the entry's
// bytes; and a valid continuation under the entry's salt is read from it.
func FuzzChatMemo(f *testing.F) {
	for _, tail := range []string{
		`,{"role":"assistant","content":"a"},{"role":"user","content":"q"}],"model":"m","cache_salt":"s"}`,
		`,{"role":"assistant","content":"a"},{"role":"user","content":"q"}]}`,
		`]}`, `],"model":"m","cache_salt":"s"}`,
		`,{"role":"bad","content":"x"}],"model":"m","cache_salt":"s"}`,
		`,{"role":"user","content":"x"}],"messages":[{"role":"user","content":"y"}],"model":"m","cache_salt":"s"}`,
		`,{"role":"user","content":"x"}],"model":"m","cache_salt":"other"}`,
		`,{"role":"user","content":"x"}],"model":"m","cache_salt":"s","max_tokens":"4"}`,
		`,{"role":"user","content":[{"type":"text","text":"p"}]}],"model":"m","cache_salt":"s","max_tokens":4}`,
		`,{"role":"user","content":"x"],"model":"m","cache_salt":"s"}`,
		`,{"role":"user","content":"x"}],"model":"m","cache_salt":"s"}  `,
		`,{"role":"user","content":"x"}],"model":"m","cache_salt":"s"}}`,
		`,{"role":"user","content":"x"}],"model":7,"cache_salt":"s"}`,
		`,{"role":"user","content":"x","name":"n"}],"model":"m","model":"m2","cache_salt":"s","stream":true}`,
		`,{"role":"tool","content":"x"}],"model":"m","cache_salt":"s"}`,
		`,{"role":"user","content":"\ud800"}],"model":"m","cache_salt":"s"}`,
		`, {"role" : "user" , "content" : "x"} ] , "model":"m","cache_salt":"s" }`,
		`,{"role":"user","content":"x"}],"model":"m","cache_salt":"s","logprobs":true}`,
		`,`, ``, `x`,
	} {
		f.Add(false, tail)
		f.Add(true, tail)
	}
	f.Fuzz(func(t *testing.T, saltFirst bool, tail string) {
		s := &Server{memo: newChatMemo(chatMemoBytes)}
		prev, end := memoHistory(saltFirst, "s")
		r0, err := s.parseChat([]byte(prev))
		if err != nil || !r0.split.once || r0.split.lastEnd != end {
			t.Fatalf("the history: %v, split %+v (its last message ends at %d)", err, r0.split, end)
		}
		s.remember(r0, nil, nil, nil)
		body := []byte(prev[:end] + tail)
		r1, e1 := s.parseChat(body)
		r2, e2 := parseChat(body)
		if !reflect.DeepEqual(parsed(r1), parsed(r2)) || !reflect.DeepEqual(e1, e2) {
			t.Fatalf("%q: through the memo %+v, %v; whole %+v, %v", body, parsed(r1), e1, parsed(r2), e2)
		}
		if e2 == nil && r2.split.once && r2.CacheSalt == "s" && saltGuess(body) == "s" && r1.memo == nil {
			t.Fatalf("%q: a valid continuation under the entry's salt missed the memo", body)
		}
		if r1 != nil && r1.memo != nil && r1.CacheSalt != "s" {
			t.Fatalf("%q: salt %q read from an entry of salt s", body, r1.CacheSalt)
		}
	})
}

// Another salt's entry is never found, even for the same bytes.
func TestChatMemoSalts(t *testing.T) {
	s := &Server{memo: newChatMemo(chatMemoBytes)}
	stored := map[string]bool{}
	for _, salt := range []string{"a", "b"} {
		stored[salt] = true
		prev, end := memoHistory(false, salt)
		r, err := s.parseChat([]byte(prev))
		if err != nil {
			t.Fatal(err)
		}
		s.remember(r, nil, nil, nil)
		for _, other := range []string{"a", "b", "c"} {
			body := prev[:end] + `,{"role":"user","content":"x"}],"model":"m","cache_salt":"` + other + `"}`
			r, err := s.parseChat([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if hit := r.memo != nil; hit != stored[other] || (hit && r.memo.salt != other) {
				t.Errorf("entries of salts %v, request of salt %s: hit %v", stored, other, hit)
			}
		}
	}
}

// The memo is bounded: past its budget the least recently used go.
func TestChatMemoBudget(t *testing.T) {
	s := &Server{memo: newChatMemo(64 << 10)}
	for i := range 40 {
		prev, _ := memoHistory(false, "salt-"+strconv.Itoa(i))
		r, err := s.parseChat([]byte(prev))
		if err != nil {
			t.Fatal(err)
		}
		s.remember(r, nil, nil, nil)
		if s.memo.held > s.memo.budget || s.memo.lru.Len() != len(s.memo.keys) {
			t.Fatalf("after %d bodies: %d bytes held of %d, %d entries, %d keys", i+1, s.memo.held, s.memo.budget, s.memo.lru.Len(), len(s.memo.keys))
		}
	}
	if n := s.memo.lru.Len(); n == 0 || n >= 40 {
		t.Fatalf("%d entries kept of 40", n)
	}
}

// TestChatMemoServesTurns plays conversations through the whole handler
// with the memo and without: every turn's prompt reaches the backend as
// the same tokens, and the memo is used from the second turn on (each
// turn's entry replacing the one before).
func TestChatMemoServesTurns(t *testing.T) {
	var got [2][][]uint32
	for i, memo := range []int{0, -1} {
		m, err := BuiltinModel("m")
		if err != nil {
			t.Fatal(err)
		}
		m.prefixCache.Verify(1 << 30) // every hit checked whole too
		tok, _, _ := tokenizer.Builtin()
		eos, _ := tok.TokenID("<|im_end|>")
		be := &answerBackend{ids: tok.Encode(" the answer <|im_end|> is 42"), eos: eos}
		cfg := DefaultConfig()
		cfg.ChatMemoBytes = memo
		s := New(cfg, be, models{m}, prometheus.NewRegistry(), prometheus.NewRegistry())
		for _, salt := range []string{"", "t1"} {
			for _, saltFirst := range []bool{false, true} {
				hist, end := memoHistory(saltFirst, salt)
				if salt == "" {
					hist = strings.Replace(hist, `,"cache_salt":""`, "", 1)
					if saltFirst {
						end -= len(`,"cache_salt":""`)
					}
				}
				head, rest := hist[:end], hist[end:]
				for turn := range 4 {
					w := httptest.NewRecorder()
					s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(head+rest)).WithContext(context.Background()))
					if w.Code != http.StatusOK {
						t.Fatalf("turn %d: %d %s", turn, w.Code, w.Body)
					}
					if memo == 0 && turn > 0 {
						if s.memo.lru.Len() != 1+boolInt(saltFirst)+2*boolInt(salt != "") {
							t.Errorf("turn %d: %d memo entries", turn, s.memo.lru.Len())
						}
					}
					head += `,{"role":"assistant","content":" the answer <|im_end|> is 42"},{"role":"user","content":"turn ` + strconv.Itoa(turn) + ` \u00e9"}`
				}
			}
		}
		if memo == 0 {
			// 2 salts × 2 field orders × 3 later turns, each rendered after the turn before.
			if h, r := s.memo.hits.Load(), s.memo.rendered.Load(); h != 12 || r != 12 {
				t.Errorf("%d bodies read from the memo, %d rendered after it; want 12, 12", h, r)
			}
		}
		got[i] = be.prompts
		if st := m.PrefixStats(); st.Off {
			t.Fatalf("memo %d: the prefix cache's check failed: %+v", memo, st)
		}
	}
	if len(got[0]) != len(got[1]) {
		t.Fatalf("%d prompts with the memo, %d without", len(got[0]), len(got[1]))
	}
	for i := range got[0] {
		if !slices.Equal(got[0][i], got[1][i]) {
			t.Fatalf("prompt %d: %d tokens with the memo, %d without, not the same", i, len(got[0][i]), len(got[1][i]))
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Conversations played at once, some under one salt, share the memo
// safely: every prompt is a whole tokenization's (go test -race).
func TestChatMemoConcurrent(t *testing.T) {
	m, err := BuiltinModel("m")
	if err != nil {
		t.Fatal(err)
	}
	tok, _, _ := tokenizer.Builtin()
	eos, _ := tok.TokenID("<|im_end|>")
	be := &answerBackend{ids: tok.Encode(" fine"), eos: eos}
	cfg := DefaultConfig()
	cfg.ChatMemoBytes = 256 << 10 // small: entries are evicted while in use
	s := New(cfg, be, models{m}, prometheus.NewRegistry(), prometheus.NewRegistry())
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hist, end := memoHistory(g%2 == 0, "salt-"+strconv.Itoa(g%3))
			head, rest := hist[:end], hist[end:]
			for turn := range 6 {
				w := httptest.NewRecorder()
				s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(head+rest)))
				if w.Code != http.StatusOK {
					t.Errorf("goroutine %d turn %d: %d %s", g, turn, w.Code, w.Body)
					return
				}
				head += `,{"role":"assistant","content":" fine"},{"role":"user","content":"g` + strconv.Itoa(g) + ` t` + strconv.Itoa(turn) + `"}`
			}
		}()
	}
	wg.Wait()
	for i, p := range be.prompts {
		text := tok.Decode(p)
		if want := tok.EncodeWithSpecial(text); !slices.Equal(p, want) {
			t.Fatalf("prompt %d is not its text's tokenization", i)
		}
	}
	if s.memo.hits.Load() == 0 {
		t.Fatal("no conversation read from the memo")
	}
}

// The memo keeps its own copy of a body's bytes: the request's buffer is
// recycled for the next request. A body under an entry's key but with
// other bytes misses it (whether or not it is read into the buffer the
// entry's request had), and an entry still matches its continuation after
// other bodies were read (a short one between every two); every prompt is
// a whole parse's.
func TestChatMemoOwnsItsBytes(t *testing.T) {
	tok, _, _ := tokenizer.Builtin()
	eos, _ := tok.TokenID("<|im_end|>")
	filler := `{"messages":[{"role":"user","content":"` + strings.Repeat("z", 200) + `"}],"model":"m","max_tokens":1}`
	for _, poison := range []bool{false, true} {
		for _, saltFirst := range []bool{false, true} {
			was := poisonReleasedBodies
			poisonReleasedBodies = poison
			var prompts [2][][]uint32
			var hits int64
			for i, memo := range []int{0, -1} {
				m, err := BuiltinModel("m")
				if err != nil {
					t.Fatal(err)
				}
				be := &answerBackend{ids: tok.Encode(" ok"), eos: eos}
				cfg := DefaultConfig()
				cfg.ChatMemoBytes = memo
				s := New(cfg, be, models{m}, prometheus.NewRegistry(), prometheus.NewRegistry())
				hist, end := memoHistory(saltFirst, "s")
				if at := strings.Index(hist, "hi "); floorPow2(end) > at {
					t.Fatalf("the edit at %d is inside the entry's key (%d bytes)", at, floorPow2(end))
				}
				turn := func(q string) string {
					return `,{"role":"assistant","content":" ok"},{"role":"user","content":"` + q + `"}`
				}
				edited := strings.Replace(hist[:end], "hi ", "ho ", 1)
				for _, body := range []string{
					hist,
					hist[:end] + turn("more") + hist[end:], // continues the first: a hit
					edited + turn("more") + hist[end:],     // the second's key and length, other bytes: a miss
					edited + turn("more") + turn("again") + hist[end:], // continues the third: a hit
				} {
					for _, b := range []string{body, filler} {
						w := httptest.NewRecorder()
						s.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(b)))
						if w.Code != http.StatusOK {
							t.Fatalf("%d %s", w.Code, w.Body)
						}
					}
				}
				prompts[i] = be.prompts
				if memo == 0 {
					hits = s.memo.hits.Load()
				}
			}
			poisonReleasedBodies = was
			if hits != 2 {
				t.Errorf("poison %v, salt first %v: %d bodies read from the memo, want 2", poison, saltFirst, hits)
			}
			if len(prompts[0]) != len(prompts[1]) {
				t.Fatalf("%d prompts with the memo, %d without", len(prompts[0]), len(prompts[1]))
			}
			for i := range prompts[0] {
				if !slices.Equal(prompts[0][i], prompts[1][i]) {
					t.Errorf("poison %v, salt first %v: body %d's prompt through the memo is not the whole parse's", poison, saltFirst, i)
				}
			}
		}
	}
}
