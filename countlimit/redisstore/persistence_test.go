//go:build unix

package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisserver"
)

// TestRestart runs private servers with each kind of persistence, fills
// an id's counter, sliding log, penalty and lease, and restarts the
// server: one that persists nothing (as this project's test servers run)
// forgets them all and admits the id again, even after a clean shutdown;
// snapshots keep what the last one saved, so a kill before the first one
// loses everything and a clean shutdown, which saves, nothing; AOF with
// appendfsync always keeps every write that was answered. CheckPersistence
// says which servers persist nothing.
func TestRestart(t *testing.T) {
	t.Parallel()
	none := []string{"--save", "", "--appendonly", "no"}
	// No snapshot falls due during the test: one write an hour.
	rdb := []string{"--save", "3600 1", "--appendonly", "no"}
	aof := []string{"--save", "", "--appendonly", "yes", "--appendfsync", "always"}
	for _, tc := range []struct {
		name    string
		args    []string
		crash   bool // SIGKILL, else SIGTERM (a clean shutdown)
		persist bool // CheckPersistence is nil
		keeps   bool // the id's state outlives the restart
	}{
		{"nothing, killed", none, true, false, false},
		{"nothing, shut down", none, false, false, false},
		{"snapshots, killed before the first", rdb, true, true, false},
		{"snapshots, shut down", rdb, false, true, true},
		{"AOF fsync always, killed", aof, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			srv := redisserver.Start(t, tc.args...)
			err := redisstore.New(srv.Client(t)).CheckPersistence(ctx)
			if tc.persist && err != nil || !tc.persist && err != redisstore.ErrNoPersistence {
				want := "nil"
				if !tc.persist {
					want = "ErrNoPersistence"
				}
				t.Fatalf("CheckPersistence = %v, want %s", err, want)
			}

			// The Limiter's clock moves only as the test says: every key
			// lives an hour of real time, far beyond the restart. After
			// it, two minutes on, the penalty's window has ended and the
			// penalty alone denies.
			now := time.Now().UTC().Truncate(time.Second)
			clock := func() time.Time { return now }
			fill(t, countlimit.New(redisstore.New(srv.Client(t)), countlimit.WithClock(clock)))

			if tc.crash {
				srv.Kill(t)
			} else {
				srv.Stop(t)
			}
			srv.Run(t)

			now = now.Add(2 * time.Minute)
			// A new client: the old one's connections died with the server.
			c := srv.Client(t)
			if tc.keeps {
				// A restored key keeps its expiry: it still ends with its
				// window, an hour on (and the grace).
				ttl, err := c.PTTL(ctx, redisstore.Key(restartCount.UseType, "user-1")).Result()
				if err != nil || ttl <= 0 || ttl > time.Hour+redisstore.ExpiryGrace {
					t.Errorf("PTTL of the counter after the restart = %v, %v; want (0, 1h + %v]", ttl, err, redisstore.ExpiryGrace)
				}
			}
			l := countlimit.New(redisstore.New(c), countlimit.WithClock(clock))
			for _, f := range full {
				res, err := f.next(ctx, l)
				if err != nil {
					t.Fatalf("%s after the restart: %v", f.name, err)
				}
				if res.Allowed == tc.keeps {
					t.Errorf("%s after the restart: allowed %v, want %v; %+v", f.name, res.Allowed, !tc.keeps, res)
				}
			}
		})
	}
}

// full is what fill leaves full for the id "user-1", each with the call
// that it then denies.
var full = []struct {
	name string
	next func(context.Context, *countlimit.Limiter) (countlimit.Result, error)
}{
	{"the counter", func(ctx context.Context, l *countlimit.Limiter) (countlimit.Result, error) {
		return l.Allow(ctx, restartCount, "user-1")
	}},
	{"the sliding log", func(ctx context.Context, l *countlimit.Limiter) (countlimit.Result, error) {
		return l.Allow(ctx, restartSliding, "user-1")
	}},
	{"the penalty", func(ctx context.Context, l *countlimit.Limiter) (countlimit.Result, error) {
		return l.Allow(ctx, restartPenalty, "user-1")
	}},
	{"the lease", func(ctx context.Context, l *countlimit.Limiter) (countlimit.Result, error) {
		_, res, err := l.Acquire(ctx, restartLease, "user-1")
		return res, err
	}},
}

var (
	restartCount   = countlimit.Rule{UseType: "restart.count", Limit: 2, Window: countlimit.Rolling(time.Hour)}
	restartSliding = countlimit.Rule{UseType: "restart.sliding", Limit: 2, Window: countlimit.Sliding(time.Hour)}
	restartPenalty = countlimit.Rule{UseType: "restart.penalty", Limit: 5, Window: countlimit.Rolling(time.Minute), Block: time.Hour}
	restartLease   = countlimit.Rule{UseType: "restart.lease", Limit: 1, Window: countlimit.Concurrent(time.Hour)}
)

// fill leaves "user-1" no room under each rule of full: the counter and
// the sliding log at their limits, the id in the penalty box, the one
// lease held; and shows each denies.
func fill(t *testing.T, l *countlimit.Limiter) {
	t.Helper()
	ctx := context.Background()
	for _, r := range []countlimit.Rule{restartCount, restartSliding, restartPenalty} {
		if res, err := l.AllowN(ctx, r, "user-1", r.Limit); err != nil || !res.Allowed {
			t.Fatalf("%s: AllowN(%d) = %+v, %v; want allowed", r.UseType, r.Limit, res, err)
		}
	}
	if _, res, err := l.Acquire(ctx, restartLease, "user-1"); err != nil || !res.Allowed {
		t.Fatalf("%s: Acquire = %+v, %v; want allowed", restartLease.UseType, res, err)
	}
	for _, f := range full {
		if res, err := f.next(ctx, l); err != nil || res.Allowed {
			t.Fatalf("%s before the restart = %+v, %v; want denied", f.name, res, err)
		}
	}
	if res, err := l.Peek(ctx, restartPenalty, "user-1"); err != nil || res.BlockedUntil.IsZero() {
		t.Fatalf("%s: Peek after a denial = %+v, %v; want blocked", restartPenalty.UseType, res, err)
	}
}

// TestChecksWithoutConfigPermission: a private server's ACL user without
// +config gets ErrPolicyUnknown with the server's NOPERM from both checks,
// and its store works.
func TestChecksWithoutConfigPermission(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redisserver.Start(t, "--save", "", "--appendonly", "no")
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "app", "on", ">app-password", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "app-password"})
	defer c.Close()
	s := redisstore.New(c)
	for name, check := range map[string]func(context.Context) error{"CheckEviction": s.CheckEviction, "CheckPersistence": s.CheckPersistence} {
		err := check(ctx)
		if !errors.Is(err, redisstore.ErrPolicyUnknown) || errors.Is(err, countlimit.ErrUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%s as a user without +config = %v, want ErrPolicyUnknown with the server's NOPERM", name, err)
		}
	}
	rule := countlimit.Rule{UseType: storetest.UseType(t, "policy"), Limit: 1, Window: countlimit.Fixed(time.Hour)}
	if r, err := countlimit.New(s).Allow(ctx, rule, "acl"); err != nil || !r.Allowed {
		t.Errorf("Allow as a user without +config = %+v, %v; want allowed", r, err)
	}
}
