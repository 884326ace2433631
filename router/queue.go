package router

import (
	"container/heap"
	"fmt"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// The router queue holds requests no worker can admit yet (see
// AdmitConfig), so they wait in the router instead of piling onto engines
// whose KV is full, and are routed with the fleet's state at the moment
// they leave: by then a conversation's previous turn has left its KV
// where it ran. The queue is pure: its owner (the twin, the live fleet)
// pushes what Route answered busy for, and pops when capacity frees.

// QueuePolicy orders the router queue.
type QueuePolicy string

const (
	// QueueFCFS serves requests in arrival order.
	QueueFCFS QueuePolicy = "fcfs"
	// QueueWSPT serves the least predicted prefill work first (weighted
	// shortest processing time, every weight 1): short and well-cached
	// prompts overtake long cold ones.
	QueueWSPT QueuePolicy = "wspt"
	// QueuePriority serves the lowest priority value first (vLLM's
	// convention: lower is sooner), then by arrival.
	QueuePriority QueuePolicy = "priority"
)

// QueuePolicies lists the policies, for help texts.
var QueuePolicies = []QueuePolicy{QueueFCFS, QueueWSPT, QueuePriority}

// ParseQueuePolicy accepts fcfs, wspt or priority (case-insensitive).
func ParseQueuePolicy(s string) (QueuePolicy, error) {
	p := QueuePolicy(strings.ToLower(strings.TrimSpace(s)))
	for _, x := range QueuePolicies {
		if p == x {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown router queue policy %q (want fcfs, wspt or priority)", s)
}

// DefaultQueueMaxWait is QueueConfig.MaxWait's default.
const DefaultQueueMaxWait = 10 * time.Second

// QueueConfig configures a Queue.
type QueueConfig struct {
	Policy QueuePolicy // default QueueFCFS
	// Limit is how many requests may wait; a push past it fails with
	// ErrQueueFull. 0: unbounded.
	Limit int
	// MaxWait bounds starvation: a request that has waited longer is
	// served before every younger one, oldest first, whatever the policy.
	// Default DefaultQueueMaxWait.
	MaxWait time.Duration
	// Lookahead is how many waiting requests one dispatch offers to the
	// router (Scan), so one waiting for a busy worker does not block the
	// rest. Default DefaultQueueLookahead.
	Lookahead int
}

// DefaultQueueLookahead is QueueConfig.Lookahead's default.
const DefaultQueueLookahead = 128

// ErrQueueFull is Push's error past QueueConfig.Limit (kv.ErrQueueFull).
var ErrQueueFull = kv.ErrQueueFull

func (c *QueueConfig) fill() error {
	if c.Policy == "" {
		c.Policy = QueueFCFS
	}
	if _, err := ParseQueuePolicy(string(c.Policy)); err != nil {
		return fmt.Errorf("%w: %w", errConfig, err)
	}
	if c.Limit < 0 {
		return fmt.Errorf("%w: queue limit %d is negative", errConfig, c.Limit)
	}
	if c.MaxWait < 0 {
		return fmt.Errorf("%w: queue max wait %v is negative", errConfig, c.MaxWait)
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultQueueMaxWait
	}
	if c.Lookahead < 0 {
		return fmt.Errorf("%w: queue lookahead %d is negative", errConfig, c.Lookahead)
	}
	if c.Lookahead == 0 {
		c.Lookahead = DefaultQueueLookahead
	}
	return nil
}

// Queued is one waiting request's handle.
type Queued[T any] struct {
	Value   T
	Arrived time.Time
	// Work is the predicted prefill (tokens) WSPT orders by; Priority is
	// what QueuePriority orders by (lower first).
	Work     float64
	Priority int

	seq  uint64
	hidx int  // index in the policy heap, -1 when not in it
	gone bool // popped or removed
}

// Queue is the router queue: ordered by its policy, bounded, with an age
// bound. Not safe for concurrent use; its owner locks.
type Queue[T any] struct {
	cfg  QueueConfig
	fifo []*Queued[T] // arrival order; entries gone are skipped lazily
	head int
	h    queueHeap[T] // policy order (not used for fcfs)
	n    int
	seq  uint64
}

// NewQueue returns an empty queue for cfg.
func NewQueue[T any](cfg QueueConfig) (*Queue[T], error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	return &Queue[T]{cfg: cfg, h: queueHeap[T]{policy: cfg.Policy}}, nil
}

// Len is how many requests wait.
func (q *Queue[T]) Len() int { return q.n }

// Config is the queue's configuration with defaults filled.
func (q *Queue[T]) Config() QueueConfig { return q.cfg }

// Push adds a request that arrived at arrived; it fails with ErrQueueFull
// past the limit. Requests must be pushed in arrival order (the age bound
// serves the oldest first by push order).
func (q *Queue[T]) Push(v T, arrived time.Time, work float64, priority int) (*Queued[T], error) {
	if q.cfg.Limit > 0 && q.n >= q.cfg.Limit {
		return nil, ErrQueueFull
	}
	q.seq++
	e := &Queued[T]{Value: v, Arrived: arrived, Work: work, Priority: priority, seq: q.seq, hidx: -1}
	if q.head > 0 && q.head*2 >= len(q.fifo) {
		q.fifo = append(q.fifo[:0], q.fifo[q.head:]...)
		q.head = 0
	}
	q.fifo = append(q.fifo, e)
	if q.cfg.Policy != QueueFCFS {
		heap.Push(&q.h, e)
	}
	q.n++
	return e, nil
}

// Peek is the request to serve next at now, or nil when none waits.
func (q *Queue[T]) Peek(now time.Time) *Queued[T] {
	for q.head < len(q.fifo) && q.fifo[q.head].gone {
		q.fifo[q.head] = nil
		q.head++
	}
	if q.head == len(q.fifo) {
		return nil
	}
	oldest := q.fifo[q.head]
	if q.cfg.Policy == QueueFCFS || now.Sub(oldest.Arrived) > q.cfg.MaxWait {
		return oldest
	}
	return q.h.s[0]
}

// Pop removes and returns the request Peek(now) names, or nil.
func (q *Queue[T]) Pop(now time.Time) *Queued[T] {
	e := q.Peek(now)
	if e != nil {
		q.Remove(e)
	}
	return e
}

// Scan offers up to limit waiting requests to fn in the order they are
// due at now (those past the age bound oldest first, then by policy), so
// a request that must wait for a busy worker does not hold back those
// behind it that could start elsewhere. fn says whether to take the
// request out of the queue and whether to stop.
func (q *Queue[T]) Scan(now time.Time, limit int, fn func(e *Queued[T]) (take, stop bool)) {
	seen := 0
	visit := func(e *Queued[T]) bool {
		seen++
		take, stop := fn(e)
		if take {
			q.Remove(e)
		}
		return stop || seen >= limit
	}
	// The aged requests are a prefix of the arrival order.
	i := q.head
	for ; i < len(q.fifo); i++ {
		e := q.fifo[i]
		if e.gone {
			continue
		}
		if q.cfg.Policy != QueueFCFS && now.Sub(e.Arrived) <= q.cfg.MaxWait {
			break
		}
		if visit(e) {
			return
		}
	}
	if q.cfg.Policy == QueueFCFS {
		return
	}
	// The rest by policy: pop them off the heap in order, then put back
	// what stays.
	var held []*Queued[T]
	defer func() {
		for _, e := range held {
			if !e.gone {
				heap.Push(&q.h, e)
			}
		}
	}()
	for q.h.Len() > 0 {
		e := heap.Pop(&q.h).(*Queued[T])
		held = append(held, e)
		if now.Sub(e.Arrived) > q.cfg.MaxWait {
			continue // offered above
		}
		if visit(e) {
			return
		}
	}
}

// Aged reports whether e has waited past the age bound at now.
func (q *Queue[T]) Aged(e *Queued[T], now time.Time) bool {
	return now.Sub(e.Arrived) > q.cfg.MaxWait
}

// Remove takes e out of the queue (a cancelled client); it reports whether
// e was still waiting.
func (q *Queue[T]) Remove(e *Queued[T]) bool {
	if e == nil || e.gone {
		return false
	}
	e.gone = true
	if e.hidx >= 0 {
		heap.Remove(&q.h, e.hidx)
	}
	q.n--
	return true
}

// queueHeap orders waiting requests by a non-FCFS policy; ties go to the
// earlier push.
type queueHeap[T any] struct {
	policy QueuePolicy
	s      []*Queued[T]
}

func (h *queueHeap[T]) Len() int { return len(h.s) }

func (h *queueHeap[T]) Less(i, j int) bool {
	a, b := h.s[i], h.s[j]
	switch {
	case h.policy == QueueWSPT && a.Work != b.Work:
		return a.Work < b.Work
	case h.policy == QueuePriority && a.Priority != b.Priority:
		return a.Priority < b.Priority
	}
	return a.seq < b.seq
}

func (h *queueHeap[T]) Swap(i, j int) {
	h.s[i], h.s[j] = h.s[j], h.s[i]
	h.s[i].hidx, h.s[j].hidx = i, j
}

func (h *queueHeap[T]) Push(x any) {
	e := x.(*Queued[T])
	e.hidx = len(h.s)
	h.s = append(h.s, e)
}

func (h *queueHeap[T]) Pop() any {
	e := h.s[len(h.s)-1]
	h.s[len(h.s)-1] = nil
	h.s = h.s[:len(h.s)-1]
	e.hidx = -1
	return e
}
