package sim

import "time"

// TimingModel predicts how long one forward pass takes. The sim charges
// PrefillMS for the prompt tokens a pass computes and DecodeMS when at least
// one request samples a token in it.
type TimingModel interface {
	// PrefillMS is the time to compute newTokens uncached prompt tokens
	// (summed over the pass); 0 when newTokens is 0.
	PrefillMS(newTokens int) float64
	// DecodeMS is the time of a pass whose sampling requests hold
	// activeKVTokens of context, on an engine with totalKVTokens of capacity.
	DecodeMS(activeKVTokens, totalKVTokens int) float64
}

// Polynomial is the default timing model of Dynamo's mocker
// (lib/mocker/src/common/perf_model.rs, "Polynomial").
type Polynomial struct{}

// PrefillMS implements TimingModel with the package-level PrefillMS.
func (Polynomial) PrefillMS(newTokens int) float64 { return PrefillMS(newTokens) }

// DecodeMS implements TimingModel with the package-level DecodeMS.
func (Polynomial) DecodeMS(active, total int) float64 {
	if total <= 0 {
		return DecodeMS(1)
	}
	return DecodeMS(float64(active) / float64(total))
}

// PrefillMS = 4.209989e-07·x² + 1.518344e-02·x + 16.50142 ms for x new
// tokens in the pass; 0 for x ≤ 0.
func PrefillMS(x int) float64 {
	if x <= 0 {
		return 0
	}
	f := float64(x)
	return 4.209989e-07*f*f + 1.518344e-02*f + 16.50142
}

// DecodeMS = max(1, −25.74·p² + 54.01·p + 5.74) ms at KV utilisation p,
// with p clamped to [0, 1].
func DecodeMS(p float64) float64 {
	p = min(max(p, 0), 1)
	return max(1.0, -25.74*p*p+54.01*p+5.74)
}

// TransferMS is the time to move bytes at bandwidth bytes per second; 0
// when the bandwidth is not positive (transfers are free).
func TransferMS(bytes int64, bandwidth float64) float64 {
	if bandwidth <= 0 || bytes <= 0 {
		return 0
	}
	return float64(bytes) / bandwidth * 1e3
}

func msToDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
