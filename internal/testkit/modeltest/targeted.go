package modeltest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/expose"
)

// The targeted steps' rules, on use types of their own that the random
// steps never draw (drawing them would move every seed's steps): a
// smooth rate beside a lifetime count, and a smooth rate beside slots,
// each with a penalty.
var (
	lifeCount  = countlimit.Rule{UseType: "lifesmooth", Limit: 4, Window: countlimit.Lifetime()}
	lifeSmooth = countlimit.Rule{UseType: "lifesmooth", Limit: 1, Window: countlimit.Smooth(3*time.Second, 2)}
	slotLeases = countlimit.Rule{UseType: "slotsmooth", Limit: 1, Window: countlimit.Concurrent(6 * time.Second), Block: 2 * time.Second}
	slotSmooth = countlimit.Rule{UseType: "slotsmooth", Limit: 1, Window: countlimit.Smooth(4*time.Second, 2), Block: 3 * time.Second}
)

// targetedUseTypes are the targeted steps' use types, which a run's
// keyspace reads back besides the random steps'.
var targetedUseTypes = []string{"lifesmooth", "slotsmooth"}

// targeted returns the steps every run ends with, from just after last,
// over the run's ids: short sequences that set up a case the random
// steps draw seldom or never, each compared to the model step by step as
// every step is. Their ids, counts and the clock's moves (under a second
// each, so that nothing they set up ends in between) come from seed.
//
//   - A lifetime count of 2 to 4, then a smooth check on the same key,
//     denied by the rate: the count it carries over (a full burst) is
//     held for good, so no instant frees it (Redis: fast.lua's rated and
//     apply.lua's gcra, held == FOREVER); then a Peek of it.
//   - A lease, then a smooth check that counts on the same key (Redis
//     keeps the instant as a string, smoothkey.lua), a Peek of the slots
//     and an Acquire denied, its slots full, which sets the slots'
//     penalty (lease.lua reads the string, and makes it a hash before it
//     writes); the lease released, an Acquire denied in its penalty box
//     with no lease held.
//   - A smooth check that asks more than its burst on a new key, denied
//     with a penalty, then an Acquire in that penalty box, no lease held.
func targeted(seed uint64, last time.Time, ids []string) []Step {
	rng := rand.New(rand.NewPCG(seed, 0x746172))
	rec := newRecorder(seed ^ 0x746172)
	at := last.Add(time.Second)
	l := countlimit.New(rec, countlimit.WithClock(func() time.Time { return at }))
	ctx := context.Background()
	var steps []Step
	step := func(desc string, do func()) {
		at = at.Add(time.Duration(1+rng.IntN(900)) * time.Millisecond)
		rec.reqs = nil
		do()
		steps = append(steps, Step{Desc: at.UTC().Format("2006-01-02 15:04:05.000000 ") + "targeted: " + desc, Reqs: rec.reqs})
	}
	pick := func() string { return ids[rng.IntN(len(ids))] }

	id := pick()
	m, n := int64(2+rng.IntN(3)), int64(1+rng.IntN(2))
	step(fmt.Sprintf("AllowN(%s lifetime, %.12s, %d)", lifeCount.UseType, id, m), func() { l.AllowN(ctx, lifeCount, id, m) })
	step(fmt.Sprintf("AllowN(%s smooth, %.12s, %d)", lifeSmooth.UseType, id, n), func() { l.AllowN(ctx, lifeSmooth, id, n) })
	step(fmt.Sprintf("Peek(%s smooth, %.12s)", lifeSmooth.UseType, id), func() { l.Peek(ctx, lifeSmooth, id) })

	id = pick()
	var ls countlimit.Lease
	step(fmt.Sprintf("Acquire(%s, %.12s)", slotLeases.UseType, id), func() { ls, _, _ = l.Acquire(ctx, slotLeases, id) })
	step(fmt.Sprintf("AllowN(%s smooth, %.12s, 1)", slotSmooth.UseType, id), func() { l.AllowN(ctx, slotSmooth, id, 1) })
	step(fmt.Sprintf("Peek(%s, %.12s)", slotLeases.UseType, id), func() { l.Peek(ctx, slotLeases, id) })
	step(fmt.Sprintf("Acquire(%s, %.12s)", slotLeases.UseType, id), func() { l.Acquire(ctx, slotLeases, id) })
	step(fmt.Sprintf("Release(%s, %.12s)", slotLeases.UseType, id), func() { ls.Release(ctx) })
	step(fmt.Sprintf("Acquire(%s, %.12s)", slotLeases.UseType, id), func() { l.Acquire(ctx, slotLeases, id) })

	// Another id: its key is new.
	for again := id; id == again; {
		id = pick()
	}
	over := expose.WindowOf(slotSmooth.Window).Burst + 1
	step(fmt.Sprintf("AllowN(%s smooth, %.12s, %d)", slotSmooth.UseType, id, over), func() { l.AllowN(ctx, slotSmooth, id, over) })
	step(fmt.Sprintf("Acquire(%s, %.12s)", slotLeases.UseType, id), func() { l.Acquire(ctx, slotLeases, id) })
	return steps
}
