package countlimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
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
