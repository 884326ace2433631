package router

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kv"
)

// The reasons the filters give, counted, make the error, in precedence
// order.
func TestDropsErr(t *testing.T) {
	req := &Request{Model: "m", LoRA: "a"}
	for _, tc := range []struct {
		name  string
		d     drops
		want  error
		words string
		busyN int
	}{
		{"no adapter", drops{dropNoAdapter: 3}, kv.ErrNoWorkers, `LoRA adapter "a"`, 0},
		{"decode-only", drops{dropNoAdapter: 1, dropDecodeOnly: 2}, ErrDecodeOnly, "", 0},
		{"excluded", drops{dropDecodeOnly: 1, dropExcluded: 2}, kv.ErrNoWorkers, "all 3 excluded", 0},
		{"busy", drops{dropExcluded: 1, dropBusy: 2}, kv.ErrAllBusy, "", 2},
	} {
		err := tc.d.err(req, 3, time.Second)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.words)
		}
		var be *kv.BusyError
		if errors.As(err, &be) && be.Workers != tc.busyN {
			t.Errorf("%s: busy error counts %d workers, want %d", tc.name, be.Workers, tc.busyN)
		}
	}
}

// oddFilter drops odd instances: a stage added to a profile.
type oddFilter struct{}

func (oddFilter) drop(_ *selection, w *worker) dropReason {
	if w.info.Key.Instance%2 == 1 {
		return dropBusy
	}
	return kept
}

func (oddFilter) idle(*selection) bool { return false }

// A filter added to a mode's profile narrows every pick, and its reasons
// make the error once nothing is left.
func TestProfileTakesAFilter(t *testing.T) {
	r := newRouter(t, Config{Mode: ModeRoundRobin}, 1, 2, 3, 4)
	r.prof.filters = append(append([]filter(nil), baseFilters...), oddFilter{})
	for range 6 {
		d, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(1, 40)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Worker.Instance%2 == 1 {
			t.Fatalf("picked %v, which the added filter drops", d.Worker)
		}
		d.Done()
	}
	_, err := r.Route(context.Background(), Request{Model: "m", Tokens: prompt(1, 40), Exclude: []kv.WorkerKey{key(2), key(4)}})
	var be *kv.BusyError
	if !errors.As(err, &be) || be.Workers != 2 {
		t.Fatalf("all dropped: %v, want a busy error over 2 workers", err)
	}
}
