package model_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// redisRate is go-redis/redis_rate's allow_n script (v10, lua.go), in
// integer microseconds instead of its float seconds: the GCRA a Smooth
// check is to decide as.
type redisRate struct{ tat int64 } // 0: no key

type redisRateAnswer struct {
	allowed           bool
	remaining         int64
	retry, resetAfter int64 // µs; retry -1 when allowed
}

func (r *redisRate) allowN(now, interval, burst, cost int64) redisRateAnswer {
	increment := interval * cost
	burstOffset := interval * burst
	tat := r.tat
	if tat == 0 {
		tat = now
	}
	tat = max(tat, now)
	newTAT := tat + increment
	allowAt := newTAT - burstOffset
	diff := now - allowAt
	if diff < 0 {
		return redisRateAnswer{retry: -diff, resetAfter: tat - now}
	}
	if newTAT-now > 0 {
		r.tat = newTAT
	}
	return redisRateAnswer{allowed: true, remaining: diff / interval, retry: -1, resetAfter: newTAT - now}
}

// TestSmoothIsRedisRate: model.Apply decides a Smooth check as
// redis_rate's script does, on random rates, bursts, costs and clock
// steps: the same verdicts, and the same remaining, retry-after and reset
// (Used is burst - remaining, FreeAt is now + retry-after, End is now +
// reset). Costs above the burst are left out: redis_rate answers a wait
// that never helps, Apply a FreeAt of zero (RetryAfter -1).
func TestSmoothIsRedisRate(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x72617465))
		interval := int64(1 + rng.IntN(2_000_000)) // µs
		burst := int64(1 + rng.IntN(20))
		now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC).UnixMicro()
		var key model.Key
		var ref redisRate
		for step := range 200 {
			now += rng.Int64N(3 * interval)
			cost := 1 + rng.Int64N(burst)
			r := &driver.Request{Op: driver.OpAllow, ID: "id", Now: time.UnixMicro(now), N: cost, Checks: []driver.Check{{
				UseType: "smooth", Limit: 1, Interval: time.Duration(interval) * time.Microsecond, Burst: burst, Kind: "smooth"}}}
			model.Apply(r, []*model.Key{&key})
			st, want := r.Checks[0].State, ref.allowN(now, interval, burst, cost)
			retry := int64(-1)
			if !st.FreeAt.IsZero() {
				retry = st.FreeAt.UnixMicro() - now
			}
			reset := int64(0)
			if !st.End.IsZero() {
				reset = st.End.UnixMicro() - now
			}
			if st.Allowed != want.allowed || (st.Allowed && burst-st.Used != want.remaining) || retry != want.retry || reset != want.resetAfter {
				t.Fatalf("seed %d step %d: interval %dµs burst %d cost %d: Apply allowed %v remaining %d retry %d reset %d; redis_rate %+v",
					seed, step, interval, burst, cost, st.Allowed, burst-st.Used, retry, reset, want)
			}
		}
	}
}
