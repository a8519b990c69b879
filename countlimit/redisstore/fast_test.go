package redisstore_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

var fastSeed = flag.Uint64("fastseed", 0, "TestFastScriptIsApplyForOneRule: replay this seed (0: a new one)")

// TestFastScriptIsApplyForOneRule runs fast.lua and apply.lua side by side
// on two keys, with the same random Allows of one rule that is not sliding
// (fixed, rolling and lifetime windows, limits that change, up to 2^53,
// weights, penalties, a clock that sometimes steps back), and demands the
// same reply, the same hash, the same TTL and the same kept reply after
// every step. Between steps, on both keys alike: now and then apply.lua's
// sliding Allow leaves a log behind, or its refund takes events back, the
// hash is deleted (a Reset) or replaced by what lease.lua alone writes (a
// tally and a penalty), so that fast.lua meets every state the other
// scripts leave. A failure names its seed: go test -run
// TestFastScriptIsApplyForOneRule -fastseed N replays it.
func TestFastScriptIsApplyForOneRule(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	apply, fast := redis.NewScript(redisstore.ApplySource), redis.NewScript(redisstore.FastSource)
	ut := string(storetest.UseType(t, "fastpath"))
	type side struct {
		name      string
		hash, log string
	}
	sides := []side{
		{"apply.lua", "{" + ut + "}:apply", "{" + ut + "}:apply:log"},
		{"fast.lua", "{" + ut + "}:fast", "{" + ut + "}:fast:log"},
	}
	t.Cleanup(func() {
		for _, s := range sides {
			c.Del(context.Background(), s.hash, s.log)
		}
	})
	seed := *fastSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	const sec = int64(time.Second / time.Microsecond)
	// A TTL no script sets: the hash carries it between steps, so that a
	// script that leaves the TTL alone, one that sets it and one that
	// drops it (PERSIST) all differ. The test's clock runs far ahead of
	// Redis's, and a TTL set from it would otherwise end in real time, on
	// one side before the other; the scripts decide from the hash's
	// fields, never from its TTL.
	const keep = 7 * time.Hour
	now := time.Now().UnixMicro()
	limit := int64(4)
	replies := 0
	reply := func() string {
		replies++
		return fmt.Sprintf("{%s}:reply:%d", ut, replies)
	}
	fastAllowed := 0
	for step := range 2000 {
		now += rng.Int64N(3 * sec)
		if rng.IntN(8) == 0 {
			now -= rng.Int64N(sec / 20) // a late clock read
		}
		switch rng.IntN(12) {
		case 0:
			limit = rng.Int64N(7)
		case 1:
			limit = countlimit.MaxLimit - rng.Int64N(3)
		}
		n := 1 + rng.Int64N(3)
		var block int64
		if rng.IntN(3) == 0 {
			block = 5 * sec
		}
		var begin, length int64
		switch kind := rng.IntN(10); {
		case kind < 5: // fixed, 7 s
			begin, length = now-now%(7*sec), 7*sec
		case kind < 8: // rolling, 10 s
			begin, length = now, 10*sec
		default: // lifetime
			begin = now
		}
		op := rng.IntN(25)
		leaseX := now + rng.Int64N(2*sec) - sec
		var desc string
		outs := make([]string, len(sides))
		ttls := make([]time.Duration, len(sides))
		for i, s := range sides {
			script, args := apply, []any{"allow", now, n, 20000, limit, begin, length, 0, block}
			var prepare func(p redis.Pipeliner)
			oneRule := true // an Allow of one rule that is not sliding: fast.lua's
			switch {
			case op == 0 && step > 0:
				desc, oneRule = "sliding allow (apply.lua on both)", false
				args = []any{"allow", now, n, 20000, min(limit, countlimit.MaxSlidingLimit), 0, 0, 4 * sec, block}
			case op == 1:
				desc, oneRule = "refund (apply.lua on both)", false
				args[0] = "refund"
			case op == 2:
				desc = "allow after a reset"
				prepare = func(p redis.Pipeliner) { p.Del(ctx, s.hash, s.log) }
			case op == 3:
				desc = "allow on a hash lease.lua left (a tally and a penalty)"
				prepare = func(p redis.Pipeliner) {
					p.Del(ctx, s.hash, s.log)
					p.HSet(ctx, s.hash, "d", 3, "x", leaseX)
				}
			default:
				desc = "allow"
			}
			if oneRule {
				desc = fmt.Sprintf("%s: n=%d limit=%d begin=%d length=%d block=%d", desc, n, limit, begin, length, block)
				if i == 1 {
					script, args = fast, []any{now, n, 20000, limit, begin, length, block}
				}
			}
			// One transaction: nothing expires between the script and
			// the reads.
			key := reply()
			var res *redis.Cmd
			var ttl *redis.DurationCmd
			var h *redis.MapStringStringCmd
			var kept *redis.StringCmd
			_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
				if prepare != nil {
					prepare(p)
				}
				p.PExpire(ctx, s.hash, keep)
				res = script.Eval(ctx, p, []string{s.hash, s.log, key}, args...)
				ttl = p.PTTL(ctx, s.hash)
				p.PExpire(ctx, s.hash, keep)
				h = p.HGetAll(ctx, s.hash)
				kept = p.Get(ctx, key)
				return nil
			})
			if err != nil && err != redis.Nil {
				t.Fatalf("seed %d step %d: %s on %s: %v", seed, step, desc, s.name, err)
			}
			// fmt prints a map's keys sorted.
			outs[i] = fmt.Sprintf("reply %v, hash %v, kept reply %q", res.Val(), h.Val(), kept.Val())
			ttls[i] = ttl.Val()
			if vals, _ := res.Val().([]any); i == 1 && oneRule && len(vals) == 6 && vals[5] == int64(1) {
				fastAllowed++
			}
		}
		// The same TTL, the one kept, or none on both (-1): set from the
		// same arguments a few milliseconds apart.
		if d := ttls[0] - ttls[1]; outs[0] != outs[1] || (ttls[0] < 0) != (ttls[1] < 0) || d < -50*time.Millisecond || d > 50*time.Millisecond {
			t.Fatalf("seed %d step %d: %s\n%s: %s, TTL %v\n%s: %s, TTL %v", seed, step, desc,
				sides[0].name, outs[0], ttls[0], sides[1].name, outs[1], ttls[1])
		}
	}
	if fastAllowed < 300 {
		t.Errorf("seed %d: only %d Allows counted by fast.lua", seed, fastAllowed)
	}
}
