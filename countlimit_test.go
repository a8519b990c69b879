package countlimit_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testbackend"
)

func TestMain(m *testing.M) { testbackend.Main(m) }

// TestSeedScenarios walks the scenarios countlimit grew from, on every store.
func TestSeedScenarios(t *testing.T) {
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			store := b.Open(t)
			ctx := context.Background()
			// Friday 2026-05-15 22:00 in Shanghai.
			clock := storetest.NewClock(time.Date(2026, 5, 15, 22, 0, 0, 0, shanghai))
			l := countlimit.New(store, countlimit.WithClock(clock.Now))
			expect := func(what string, res countlimit.Result, err error, allowed bool) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if res.Allowed != allowed {
					t.Fatalf("%s: Allowed = %v, want %v (%+v)", what, res.Allowed, allowed, res)
				}
			}

			// Password changes: 3 per natural day in Shanghai.
			pw := countlimit.Rule{UseType: storetest.UseType(t, "password.change"), Limit: 3, Window: countlimit.Calendar(countlimit.Day, shanghai)}
			for i := range 3 {
				res, err := l.Allow(ctx, pw, "user-1")
				expect(fmt.Sprint("password change ", i+1), res, err, true)
			}
			res, err := l.Allow(ctx, pw, "user-1")
			expect("4th password change", res, err, false)
			if res.RetryAfter != 2*time.Hour {
				t.Errorf("4th password change at 22:00: RetryAfter = %v, want 2h (Shanghai midnight)", res.RetryAfter)
			}
			clock.Set(time.Date(2026, 5, 16, 0, 0, 0, 0, shanghai))
			res, err = l.Allow(ctx, pw, "user-1")
			expect("password change after midnight", res, err, true)

			// SMS codes: 2 per phone per 5 minutes, refunded when sending fails.
			sms := countlimit.Rule{UseType: storetest.UseType(t, "sms.code"), Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}
			res, err = l.Allow(ctx, sms, "+8618500000000")
			expect("sms 1", res, err, true)
			res, err = l.Allow(ctx, sms, "+8618500000000")
			expect("sms 2", res, err, true)
			if res, err = l.Refund(ctx, sms, "+8618500000000", 1); err != nil || res.Used != 1 {
				t.Fatalf("refund failed sms: %+v, %v", res, err)
			}
			res, err = l.Allow(ctx, sms, "+8618500000000")
			expect("sms 2 again after refund", res, err, true)
			res, err = l.Allow(ctx, sms, "+8618500000000")
			expect("sms 3", res, err, false)

			// Tiers: bronze 3/h, gold 8/h, same use type, limit per call.
			post := func(limit int64) countlimit.Rule {
				return countlimit.Rule{UseType: storetest.UseType(t, "post.create"), Limit: limit, Window: countlimit.Fixed(time.Hour)}
			}
			bronze, gold := post(3), post(8)
			for i := range 8 {
				res, err := l.Allow(ctx, gold, "gold-member")
				expect(fmt.Sprint("gold post ", i+1), res, err, true)
			}
			for i := range 3 {
				res, err := l.Allow(ctx, bronze, "bronze-member")
				expect(fmt.Sprint("bronze post ", i+1), res, err, true)
			}
			res, err = l.Allow(ctx, bronze, "bronze-member")
			expect("4th bronze post", res, err, false)

			// Login: 5 per 15 minutes, then 30 minutes in the penalty box.
			login := countlimit.Rule{UseType: storetest.UseType(t, "login"), Limit: 5, Window: countlimit.Rolling(15 * time.Minute), Block: 30 * time.Minute}
			for range 5 {
				res, err := l.Allow(ctx, login, "10.1.2.3")
				expect("login", res, err, true)
			}
			res, err = l.Allow(ctx, login, "10.1.2.3")
			expect("6th login", res, err, false)
			clock.Set(clock.Now().Add(20 * time.Minute))
			res, err = l.Allow(ctx, login, "10.1.2.3")
			expect("login after the window, inside the penalty", res, err, false)
			if res.RetryAfter != 10*time.Minute {
				t.Errorf("RetryAfter in the penalty = %v, want 10m", res.RetryAfter)
			}
			if err := l.Reset(ctx, login, "10.1.2.3"); err != nil {
				t.Fatal(err)
			}
			res, err = l.Allow(ctx, login, "10.1.2.3")
			expect("login after support unlocked the user", res, err, true)

			// Conversations: 10 per hour AND 50 per day, all or nothing.
			hour := countlimit.Rule{UseType: storetest.UseType(t, "conversation.hour"), Limit: 10, Window: countlimit.Fixed(time.Hour)}
			day := countlimit.Rule{UseType: storetest.UseType(t, "conversation.day"), Limit: 50, Window: countlimit.Calendar(countlimit.Day, shanghai)}
			allowed := 0
			for h := range 8 {
				clock.Set(time.Date(2026, 5, 16, 8+h, 0, 0, 0, shanghai))
				for range 12 {
					rs, err := l.AllowAll(ctx, "user-9", hour, day)
					if err != nil {
						t.Fatal(err)
					}
					if rs[0].Allowed {
						allowed++
					}
				}
			}
			if allowed != 50 {
				t.Errorf("conversations over 8 hours at 12 tries an hour: %d allowed, want 50", allowed)
			}
		})
	}
}

