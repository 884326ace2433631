package router

import (
	"errors"
	"slices"
	"testing"
	"time"
)

var qt0 = time.Unix(1000, 0)

// drain pops everything at now and returns the values in order.
func drain(q *Queue[string], now time.Time) []string {
	var out []string
	for e := q.Pop(now); e != nil; e = q.Pop(now) {
		out = append(out, e.Value)
	}
	return out
}

func newTestQueue(t *testing.T, cfg QueueConfig) *Queue[string] {
	t.Helper()
	q, err := NewQueue[string](cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestQueuePolicies(t *testing.T) {
	// name, arrival offset (s), work, priority
	items := []struct {
		v    string
		at   int
		work float64
		prio int
	}{{"a", 0, 900, 2}, {"b", 1, 100, 0}, {"c", 2, 500, 2}, {"d", 3, 100, -1}}
	for _, c := range []struct {
		pol  QueuePolicy
		want []string
	}{
		{QueueFCFS, []string{"a", "b", "c", "d"}},
		{QueueWSPT, []string{"b", "d", "c", "a"}},     // least work first, ties by arrival
		{QueuePriority, []string{"d", "b", "a", "c"}}, // lowest value first, ties by arrival
	} {
		q := newTestQueue(t, QueueConfig{Policy: c.pol, MaxWait: time.Hour})
		for _, it := range items {
			if _, err := q.Push(it.v, qt0.Add(time.Duration(it.at)*time.Second), it.work, it.prio); err != nil {
				t.Fatal(err)
			}
		}
		if got := drain(q, qt0.Add(10*time.Second)); !slices.Equal(got, c.want) {
			t.Errorf("%s: order %v, want %v", c.pol, got, c.want)
		}
	}
}

func TestQueueAgeBoundStopsStarvation(t *testing.T) {
	q := newTestQueue(t, QueueConfig{Policy: QueueWSPT, MaxWait: 5 * time.Second})
	q.Push("long", qt0, 1e6, 0)
	q.Push("short1", qt0.Add(time.Second), 1, 0)
	q.Push("short2", qt0.Add(2*time.Second), 1, 0)
	if e := q.Peek(qt0.Add(3 * time.Second)); e.Value != "short1" {
		t.Fatalf("before the bound WSPT serves %q, want short1", e.Value)
	}
	// Past the bound the long one goes first, though shorter ones wait.
	if !q.Aged(q.fifo[0], qt0.Add(6*time.Second)) {
		t.Fatal("the long request is not aged after 6 s of a 5 s bound")
	}
	if got := drain(q, qt0.Add(6*time.Second)); !slices.Equal(got, []string{"long", "short1", "short2"}) {
		t.Fatalf("order past the age bound %v", got)
	}
}

func TestQueueLimitAndRemove(t *testing.T) {
	q := newTestQueue(t, QueueConfig{Limit: 2})
	a, _ := q.Push("a", qt0, 0, 0)
	if _, err := q.Push("b", qt0, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Push("c", qt0, 0, 0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("push past the limit: %v, want ErrQueueFull", err)
	}
	// A cancelled client frees its slot at once.
	if !q.Remove(a) || q.Remove(a) {
		t.Fatal("Remove must report true once, then false")
	}
	if q.Len() != 1 {
		t.Fatalf("Len %d after a removal, want 1", q.Len())
	}
	if _, err := q.Push("c", qt0, 0, 0); err != nil {
		t.Fatalf("push after a removal: %v", err)
	}
	if got := drain(q, qt0); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("order %v, want [b c] (the removed one skipped)", got)
	}
}

func TestQueueScanTakesAroundWaiters(t *testing.T) {
	for _, pol := range QueuePolicies {
		q := newTestQueue(t, QueueConfig{Policy: pol, MaxWait: time.Hour})
		for i, v := range []string{"a", "b", "c", "d", "e"} {
			q.Push(v, qt0.Add(time.Duration(i)*time.Second), float64(i), 0)
		}
		var seen []string
		// b and d can start; the others wait for a busy worker.
		q.Scan(qt0.Add(time.Minute), 4, func(e *Queued[string]) (bool, bool) {
			seen = append(seen, e.Value)
			return e.Value == "b" || e.Value == "d", false
		})
		if !slices.Equal(seen, []string{"a", "b", "c", "d"}) {
			t.Errorf("%s: scan offered %v, want the first 4 in order", pol, seen)
		}
		if got := drain(q, qt0.Add(time.Minute)); !slices.Equal(got, []string{"a", "c", "e"}) {
			t.Errorf("%s: left %v, want [a c e] in order", pol, got)
		}
	}
}

func TestQueueConfigErrors(t *testing.T) {
	for _, c := range []QueueConfig{{Policy: "lifo"}, {Limit: -1}, {MaxWait: -time.Second}, {Lookahead: -1}} {
		if _, err := NewQueue[int](c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if _, err := ParseQueuePolicy(" WSPT "); err != nil {
		t.Error(err)
	}
}
