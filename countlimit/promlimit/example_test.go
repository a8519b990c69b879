package promlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/promlimit"
)

// A Limiter whose decisions, store calls and failures show in Prometheus,
// under the names the countlimit service uses. In an application, register
// with prometheus.MustRegister and serve promhttp.Handler() on /metrics.
func Example() {
	metrics := promlimit.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	store := memstore.New()
	defer store.Close()
	limiter := countlimit.New(store, countlimit.WithObserver(metrics.Observer()))

	sms := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}
	for range 3 {
		if _, err := limiter.Allow(context.Background(), sms, "18500000000"); err != nil {
			fmt.Println(err)
		}
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
	}
	for _, f := range families {
		if f.GetName() != "countlimit_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			fmt.Print(f.GetName())
			for _, l := range m.GetLabel() {
				fmt.Printf(" %s=%q", l.GetName(), l.GetValue())
			}
			fmt.Println(":", m.GetCounter().GetValue())
		}
	}
	// Output:
	// countlimit_decisions_total rule="sms.code" verdict="allowed": 2
	// countlimit_decisions_total rule="sms.code" verdict="denied": 1
}
