package memstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// useTypes returns n rules of a fixed window, each of a use type of its
// own.
func useTypes(n int, limit int64) []countlimit.Rule {
	rules := make([]countlimit.Rule, n)
	for i := range rules {
		rules[i] = countlimit.Rule{UseType: countlimit.UseType(fmt.Sprint("ut-", i)), Limit: limit, Window: countlimit.Fixed(time.Hour)}
	}
	return rules
}

// TestOneIDsUseTypesShareTheBound: the counters of one id with very many
// use types (use types a caller chooses) spread over the shards as the
// counters of many ids do, so they fill half the store's bound without a
// single ErrFull.
func TestOneIDsUseTypesShareTheBound(t *testing.T) {
	t.Parallel()
	const max = 4 << 20
	s := memstore.New(memstore.WithMaxBytes(max), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	ctx := context.Background()
	for i := 0; s.Bytes() < max/2; i++ {
		rule := countlimit.Rule{UseType: countlimit.UseType(fmt.Sprint("ut-", i)), Limit: 5, Window: countlimit.Fixed(time.Hour)}
		if r, err := l.Allow(ctx, rule, "one-id"); err != nil || !r.Allowed {
			t.Fatalf("Allow of use type %d of one id, %d of %d bytes accounted = %+v, %v; want allowed", i, s.Bytes(), max, r, err)
		}
	}
}

// TestAllowAllAcrossShardsConcurrent: AllowAll calls of 16 rules in
// orders of their own, whose counters lie in every one of 4 shards, and of
// new ids in a store that refuses some of them, beside sweeps: none waits
// for another in a cycle, exactly the lowest limit's worth is counted under
// every rule, and a refused call counts nothing under any.
func TestAllowAllAcrossShardsConcurrent(t *testing.T) {
	t.Parallel()
	const goroutines, tries = 32, 4
	// Room in each shard for all of one-id's counters, and in all for half
	// the new ids' at most.
	s := memstore.New(memstore.WithShards(4), memstore.WithMaxEntries(4*16), memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() })
	l := countlimit.New(s)
	ctx := context.Background()
	rules := useTypes(16, 0)
	for j := range rules {
		rules[j].Limit = int64(40 + j)
	}
	rules[9].Limit = 37
	fresh := useTypes(3, 1)
	if _, err := l.AllowAll(ctx, "one-id", rules...); err != nil { // its counters before the new ids fill the store
		t.Fatal(err)
	}
	stop, swept := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(swept)
		for {
			select {
			case <-stop:
				return
			default:
				memstore.Sweep(s)
			}
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed, full := 1, 0
	for g := range goroutines {
		wg.Go(func() {
			order := append(append([]countlimit.Rule(nil), rules[g%len(rules):]...), rules[:g%len(rules)]...)
			for range tries {
				res, err := l.AllowAll(ctx, "one-id", order...)
				if err != nil {
					t.Error(err)
					return
				}
				_, err = l.AllowAll(ctx, fmt.Sprint("new-", g), fresh[g%3], fresh[(g+1)%3], fresh[(g+2)%3])
				mu.Lock()
				if res[0].Allowed {
					allowed++
				}
				if isFull(err) {
					full++
				} else if err != nil {
					t.Error(err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(stop)
	<-swept
	if allowed != 37 {
		t.Errorf("%d allowed, want exactly 37", allowed)
	}
	for _, r := range rules {
		if got, err := l.Peek(ctx, r, "one-id"); err != nil || got.Used != 37 {
			t.Errorf("Peek(%s) = Used %d, %v; want 37", r.UseType, got.Used, err)
		}
	}
	if full == 0 {
		t.Error("no AllowAll of a new id was refused: the store's cap was never reached")
	}
	for g := range goroutines {
		id := fmt.Sprint("new-", g)
		var used []int64
		for _, r := range fresh {
			got, err := l.Peek(ctx, r, id)
			if err != nil {
				t.Fatal(err)
			}
			used = append(used, got.Used)
		}
		if used[0] != used[1] || used[1] != used[2] {
			t.Errorf("%s: Used %v under its three rules, want all or none counted", id, used)
		}
	}
}

// BenchmarkAllowUseTypesPerID is Allow on an id that 1, 10 or 20 000 use
// types count (all held), each call on the next of 10 of them (of its one
// with use-types=1), made first, last and evenly between: its cost must not
// grow with the id's other use types. The calls touch the same 10 counters
// however many the id has, so the figures compare lookups, not the cache
// misses of a larger working set. docs/benchmarks.md has the figures.
func BenchmarkAllowUseTypesPerID(b *testing.B) {
	for _, n := range []int{1, 10, 20000} {
		b.Run(fmt.Sprint("use-types=", n), func(b *testing.B) {
			s := memstore.New(memstore.WithJanitorInterval(0))
			defer s.Close()
			l := countlimit.New(s)
			ctx := context.Background()
			rules := useTypes(n, expose.MaxLimit)
			for _, r := range rules {
				if _, err := l.Allow(ctx, r, "user-1"); err != nil {
					b.Fatal(err)
				}
			}
			var hot []countlimit.Rule
			for i := range min(n, 10) {
				hot = append(hot, rules[i*(n-1)/max(1, min(n, 10)-1)])
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := l.Allow(ctx, hot[i], "user-1"); err != nil {
					b.Fatal(err)
				}
				if i++; i == len(hot) {
					i = 0
				}
			}
		})
	}
}
