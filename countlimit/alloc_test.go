package countlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// TestHotPathAllocatesNothing: a single-rule call through a memstore on a
// key it already holds allocates nothing, for every window kind, allowed or
// denied, with the failure options that need no per-call context.
func TestHotPathAllocatesNothing(t *testing.T) {
	shanghai, err := time.LoadLocation("Asia/Shanghai") // from time/tzdata where the system has none
	if err != nil {
		t.Fatal(err)
	}
	// The clock moves 1s per read, so windows roll over and sliding logs
	// drop events as they would in service.
	at := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	clock := countlimit.WithClock(func() time.Time { at = at.Add(time.Second); return at })
	many := int64(expose.MaxLimit)
	fallback := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { fallback.Close() })
	tests := []struct {
		name string
		rule countlimit.Rule
		opts []countlimit.Option
		call func(l *countlimit.Limiter, r countlimit.Rule) (countlimit.Result, error)
	}{
		{name: "Allow fixed", rule: countlimit.Rule{Limit: many, Window: countlimit.Fixed(time.Minute)}},
		{name: "Allow rolling", rule: countlimit.Rule{Limit: many, Window: countlimit.Rolling(time.Minute)}},
		{name: "Allow calendar", rule: countlimit.Rule{Limit: many, Window: countlimit.Calendar(countlimit.Day, shanghai)}},
		{name: "Allow sliding", rule: countlimit.Rule{Limit: 100, Window: countlimit.Sliding(10 * time.Second)}},
		{name: "Allow lifetime", rule: countlimit.Rule{Limit: many, Window: countlimit.Lifetime()}},
		{name: "Allow smooth", rule: countlimit.Rule{Limit: 1000, Window: countlimit.Smooth(time.Second, 5000)}},
		{name: "Allow denied, smooth", rule: countlimit.Rule{Limit: 1, Window: countlimit.Smooth(time.Hour, 1)}},
		{name: "AllowN then Refund, smooth", rule: countlimit.Rule{Limit: 10, Window: countlimit.Smooth(time.Second, 5)},
			call: func(l *countlimit.Limiter, r countlimit.Rule) (countlimit.Result, error) {
				if _, err := l.AllowN(context.Background(), r, "user-1", 2); err != nil {
					return countlimit.Result{}, err
				}
				return l.Refund(context.Background(), r, "user-1", 2)
			}},
		{name: "Allow denied, penalty", rule: countlimit.Rule{Limit: 0, Window: countlimit.Fixed(time.Minute), Block: time.Hour}},
		{name: "Allow denied, sliding", rule: countlimit.Rule{Limit: 1, Window: countlimit.Sliding(time.Hour)}},
		{name: "Peek", rule: countlimit.Rule{Limit: 5, Window: countlimit.Fixed(time.Hour)},
			call: func(l *countlimit.Limiter, r countlimit.Rule) (countlimit.Result, error) {
				return l.Peek(context.Background(), r, "user-1")
			}},
		{name: "AllowN then Refund", rule: countlimit.Rule{Limit: 5, Window: countlimit.Fixed(time.Hour)},
			call: func(l *countlimit.Limiter, r countlimit.Rule) (countlimit.Result, error) {
				if _, err := l.AllowN(context.Background(), r, "user-1", 2); err != nil {
					return countlimit.Result{}, err
				}
				return l.Refund(context.Background(), r, "user-1", 2)
			}},
		{name: "circuit breaker and fallback", rule: countlimit.Rule{Limit: many, Window: countlimit.Fixed(time.Minute)},
			opts: []countlimit.Option{countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{}), countlimit.WithFallback(fallback)}},
		{name: "store clock", rule: countlimit.Rule{Limit: many, Window: countlimit.Fixed(time.Minute)},
			opts: []countlimit.Option{countlimit.WithStoreClock(time.Hour)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := memstore.New(memstore.WithJanitorInterval(0))
			defer s.Close()
			l := countlimit.New(s, append([]countlimit.Option{clock}, tt.opts...)...)
			r := tt.rule
			r.UseType = "api"
			call := tt.call
			if call == nil {
				call = func(l *countlimit.Limiter, r countlimit.Rule) (countlimit.Result, error) {
					return l.Allow(context.Background(), r, "user-1")
				}
			}
			for range 200 { // the key, and a sliding log at its full length
				if _, err := call(l, r); err != nil {
					t.Fatal(err)
				}
			}
			allocs := testing.AllocsPerRun(1000, func() {
				if _, err := call(l, r); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("%v allocations per call, want 0", allocs)
			}
		})
	}
}
