package quantile

import (
	"testing"
	"time"
)

func TestNearest(t *testing.T) {
	ten := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct {
		p    float64
		want int
	}{{0, 1}, {0.05, 1}, {0.1, 1}, {0.11, 2}, {0.5, 5}, {0.9, 9}, {0.99, 10}, {1, 10}} {
		if got := Nearest(ten, c.p); got != c.want {
			t.Errorf("Nearest(1..10, %v) = %d, want %d", c.p, got, c.want)
		}
	}
	if got := Nearest([]time.Duration(nil), 0.5); got != 0 {
		t.Errorf("no samples: %v", got)
	}
	if got := Nearest([]float64{7}, 0.99); got != 7 {
		t.Errorf("one sample: %v", got)
	}
}

// numpy.quantile([1, 2, 4, 8], q) for the same q.
func TestLinearMatchesNumpy(t *testing.T) {
	s := []float64{1, 2, 4, 8}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {0.25, 1.75}, {0.5, 3}, {0.9, 6.8}, {1, 8}} {
		if got := Linear(s, c.p); got < c.want-1e-12 || got > c.want+1e-12 {
			t.Errorf("Linear(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if Linear(nil, 0.5) != 0 {
		t.Error("no samples")
	}
}

func TestNoAllocs(t *testing.T) {
	s := []float64{1, 2, 3}
	if n := testing.AllocsPerRun(100, func() { _ = Nearest(s, 0.5) + Linear(s, 0.5) }); n != 0 {
		t.Fatalf("%v allocs per call", n)
	}
}
