package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// manyRules returns k rules of every countable kind in turn (several
// sliding ones from k = 6 on), each its own use type. The last rule has
// the lowest limit, 3, and a penalty; the others allow 4 and more.
func manyRules(t *testing.T, k int) []countlimit.Rule {
	amman := mustLoad(t, "Asia/Amman")
	ny := mustLoad(t, "America/New_York")
	windows := []countlimit.Window{
		countlimit.Fixed(time.Hour),
		countlimit.Sliding(30 * time.Minute),
		countlimit.Rolling(10 * time.Minute),
		countlimit.Calendar(countlimit.Day, amman),
		countlimit.Sliding(2 * time.Hour),
		countlimit.Lifetime(),
		countlimit.Calendar(countlimit.Month, ny),
	}
	rules := make([]countlimit.Rule, k)
	for j := range rules {
		rules[j] = countlimit.Rule{
			UseType: UseType(t, fmt.Sprintf("many%d.%d", k, j)),
			Limit:   int64(4 + j%5),
			Window:  windows[j%len(windows)],
		}
	}
	rules[k-1].Limit, rules[k-1].Block = 3, time.Hour
	return rules
}

// testAllowAllOfEverySize: AllowAll with 1 to 8 rules, and with 64
// (expose.MaxRules), of every countable kind mixed, is all or
// nothing: the lowest limit's events are counted under every rule, the
// next call under none, and only the rule that denies sets its penalty;
// one rule more than 64 (the bound) is ErrInvalid naming the rules.
func testAllowAllOfEverySize(t *testing.T, newStore func(*testing.T) driver.Store) {
	for _, k := range []int{1, 2, 3, 4, 5, 6, 7, 8, expose.MaxRules} {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			e := newEnv(t, newStore)
			rules := manyRules(t, k)
			id := "many"
			for i := range 3 {
				e.clock.Set(at(sec(i)))
				for j, r := range e.allowAll(id, rules...) {
					if !r.Allowed || r.Used != int64(i+1) || r.Remaining != rules[j].Limit-int64(i+1) {
						t.Fatalf("call %d, result %d (%v): %+v; want allowed, Used %d", i+1, j, rules[j].Window, r, i+1)
					}
				}
			}
			e.clock.Set(at(sec(10)))
			until := at(sec(10) + time.Hour)
			res := e.allowAll(id, rules...)
			// One RetryAfter for the whole call: the penalty's hour, or -1
			// when the rule that denies is a full Lifetime one.
			for j, r := range res {
				want := time.Time{}
				if j == k-1 {
					want = until
				}
				if r.Allowed || r.Used != 3 || !r.BlockedUntil.Equal(want) || r.RetryAfter != res[0].RetryAfter || r.RetryAfter == 0 {
					t.Errorf("4th call, result %d (%v): %+v; want denied, Used 3, BlockedUntil %s, one RetryAfter for all",
						j, rules[j].Window, r, fmtTime(want))
				}
			}
			for j, r := range rules {
				got, err := e.l.Peek(e.ctx, r, id)
				if err != nil {
					t.Fatal(err)
				}
				if got.Used != 3 {
					t.Errorf("Peek of rule %d (%v) after the denial: Used %d, want 3: the denied call counted", j, r.Window, got.Used)
				}
			}
		})
	}
	t.Run("TooMany", func(t *testing.T) {
		e := newEnv(t, newStore)
		rules := manyRules(t, expose.MaxRules+1)
		_, err := e.l.AllowAll(e.ctx, "many", rules...)
		if !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "rules") {
			t.Fatalf("AllowAll with %d rules = %v; want ErrInvalid naming the rules", len(rules), err)
		}
		for j, r := range rules[:3] {
			if got, err := e.l.Peek(e.ctx, r, "many"); err != nil || got.Used != 0 {
				t.Errorf("Peek of rule %d after the refused call = %+v, %v; want nothing counted", j, got, err)
			}
		}
	})
}

// testConcurrentAllowAllMany: 32 goroutines make AllowAll calls of 8 mixed
// rules (3 sliding), each goroutine naming them in another order: none
// deadlocks, and exactly the lowest limit's worth is counted under every
// rule.
func testConcurrentAllowAllMany(t *testing.T, newStore func(*testing.T) driver.Store) {
	clock := NewClock(t0)
	ls := []*countlimit.Limiter{
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
	}
	rules := manyRules(t, 8)
	rules[1].Window = countlimit.Sliding(time.Hour)
	for j := range rules {
		rules[j].Limit = int64(40 + 3*j)
	}
	rules[5].Limit = 37
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	allowed := hammer(t, 32, 4, func(g int) (bool, error) {
		order := append(append([]countlimit.Rule(nil), rules[g%len(rules):]...), rules[:g%len(rules)]...)
		res, err := ls[g%2].AllowAll(ctx, "octet", order...)
		if err != nil {
			return false, err
		}
		return res[0].Allowed, nil
	})
	if allowed != 37 {
		t.Errorf("%d allowed, want exactly 37", allowed)
	}
	for _, r := range rules {
		got, err := ls[0].Peek(ctx, r, "octet")
		if err != nil {
			t.Fatal(err)
		}
		if got.Used != 37 {
			t.Errorf("%s (%v) Used = %d, want 37", r.UseType, r.Window, got.Used)
		}
	}
}
