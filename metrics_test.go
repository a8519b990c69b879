package countlimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/promlimit"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestMetricsOnEveryStore: promlimit counts exactly the decisions 64
// callers got from each store (batched on PostgreSQL, pipelined on
// Redis), one duration per store call, and no failure.
func TestMetricsOnEveryStore(t *testing.T) {
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			m := promlimit.New()
			l := countlimit.New(b.Open(t), countlimit.WithObserver(m.Observer()))
			ut := storetest.UseType(t, "metrics")
			rule := countlimit.Rule{UseType: ut, Limit: 10, Window: countlimit.Fixed(time.Hour)}
			const callers, each = 64, 4
			var wg sync.WaitGroup
			var mu sync.Mutex
			allowed := 0
			for range callers {
				wg.Go(func() {
					for range each {
						res, err := l.Allow(context.Background(), rule, "shared")
						if err != nil {
							t.Error(err)
							return
						}
						if res.Allowed {
							mu.Lock()
							allowed++
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			reg := prometheus.NewRegistry()
			reg.MustRegister(m)
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, f := range families {
				for _, s := range f.GetMetric() {
					key := f.GetName()
					for _, lp := range s.GetLabel() {
						key += " " + lp.GetValue()
					}
					switch {
					case s.GetCounter() != nil:
						got[key] = s.GetCounter().GetValue()
					case s.GetHistogram() != nil:
						got[key] = float64(s.GetHistogram().GetSampleCount())
					}
				}
			}
			want := map[string]float64{
				"countlimit_decisions_total " + string(ut) + " allowed": 10,
				"countlimit_decisions_total " + string(ut) + " denied":  callers*each - 10,
				"countlimit_store_duration_seconds allow":               callers * each,
				"countlimit_store_failures_total":                       0,
			}
			if allowed != 10 {
				t.Errorf("%d allowed, want 10", allowed)
			}
			for k, w := range want {
				if g, ok := got[k]; !ok || g != w {
					t.Errorf("%s = %v (present %v), want %v", k, g, ok, w)
				}
			}
		})
	}
}
