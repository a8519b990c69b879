package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

// TestFastScriptIsApplyForOneRule runs fast.lua and apply.lua side by side
// on two keys, with the same random Allows of one rule that is not sliding
// (fixed, rolling and lifetime windows, limits that change, weights,
// penalties, a clock that sometimes steps back), and demands the same
// reply, the same hash and the same TTL after every step. Now and then a
// sliding Allow (apply.lua's, on both keys) leaves a log behind, and a
// refund takes events back, so that fast.lua meets what apply.lua leaves.
// (Both sides run apply.lua for those.)
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
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 11))
	const sec = int64(time.Second / time.Microsecond)
	now := time.Now().UnixMicro()
	limit := int64(4)
	replies := 0
	reply := func() string {
		replies++
		return fmt.Sprintf("{%s}:reply:%d", ut, replies)
	}
	fastPaths := map[string]int{}
	for step := range 1500 {
		now += rng.Int64N(3 * sec)
		if rng.IntN(8) == 0 {
			now -= rng.Int64N(sec / 20) // a late clock read
		}
		if rng.IntN(6) == 0 {
			limit = rng.Int64N(7)
		}
		n := 1 + rng.Int64N(3)
		var block int64
		if rng.IntN(3) == 0 {
			block = 5 * sec
		}
		var begin, length int64
		kind := rng.IntN(10)
		switch {
		case kind < 5: // fixed, 7 s
			begin, length = now-now%(7*sec), 7*sec
		case kind < 8: // rolling, 10 s
			begin, length = now, 10*sec
		default: // lifetime
			begin = now
		}
		op := rng.IntN(20)
		var desc string
		outs := make([]string, len(sides))
		ttls := make([]time.Duration, len(sides))
		for i, s := range sides {
			script, args := apply, []any{"allow", now, n, 20000, limit, begin, length, 0, block}
			switch {
			case op == 0 && step > 0:
				// apply.lua's sliding Allow on both keys: a log, its "s".
				desc = "sliding allow"
				args = []any{"allow", now, n, 20000, limit, 0, 0, 4 * sec, block}
			case op == 1:
				desc = "refund"
				args[0] = "refund"
			case i == 0:
				desc = fmt.Sprintf("allow n=%d limit=%d begin=%d length=%d block=%d", n, limit, begin, length, block)
			default:
				script, args = fast, []any{now, n, 20000, limit, begin, length, block}
			}
			// One transaction, so that no TTL ends between the script and
			// the reads: the clock here runs far ahead of Redis's, and a TTL
			// set from it would end in real time, on one side before the
			// other. PERSIST then keeps the hash for the next step: the
			// scripts decide from its fields, never from its TTL, and set
			// one again whenever they would.
			var res *redis.Cmd
			var ttl *redis.DurationCmd
			var h *redis.MapStringStringCmd
			_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
				res = script.Eval(ctx, p, []string{s.hash, s.log, reply()}, args...)
				ttl = p.PTTL(ctx, s.hash)
				p.Persist(ctx, s.hash)
				h = p.HGetAll(ctx, s.hash)
				return nil
			})
			if err != nil {
				t.Fatalf("seed %d step %d: %s on %s: %v", seed, step, desc, s.name, err)
			}
			keys := make([]string, 0, len(h.Val()))
			for k := range h.Val() {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			var fields string
			for _, k := range keys {
				fields += k + "=" + h.Val()[k] + " "
			}
			outs[i] = fmt.Sprintf("reply %v, hash {%s}", res.Val(), fields)
			ttls[i] = ttl.Val()
		}
		// The same TTL, or none on both (-1): the two were set from the
		// same arguments, a few milliseconds apart.
		if d := ttls[0] - ttls[1]; outs[0] != outs[1] || (ttls[0] < 0) != (ttls[1] < 0) || d < -50*time.Millisecond || d > 50*time.Millisecond {
			t.Fatalf("seed %d step %d: %s\n%s: %s, TTL %v\n%s: %s, TTL %v", seed, step, desc,
				sides[0].name, outs[0], ttls[0], sides[1].name, outs[1], ttls[1])
		}
		if desc != "sliding allow" && desc != "refund" {
			fastPaths[fmt.Sprint(limit > 0)]++
		}
	}
	if fastPaths["true"] < 500 {
		t.Errorf("only %d Allows with a limit above 0 compared", fastPaths["true"])
	}
}