// TestStoresAgree drives every store through the same random calls and
// demands identical Results: the memory store is the reference.
func TestStoresAgree(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	bs := testbackend.Backends()
	stores := make([]driver.Store, 0, len(bs))
	names := make([]string, 0, len(bs))
	for _, b := range bs {
		t.Run("open "+b.Name, func(t *testing.T) {
			stores = append(stores, b.Open(t))
			names = append(names, b.Name)
		})
	}
	if len(stores) < 2 {
		t.Skip("only one store available: nothing to compare")
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	ut := func(s string) countlimit.UseType { return storetest.UseType(t, s) }
	rules := []countlimit.Rule{
		{UseType: ut("rolling"), Limit: 3, Window: countlimit.Rolling(10 * time.Second)},
		{UseType: ut("fixed"), Limit: 4, Window: countlimit.Fixed(7 * time.Second), Block: 5 * time.Second},
		{UseType: ut("day"), Limit: 6, Window: countlimit.Calendar(countlimit.Day, ny)},
		{UseType: ut("sliding"), Limit: 3, Window: countlimit.Sliding(9 * time.Second)},
		{UseType: ut("slidingblock"), Limit: 2, Window: countlimit.Sliding(4 * time.Second), Block: 3 * time.Second},
		{UseType: ut("lifetime"), Limit: 5, Window: countlimit.Lifetime()},
	}
	// The same use type under another kind of window: a changed rule.
	kindChange := rules[3]
	kindChange.Window = countlimit.Fixed(20 * time.Second)
	rules = append(rules, kindChange)
	clock := storetest.NewClock(time.Date(2026, 3, 7, 23, 59, 0, 0, ny)) // runs into the DST night
	ls := make([]*countlimit.Limiter, len(stores))
	for i, s := range stores {
		ls[i] = countlimit.New(s, countlimit.WithClock(clock.Now))
	}
	ctx := context.Background()
	ids := []string{"a", "b"}
	for step := range 600 {
		advance := time.Duration(rng.IntN(4000)) * time.Millisecond
		if rng.IntN(8) == 0 {
			// A late clock read: this caller read the clock a little
			// before the previous one but reached the store after it.
			advance = -time.Duration(rng.IntN(50)) * time.Millisecond
		}
		clock.Set(clock.Now().Add(advance))
		r := rules[rng.IntN(len(rules))]
		if rng.IntN(5) == 0 {
			r.Limit += int64(rng.IntN(3)) - 1
		}
		id := ids[rng.IntN(len(ids))]
		n := int64(1 + rng.IntN(3))
		op := rng.IntN(10)
		if op == 7 && rng.IntN(3) != 0 {
			op = 9 // resets are rarer than the other calls
		}
		other := rules[(indexOf(rules, r)+1+rng.IntN(len(rules)-1))%len(rules)]
		if other.UseType == r.UseType {
			other = rules[0]
			if r.UseType == other.UseType {
				other = rules[1]
			}
		}
		var desc string
		outs := make([]string, len(ls))
		for i, l := range ls {
			var res any
			var err error
			switch {
			case op < 5:
				desc = fmt.Sprintf("AllowN(%s, %s, %d)", r.UseType, id, n)
				res, err = l.AllowN(ctx, r, id, n)
			case op < 6:
				desc = fmt.Sprintf("Peek(%s, %s)", r.UseType, id)
				res, err = l.Peek(ctx, r, id)
			case op < 7:
				desc = fmt.Sprintf("Refund(%s, %s, %d)", r.UseType, id, n)
				res, err = l.Refund(ctx, r, id, n)
			case op < 8:
				desc = fmt.Sprintf("Reset(%s, %s)", r.UseType, id)
				err = l.Reset(ctx, r, id)
			default:
				desc = fmt.Sprintf("AllowAll(%s, %s, %s)", id, r.UseType, other.UseType)
				res, err = l.AllowAll(ctx, id, r, other)
			}
			if err != nil {
				t.Fatalf("seed %d step %d: %s on %s: %v", seed, step, desc, names[i], err)
			}
			outs[i] = fmt.Sprintf("%+v", normalize(res))
		}
		for i := 1; i < len(outs); i++ {
			if outs[i] != outs[0] {
				t.Fatalf("seed %d step %d at %s: %s\n%s: %s\n%s: %s", seed, step, clock.Now().Format(time.RFC3339Nano), desc,
					names[0], outs[0], names[i], outs[i])
			}
		}
	}
}

// indexOf returns the index of r in rules by UseType.
func indexOf(rules []countlimit.Rule, r countlimit.Rule) int {
	for i := range rules {
		if rules[i].UseType == r.UseType {
			return i
		}
	}
	return 0
}

// normalize prints times in UTC so equal instants print alike.
func normalize(v any) any {
	switch r := v.(type) {
	case countlimit.Result:
		r.ResetAt, r.BlockedUntil = r.ResetAt.UTC(), r.BlockedUntil.UTC()
		return r
	case []countlimit.Result:
		out := make([]countlimit.Result, len(r))
		for i := range r {
			out[i] = normalize(r[i]).(countlimit.Result)
		}
		return out
	}
	return v
}
