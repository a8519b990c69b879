package promlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/promlimit"
)

// BenchmarkAllow is Allow on a memstore key it holds: without an
// observer, with one told only decisions and one told store calls too
// (timed) whose funcs do nothing, and with promlimit's; serially and from
// every CPU. docs/benchmarks.md has the ratios.
func BenchmarkAllow(b *testing.B) {
	rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	for _, tt := range []struct {
		name string
		opts []countlimit.Option
	}{
		{"none", nil},
		{"observer=decided", []countlimit.Option{countlimit.WithObserver(countlimit.Observer{
			Decided: func(countlimit.Decision) {},
		})}},
		{"observer=nop", []countlimit.Option{countlimit.WithObserver(countlimit.Observer{
			Decided:     func(countlimit.Decision) {},
			StoreCalled: func(countlimit.StoreCall) {},
		})}},
		{"observer=promlimit", []countlimit.Option{countlimit.WithObserver(promlimit.New().Observer())}},
	} {
		newLimiter := func(b *testing.B) *countlimit.Limiter {
			s := memstore.New(memstore.WithJanitorInterval(0))
			b.Cleanup(func() { s.Close() })
			return countlimit.New(s, tt.opts...)
		}
		b.Run(tt.name, func(b *testing.B) {
			l := newLimiter(b)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Allow(ctx, rule, "user-1"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tt.name+"/parallel", func(b *testing.B) {
			l := newLimiter(b)
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = "user-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				i := 0
				for pb.Next() {
					if _, err := l.Allow(ctx, rule, ids[i%len(ids)]); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}
