package redisstore_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisserver"
)

var pexpireCalls = regexp.MustCompile(`(?m)^cmdstat_pexpire:calls=(\d+),`)

// pexpires reads how many PEXPIREs the server has run, scripts' included.
func pexpires(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := pexpireCalls.FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestSmoothDenialLeavesTheTTL: a denial of a smooth rule changes neither
// the instant nor (without a new penalty) anything the hash's TTL follows,
// so it sends no PEXPIRE, through fast.lua (one rule) and apply.lua
// (AllowAll), but the one that makes a key kept as a string its hash
// (smoothkey.lua), which keeps the TTL the key had; a denial that creates
// the hash, or sets a penalty, does, and the hash then expires. On a
// private server, whose command counts are this test's alone.
func TestSmoothDenialLeavesTheTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redisserver.Start(t, "--save", "", "--appendonly", "no")
	c := srv.Client(t)
	l := countlimit.New(redisstore.New(c))
	smooth := countlimit.Rule{UseType: "api.smooth", Limit: 1, Window: countlimit.Smooth(time.Hour, 2)}
	other := countlimit.Rule{UseType: "api.other", Limit: 1, Window: countlimit.Smooth(time.Hour, 1)}
	blocking := countlimit.Rule{UseType: "api.blocking", Limit: 1, Window: countlimit.Smooth(time.Hour, 1), Block: time.Hour}

	denials := func(what string, want int, call func() (bool, error)) {
		t.Helper()
		before := pexpires(t, c)
		allowed, err := call()
		if err != nil || allowed {
			t.Fatalf("%s: allowed %v, %v; want a denial", what, allowed, err)
		}
		if got := pexpires(t, c) - before; got != want {
			t.Errorf("%s: %d PEXPIREs, want %d", what, got, want)
		}
	}
	allow := func(r countlimit.Rule, id string, n int64) func() (bool, error) {
		return func() (bool, error) {
			res, err := l.AllowN(ctx, r, id, n)
			return res.Allowed, err
		}
	}
	for range 2 {
		if res, err := l.Allow(ctx, smooth, "k1"); err != nil || !res.Allowed {
			t.Fatalf("Allow within the burst: %+v, %v", res, err)
		}
	}
	if res, err := l.Allow(ctx, other, "k1"); err != nil || !res.Allowed {
		t.Fatalf("Allow within the burst: %+v, %v", res, err)
	}
	// kept checks that the key of r and id, made a hash by a denial, keeps
	// the TTL it had as a string (less the time since, at most a second).
	kept := func(r countlimit.Rule, id string, call func() (bool, error)) func() (bool, error) {
		return func() (bool, error) {
			k := redisstore.Key(r.UseType, id)
			if typ := c.Type(ctx, k).Val(); typ != "string" {
				t.Errorf("%s after an Allow: a %s, want a string", k, typ)
			}
			before := c.PTTL(ctx, k).Val()
			allowed, err := call()
			if typ := c.Type(ctx, k).Val(); typ != "hash" {
				t.Errorf("%s after a denial: a %s, want a hash", k, typ)
			}
			if after := c.PTTL(ctx, k).Val(); after > before || after < before-time.Second {
				t.Errorf("%s made a hash: PTTL %v, want the %v it had as a string", k, after, before)
			}
			return allowed, err
		}
	}
	denials("fast.lua, a drained-later key denied, made a hash", 1, kept(smooth, "k1", allow(smooth, "k1", 1)))
	denials("fast.lua, denied again", 0, allow(smooth, "k1", 1))
	denials("apply.lua, both rules denied, one key made a hash", 1, kept(other, "k1", func() (bool, error) {
		rs, err := l.AllowAll(ctx, "k1", smooth, other)
		return len(rs) > 0 && rs[0].Allowed, err
	}))
	denials("apply.lua, both rules denied again", 0, func() (bool, error) {
		rs, err := l.AllowAll(ctx, "k1", smooth, other)
		return len(rs) > 0 && rs[0].Allowed, err
	})
	denials("fast.lua, a new key denied (weight above the burst)", 1, allow(smooth, "k2", 3))
	// It expires once the grace is over (1 ms and the grace: it holds
	// only the denial); what it must not be is kept for good (-1).
	if ttl := c.PTTL(ctx, redisstore.Key(smooth.UseType, "k2")).Val(); ttl == -1 || ttl > time.Millisecond+redisstore.ExpiryGrace {
		t.Errorf("the hash a denial made: PTTL %v, want it expiring within 1 ms and the grace", ttl)
	}
	if res, err := l.Allow(ctx, blocking, "k3"); err != nil || !res.Allowed {
		t.Fatalf("Allow within the burst: %+v, %v", res, err)
	}
	denials("fast.lua, a denial that sets a penalty (and makes the key a hash)", 2, allow(blocking, "k3", 1))
	denials("fast.lua, denied inside the penalty", 0, allow(blocking, "k3", 1))
	if ttl := c.PTTL(ctx, redisstore.Key(blocking.UseType, "k3")).Val(); ttl < 59*time.Minute {
		t.Errorf("a penalized hash: PTTL %v, want the hour of its penalty", ttl)
	}
}
