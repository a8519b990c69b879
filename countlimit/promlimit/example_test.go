package promlimit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
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

// downStore is a store that is down: every call fails.
type downStore struct{}

func (downStore) Do(context.Context, *driver.Request) error {
	return driver.Unavailable(errors.New("connection refused"))
}

// The failures and the calls the circuit breaker refused show through the
// Observer; the breaker's state through BreakerChanged, its OnChange.
func ExampleMetrics_BreakerChanged() {
	metrics := promlimit.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	limiter := countlimit.New(downStore{},
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 2, CoolDown: time.Hour, OnChange: metrics.BreakerChanged}),
		countlimit.WithObserver(metrics.Observer()))

	sms := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}
	for range 3 {
		_, err := limiter.Allow(context.Background(), sms, "18500000000")
		fmt.Println(errors.Is(err, countlimit.ErrCircuitOpen))
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "countlimit_store_failures_total", "countlimit_breaker_openings_total", "countlimit_breaker_rejected_total":
			fmt.Println(f.GetName(), f.GetMetric()[0].GetCounter().GetValue())
		case "countlimit_breaker_state":
			fmt.Println(f.GetName(), f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output:
	// false
	// false
	// true
	// countlimit_breaker_openings_total 1
	// countlimit_breaker_rejected_total 1
	// countlimit_breaker_state 1
	// countlimit_store_failures_total 2
}

// Use types a caller chooses (one per tenant, here) are no fixed set:
// MaxRuleLabels keeps the first two as labels of their own and counts the
// rest under "other".
func ExampleMaxRuleLabels() {
	metrics := promlimit.New(promlimit.MaxRuleLabels(2))
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	store := memstore.New()
	defer store.Close()
	limiter := countlimit.New(store, countlimit.WithObserver(metrics.Observer()))
	for _, tenant := range []string{"acme", "globex", "initech", "umbrella"} {
		exports := countlimit.Rule{UseType: countlimit.UseType("export." + tenant), Limit: 10, Window: countlimit.Fixed(time.Hour)}
		if _, err := limiter.Allow(context.Background(), exports, "user-1"); err != nil {
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
			if m.GetLabel()[1].GetValue() == "allowed" {
				fmt.Printf("rule=%q allowed: %v\n", m.GetLabel()[0].GetValue(), m.GetCounter().GetValue())
			}
		}
	}
	// Output:
	// rule="export.acme" allowed: 1
	// rule="export.globex" allowed: 1
	// rule="other" allowed: 2
}
