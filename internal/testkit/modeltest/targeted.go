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
// smooth rate beside a lifetime count, a smooth rate beside slots,
// a rolling window and a smooth rate alone, each with a penalty.
var (
	lifeCount  = countlimit.Rule{UseType: "lifesmooth", Limit: 4, Window: countlimit.Lifetime()}
	lifeSmooth = countlimit.Rule{UseType: "lifesmooth", Limit: 1, Window: countlimit.Smooth(3*time.Second, 2)}
	slotLeases = countlimit.Rule{UseType: "slotsmooth", Limit: 1, Window: countlimit.Concurrent(6 * time.Second), Block: 2 * time.Second}
	slotSmooth = countlimit.Rule{UseType: "slotsmooth", Limit: 1, Window: countlimit.Smooth(4*time.Second, 2), Block: 3 * time.Second}
	endRolling = countlimit.Rule{UseType: "penaltyend", Limit: 4, Window: countlimit.Rolling(10 * time.Second), Block: 2 * time.Second}
	bareSmooth = countlimit.Rule{UseType: "baresmooth", Limit: 1, Window: countlimit.Smooth(4*time.Second, 2), Block: 3 * time.Second}
)

// targetedUseTypes are the targeted steps' use types, which a run's
// keyspace reads back besides the random steps'.
var targetedUseTypes = []string{"lifesmooth", "slotsmooth", "penaltyend", "baresmooth"}

// targeted returns the steps every run ends with, from just after last,
// over the run's ids: short sequences that set up a case the random
// steps draw seldom or never, each compared to the model step by step as
// every step is. Their ids, counts and the clock's moves (under a second
// each, so that nothing they set up ends in between, but for one onto
// the instant a penalty ends) come from seed.
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
//   - An allow of one on a rolling window, then one that asks more than
//     the room, denied with a penalty (the count kept); then, at the
//     instant that penalty ends, its window current, a batch of 2 or 3
//     calls of one on the key, sent together as concurrent callers send
//     them: room for them all (PostgreSQL's group commit sends them to
//     countlimit_allow_batch_pooled's first statement, where a penalty
//     that ends exactly now is free), which random batches seldom reach.
//   - A smooth allow of one on a new key (Redis keeps it as a string,
//     its instant alone), then a batch of a smooth allow over the burst
//     on it, denied with a penalty, beside an allow on another id: Redis
//     combines the two in one fast.lua script, which makes the string a
//     hash before it writes the penalty.
func targeted(seed uint64, last time.Time, ids []string) []Step {
	rng := rand.New(rand.NewPCG(seed, 0x746172))
	rec := newRecorder(seed ^ 0x746172)
	at := last.Add(time.Second)
	l := countlimit.New(rec, countlimit.WithClock(func() time.Time { return at }))
	ctx := context.Background()
	var steps []Step
	stepAt := func(to time.Time, desc string, do func()) {
		at = to
		rec.reqs = nil
		do()
		steps = append(steps, Step{Desc: at.UTC().Format("2006-01-02 15:04:05.000000 ") + "targeted: " + desc, Reqs: rec.reqs})
	}
	step := func(desc string, do func()) {
		stepAt(at.Add(time.Duration(1+rng.IntN(900))*time.Millisecond), desc, do)
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

	id = pick()
	step(fmt.Sprintf("AllowN(%s %v, %.12s, 1)", endRolling.UseType, endRolling.Window, id), func() { l.AllowN(ctx, endRolling, id, 1) })
	step(fmt.Sprintf("AllowN(%s %v, %.12s, %d)", endRolling.UseType, endRolling.Window, id, endRolling.Limit),
		func() { l.AllowN(ctx, endRolling, id, endRolling.Limit) })
	k := 2 + rng.IntN(2)
	stepAt(at.Add(endRolling.Block), fmt.Sprintf("batch(%d × %s/%.12s) at its penalty's end", k, endRolling.UseType, id), func() {
		for range k {
			l.AllowN(ctx, endRolling, id, 1)
		}
	})

	id = pick()
	other := id
	for other == id {
		other = pick()
	}
	over = expose.WindowOf(bareSmooth.Window).Burst + 1
	step(fmt.Sprintf("AllowN(%s smooth, %.12s, 1)", bareSmooth.UseType, id), func() { l.AllowN(ctx, bareSmooth, id, 1) })
	step(fmt.Sprintf("batch(%s/%.12s × %d, %s/%.12s)", bareSmooth.UseType, id, over, endRolling.UseType, other), func() {
		l.AllowN(ctx, bareSmooth, id, over)
		l.AllowN(ctx, endRolling, other, 1)
	})
	return steps
}
