package redisstore_test

import (
	"context"
	"flag"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

var gcraSeed = flag.Uint64("gcraseed", 0, "TestSmoothIsRedisRate: replay this seed (0: a new one)")

// observed is the client redis_rate is given in TestSmoothIsRedisRate: it
// sends each of redis_rate's scripts in a MULTI with a GET of the key the
// script decides on, so that the test reads, atomically, the instant
// (TAT) the script left, whatever happens between the reply and the
// test's next command. redis_rate's calls are otherwise the library's own.
type observed struct {
	*redis.Client
	tat *redis.StringCmd // the GET sent with the last script
}

func (o *observed) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return o.multi(ctx, keys, func(p redis.Pipeliner) *redis.Cmd { return p.EvalSha(ctx, sha, keys, args...) })
}

func (o *observed) Eval(ctx context.Context, src string, keys []string, args ...any) *redis.Cmd {
	return o.multi(ctx, keys, func(p redis.Pipeliner) *redis.Cmd { return p.Eval(ctx, src, keys, args...) })
}

func (o *observed) multi(ctx context.Context, keys []string, script func(redis.Pipeliner) *redis.Cmd) *redis.Cmd {
	var cmd *redis.Cmd
	_, _ = o.TxPipelined(ctx, func(p redis.Pipeliner) error {
		cmd = script(p)
		o.tat = p.Get(ctx, keys[0])
		return nil
	})
	return cmd // its own error, if any (NOSCRIPT: redis_rate sends Eval then)
}

// jan2017 is redis_rate's epoch: its script keeps times in seconds since.
const jan2017 = 1483228800

