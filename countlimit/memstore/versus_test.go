package memstore_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"golang.org/x/time/rate"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// BenchmarkVersusRate runs golang.org/x/time/rate's Allow and Limiter.Allow
// on a memstore side by side, on an existing key that never runs out, with
// one goroutine and with two on different ids (one rate.Limiter each, and
// ids in different shards). ns/op is wall time over all goroutines, so the
// throughput of two against one is ns/op(1) / ns/op(2).
func BenchmarkVersusRate(b *testing.B) {
	for _, g := range []int{1, 2} {
		b.Run(fmt.Sprintf("rate/goroutines=%d", g), func(b *testing.B) {
			lims := make([]*paddedRate, g)
			for i := range lims {
				lims[i] = new(paddedRate)
				lims[i].SetLimit(math.MaxInt32)
				lims[i].SetBurst(math.MaxInt32)
			}
			goroutines(b, g, func(i int) bool { return lims[i].Allow() })
		})
	}
	for _, g := range []int{1, 2} {
		b.Run(fmt.Sprintf("memstore/goroutines=%d", g), func(b *testing.B) {
			s := memstore.New()
			defer s.Close()
			l := countlimit.New(s)
			ctx := context.Background()
			rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
			ids := make([]string, 0, g)
			for i := 0; len(ids) < g; i++ {
				id := fmt.Sprint("user-", i)
				if len(ids) == 0 || !memstore.SameShard(s, string(rule.UseType), ids[0], id) {
					ids = append(ids, id)
				}
			}
			for _, id := range ids {
				if _, err := l.Allow(ctx, rule, id); err != nil {
					b.Fatal(err)
				}
			}
			goroutines(b, g, func(i int) bool {
				r, err := l.Allow(ctx, rule, ids[i])
				return err == nil && r.Allowed
			})
		})
	}
}

// paddedRate keeps two goroutines' rate.Limiters off one cache line, so
// the baseline is not slowed by false sharing.
type paddedRate struct {
	rate.Limiter
	_ [128]byte
}

// goroutines runs b.N calls of op split over n goroutines, op(i) on the
// i-th, and fails b if any call returns false.
func goroutines(b *testing.B, n int, op func(i int) bool) {
	b.ReportAllocs()
	var wg sync.WaitGroup
	failed := make([]bool, n)
	b.ResetTimer()
	for i := range n {
		calls := b.N / n
		if i < b.N%n {
			calls++
		}
		wg.Go(func() {
			for range calls {
				if !op(i) {
					failed[i] = true
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	for i, f := range failed {
		if f {
			b.Fatalf("goroutine %d: a call was not allowed", i)
		}
	}
}

// BenchmarkDo is the store's own share of Allow: one prepared request on an
// existing key, without the Limiter.
func BenchmarkDo(b *testing.B) {
	s := memstore.New()
	defer s.Close()
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond)
	begin := now.Truncate(time.Hour).UTC()
	c := driver.Check{UseType: "api", Limit: expose.MaxLimit, Begin: begin, End: begin.Add(time.Hour)}
	req := &driver.Request{Op: driver.OpAllow, ID: "user-1", Now: now, N: 1, Checks: []driver.Check{c}}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Do(ctx, req); err != nil || !req.Checks[0].State.Allowed {
			b.Fatal(err)
		}
	}
}

// BenchmarkDoThroughModel is BenchmarkDo for a store that decides with the
// reference model: a map of model.Keys under a mutex, model.Apply on the
// key, the keys' slice kept from call to call. Against BenchmarkDo it is
// what memstore's own copy of the decision saves (docs/ARCHITECTURE.md).
func BenchmarkDoThroughModel(b *testing.B) {
	type key struct{ useType, id string }
	var mu sync.Mutex
	keys := map[key]*model.Key{}
	now := time.Now().Truncate(time.Microsecond)
	begin := now.Truncate(time.Hour).UTC()
	c := driver.Check{UseType: "api", Limit: expose.MaxLimit, Begin: begin, End: begin.Add(time.Hour)}
	req := &driver.Request{Op: driver.OpAllow, ID: "user-1", Now: now, N: 1, Checks: []driver.Check{c}}
	ks := make([]*model.Key, 1)
	b.ReportAllocs()
	for b.Loop() {
		mu.Lock()
		k := keys[key{req.Checks[0].UseType, req.ID}]
		if k == nil {
			k = &model.Key{}
			keys[key{req.Checks[0].UseType, req.ID}] = k
		}
		ks[0] = k
		model.Apply(req, ks)
		mu.Unlock()
		if !req.Checks[0].State.Allowed {
			b.Fatal("denied")
		}
	}
}

// BenchmarkSmoothVersusRate runs a Smooth rule's Allow on a memstore
// against golang.org/x/time/rate as users write one limiter per key: a
// map of *rate.Limiter under a mutex, the key's limiter made on first
// use, then its Allow. Both have the same rate and burst (a million a
// second, bursts of a billion: no call is denied) and take calls for
// 1024 keys in turn, every key existing, with one goroutine and with two
// (each on its own half of the keys, as two requests at once are mostly
// of two users).
func BenchmarkSmoothVersusRate(b *testing.B) {
	const keys = 1024
	ids := make([]string, keys)
	for i := range ids {
		ids[i] = fmt.Sprint("user-", i)
	}
	const perSecond, burst = 1_000_000, 1_000_000_000
	for _, g := range []int{1, 2} {
		b.Run(fmt.Sprintf("rate/goroutines=%d", g), func(b *testing.B) {
			var mu sync.Mutex
			lims := map[string]*rate.Limiter{}
			allow := func(id string) bool {
				mu.Lock()
				l := lims[id]
				if l == nil {
					l = rate.NewLimiter(perSecond, burst)
					lims[id] = l
				}
				mu.Unlock()
				return l.Allow()
			}
			for _, id := range ids {
				allow(id)
			}
			next := make([]int, g)
			goroutines(b, g, func(i int) bool {
				next[i] = (next[i] + g) % keys
				return allow(ids[next[i]+i])
			})
		})
		b.Run(fmt.Sprintf("memstore/goroutines=%d", g), func(b *testing.B) {
			s := memstore.New()
			defer s.Close()
			l := countlimit.New(s)
			ctx := context.Background()
			rule := countlimit.Rule{UseType: "api", Limit: perSecond, Window: countlimit.Smooth(time.Second, burst)}
			for _, id := range ids {
				if _, err := l.Allow(ctx, rule, id); err != nil {
					b.Fatal(err)
				}
			}
			next := make([]int, g)
			goroutines(b, g, func(i int) bool {
				next[i] = (next[i] + g) % keys
				r, err := l.Allow(ctx, rule, ids[next[i]+i])
				return err == nil && r.Allowed
			})
		})
	}
}
