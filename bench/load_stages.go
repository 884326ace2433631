package bench

import (
	"context"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/stages"
)

// StageRow is one stage of a kvmesh server's request path over a load
// run: how many requests passed it and its quantiles, read from the
// server's kvmesh_request_stage_seconds buckets (±25%).
type StageRow struct {
	Stage string  `json:"stage"`
	Count uint64  `json:"count"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
}

// metricsURL is the /metrics beside an OpenAI base URL (…/v1).
func metricsURL(base string) string {
	return strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1") + "/metrics"
}

// scrapeStages reads the server's stage histogram; a server without one
// (an engine itself) gives an empty snapshot.
func scrapeStages(ctx context.Context, client *http.Client, c *LoadConfig) (stages.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return stages.Scrape(ctx, client, metricsURL(c.URL), c.APIKey)
}

// stageRows lists the stages observed during the run, in path order.
func stageRows(s stages.Snapshot) []StageRow {
	var out []StageRow
	for _, st := range stages.All() {
		h, ok := s[st.String()]
		if !ok || h.Total() == 0 {
			continue
		}
		out = append(out, StageRow{Stage: st.String(), Count: h.Total(), P50ms: msOf(h.Quantile(0.5)), P99ms: msOf(h.Quantile(0.99))})
	}
	return out
}

func msOf(sec float64) float64 {
	if math.IsNaN(sec) {
		return 0
	}
	return sec * 1e3
}