// TestSmoothIsRedisRate runs countlimit's Allow and AllowN under a Smooth
// rule and go-redis/redis_rate's on the same Redis, side by side, with
// the same rate, burst and period and the same calls: bursts, weights up
// to the burst, waits shorter than an interval, waits of exactly the
// RetryAfter given, and waits past drain, first in a fixed order and then
// drawn from a seed (-gcraseed replays one). Both must allow and deny the
// same calls, with the same RetryAfter and ResetAt within a millisecond.
//
// The clock: redis_rate reads Redis's TIME in its script, which no test
// can set, so each pair of calls runs at whatever instant that is, and
// countlimit is given that very instant with WithClock. redis_rate's
// call goes first, in a MULTI with a GET of its key (observed); its TAT
// less its ResetAfter is the instant its script read, in seconds since
// 2017 as doubles, within a tenth of a microsecond, so rounded it is
// TIME's microsecond (checked against TIME read before and after). The
// waits are real (time.Sleep), but no assertion depends on how long they
// take: both sides see the same instant, whenever it comes.
//
// The rate is 10 a second, an emission interval of exactly 100ms, which
// countlimit keeps in whole microseconds and redis_rate as a double, so
// both compare the same boundaries, but for one case: an instant exactly
// on a boundary, where redis_rate's sums of doubles (its 0.1 is not
// exact) may fall either side. Such a call (one in about 10^5 at random
// instants) is logged and both keys are reset, not failed. A weight
// above the burst is left out: countlimit denies it with RetryAfter -1
// (it never fits), redis_rate with a finite wait after which it still
// does not fit.
func TestSmoothIsRedisRate(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	const (
		rate   = 10
		burst  = 5
		period = time.Second
		iv     = period / rate
	)
	o := &observed{Client: c}
	rr := redis_rate.NewLimiter(o)
	limit := redis_rate.Limit{Rate: rate, Burst: burst, Period: period}
	var now time.Time
	l := countlimit.New(redisstore.New(c), countlimit.WithClock(func() time.Time { return now }))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "gcra"), Limit: rate, Window: countlimit.Smooth(period, burst)}
	key := string(rule.UseType)
	t.Cleanup(func() { c.Del(context.Background(), "rate:"+key, redisstore.Key(rule.UseType, "a")) })

	seed := *gcraSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(seed, 35))
	type call struct {
		wait time.Duration // before the call; -1: the RetryAfter last given
		n    int
	}
	calls := []call{
		// A fresh key takes its burst at once, then nothing.
		{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 2},
		// Less than an interval: still nothing; then exactly the wait.
		{30 * time.Millisecond, 1}, {-1, 1}, {0, 1}, {-1, 1},
		// Weights: 2 waits for two intervals.
		{0, 2}, {-1, 2}, {150 * time.Millisecond, 3}, {-1, 3},
		// Past drain: the whole burst at once, then one more waits.
		{700 * time.Millisecond, 5}, {0, 1}, {-1, 1}, {0, 4},
		{550 * time.Millisecond, 4}, {0, 2}, {-1, 1}, {-1, 2},
	}
	for range 40 {
		w := time.Duration(rng.IntN(4)) * time.Duration(rng.Int64N(int64(iv)))
		switch rng.IntN(6) {
		case 0:
			w = -1
		case 1:
			w = time.Duration(burst)*iv + time.Duration(rng.Int64N(int64(iv)))
		}
		calls = append(calls, call{w, 1 + rng.IntN(burst)})
	}

	var retry, apart time.Duration // apart: the most RetryAfter or ResetAt differ by
	allowed, denied := 0, 0
	for i, cl := range calls {
		switch {
		case cl.wait < 0 && retry > 0:
			time.Sleep(retry)
		case cl.wait > 0:
			time.Sleep(cl.wait)
		}
		before, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := rr.AllowN(ctx, key, limit, cl.n)
		if err != nil {
			t.Fatalf("call %d: redis_rate: %v", i, err)
		}
		after, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		tat, err := o.tat.Float64()
		if err != nil {
			t.Fatalf("call %d: redis_rate's key after its call: %v", i, err)
		}
		// Seconds since 2017 to Unix microseconds: the instant redis_rate
		// read.
		at := int64(math.Round((tat-theirs.ResetAfter.Seconds())*1e6)) + jan2017*1e6
		now = time.UnixMicro(at)
		if now.Before(before.Truncate(time.Microsecond)) || now.After(after) {
			t.Fatalf("call %d: redis_rate's instant, derived as %s, is not between TIME before (%s) and after (%s) it",
				i, now.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano))
		}
		ours, err := l.AllowN(ctx, rule, "a", int64(cl.n))
		if err != nil {
			t.Fatalf("call %d: countlimit: %v", i, err)
		}
		ourReset := ours.ResetAt.Sub(now)
		if ours.Allowed != (theirs.Allowed > 0) {
			// Exactly on a boundary: countlimit fits with equality (the
			// burst just full) or misses by a microsecond.
			if ours.Allowed && ourReset == burst*iv || !ours.Allowed && ours.RetryAfter <= time.Microsecond {
				t.Logf("call %d (AllowN %d, seed %d): exactly on a boundary at %s, countlimit allowed %v, redis_rate %d: both keys reset",
					i, cl.n, seed, now.Format(time.RFC3339Nano), ours.Allowed, theirs.Allowed)
				c.Del(ctx, "rate:"+key)
				if err := l.Reset(ctx, rule, "a"); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Fatalf("call %d (wait %v, AllowN %d, seed %d): countlimit allowed %v (%+v), redis_rate %d (%+v)",
				i, cl.wait, cl.n, seed, ours.Allowed, ours, theirs.Allowed, theirs)
		}
		theirRetry := max(theirs.RetryAfter, 0) // -1 when allowed
		apart = max(apart, (ours.RetryAfter - theirRetry).Abs(), (ourReset - theirs.ResetAfter).Abs())
		if d := (ours.RetryAfter - theirRetry).Abs(); d > time.Millisecond {
			t.Errorf("call %d (AllowN %d, seed %d): RetryAfter %v, redis_rate's %v", i, cl.n, seed, ours.RetryAfter, theirRetry)
		}
		if d := (ourReset - theirs.ResetAfter).Abs(); d > time.Millisecond {
			t.Errorf("call %d (AllowN %d, seed %d): ResetAt is %v on, redis_rate's ResetAfter %v", i, cl.n, seed, ourReset, theirs.ResetAfter)
		}
		if ours.Allowed {
			allowed++
		} else {
			denied++
		}
		retry = ours.RetryAfter
	}
	if allowed == 0 || denied == 0 {
		t.Errorf("seed %d: %d allowed and %d denied: the calls should meet both", seed, allowed, denied)
	}
	t.Logf("seed %d: %d calls, %d allowed and %d denied alike; RetryAfter and ResetAt at most %v apart", seed, len(calls), allowed, denied, apart)
}
