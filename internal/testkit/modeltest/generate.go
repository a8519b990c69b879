// The generator: the rules, the setting and the seeded steps a run draws,
// each recorded as the requests the Limiter sends.

package modeltest

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/expose"
	"github.com/countlimit/countlimit/internal/testkit/leaseforge"
)

// rules are the harness's rules, with calendar windows in loc: every kind
// of window, penalties, use types whose rule changes kind (sliding and
// fixed; lifetime and sliding), three sliding logs of different spans, and
// slots; with smooth, two smooth rates (one whose interval is rounded up,
// with a penalty; one whose limit may move to 0) and more use types whose
// rule changes kind (fixed and smooth; sliding, fixed and smooth; rolling
// and smooth; sliding and smooth, each with a penalty). AllowAll draws
// from the use types that count events.
func rules(loc *time.Location, smooth bool) []countlimit.Rule {
	rs := []countlimit.Rule{
		{UseType: "rolling", Limit: 3, Window: countlimit.Rolling(10 * time.Second)},
		{UseType: "fixed", Limit: 2, Window: countlimit.Fixed(7 * time.Second), Block: 5 * time.Second},
		{UseType: "day", Limit: 4, Window: countlimit.Calendar(countlimit.Day, loc), Block: 2 * time.Second},
		{UseType: "sliding", Limit: 3, Window: countlimit.Sliding(9 * time.Second)},
		{UseType: "sliding", Limit: 3, Window: countlimit.Fixed(20 * time.Second)}, // the same use type, another kind
		{UseType: "slidingblock", Limit: 2, Window: countlimit.Sliding(4 * time.Second), Block: 3 * time.Second},
		{UseType: "lifetime", Limit: 5, Window: countlimit.Lifetime()},
		{UseType: "slots", Limit: 2, Window: countlimit.Concurrent(6 * time.Second), Block: 4 * time.Second},
		{UseType: "week:{w}", Limit: 6, Window: countlimit.Calendar(countlimit.Week, loc)},
		{UseType: "slidingwide", Limit: 5, Window: countlimit.Sliding(13 * time.Second), Block: time.Second},
		{UseType: "fixedfast", Limit: 4, Window: countlimit.Fixed(3 * time.Second)},
		{UseType: "lifetime", Limit: 3, Window: countlimit.Sliding(5 * time.Second)}, // the same use type, another kind
	}
	if smooth {
		rs = append(rs,
			countlimit.Rule{UseType: "smooth", Limit: 1, Window: countlimit.Smooth(2*time.Second, 3)},
			countlimit.Rule{UseType: "smoothblock", Limit: 3, Window: countlimit.Smooth(7*time.Second, 2), Block: 3 * time.Second},
			countlimit.Rule{UseType: "fixedfast", Limit: 2, Window: countlimit.Smooth(3*time.Second, 3)}, // the same use type, another kind
			countlimit.Rule{UseType: "sliding", Limit: 2, Window: countlimit.Smooth(6*time.Second, 2)},
			countlimit.Rule{UseType: "rolling", Limit: 3, Window: countlimit.Smooth(5*time.Second, 2)},
			countlimit.Rule{UseType: "slidingblock", Limit: 1, Window: countlimit.Smooth(2*time.Second, 3), Block: 2 * time.Second},
		)
	}
	return rs
}

// setting draws a run's zone, start and ids from its seed: the clock
// starts a minute before the local midnight of the day of one of the
// zone's clock changes in 1970-2060 (the first after a drawn instant; for
// a zone that changes no more, that instant's day), so the run's first
// steps cross a calendar day's end, often one a change moves.
func setting(seed uint64) (loc *time.Location, start time.Time, ids []string) {
	rng := rand.New(rand.NewPCG(seed, 0x7a6f6e65))
	loc, err := time.LoadLocation(zones[rng.IntN(len(zones))])
	if err != nil {
		panic(err) // time/tzdata is imported
	}
	from := time.Date(1970+rng.IntN(91), time.Month(1+rng.IntN(12)), 1, 0, 0, 0, 0, time.UTC).In(loc)
	change := from
	for at := from; at.Year() < 2061; {
		_, end := at.ZoneBounds()
		if end.IsZero() || !end.After(at) {
			break
		}
		if _, o1 := at.Zone(); func() bool { _, o2 := end.Zone(); return o1 != o2 }() {
			change = end
			break
		}
		at = end
	}
	y, m, d := change.In(loc).Date()
	start = time.Date(y, m, d, 0, 0, 0, 0, loc).Add(-time.Minute)
	for _, i := range rng.Perm(len(idPool))[:3] {
		ids = append(ids, idPool[i])
	}
	return loc, start, ids
}

// recorder is a Store that keeps the requests it is given and answers
// every check allowed, so that Acquire returns a Lease to release later.
// The requests it keeps name each lease by a token drawn from the run's
// seed instead of the Limiter's random one, so that a seed gives the same
// steps, tokens included, every time.
type recorder struct {
	reqs   []*driver.Request
	rng    *rand.Rand
	tokens map[string]string // the Limiter's token to the seed's
}

func newRecorder(seed uint64) *recorder {
	return &recorder{rng: rand.New(rand.NewPCG(seed, 0x746f6b)), tokens: map[string]string{}}
}

func (r *recorder) Do(_ context.Context, q *driver.Request) error {
	c := *q
	c.Checks = slices.Clone(q.Checks)
	if c.Lease != "" {
		c.Lease = r.token(c.Lease)
	}
	r.reqs = append(r.reqs, &c)
	for i := range q.Checks {
		q.Checks[i].State = driver.State{Allowed: true}
	}
	return nil
}

// token returns the seed's token for the Limiter's token t: 22 base64url
// characters, as a Lease's are.
func (r *recorder) token(t string) string {
	s, ok := r.tokens[t]
	if !ok {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], r.rng.Uint64())
		binary.LittleEndian.PutUint64(b[8:], r.rng.Uint64())
		s = base64.RawURLEncoding.EncodeToString(b[:])
		r.tokens[t] = s
	}
	return s
}

// vary returns r, its limit moved by one one time in six and its
// penalty changed (to none, 1 s or 4 s) one time in eight: the rule of
// another process whose rule file differs. A penalty changed to none
// asks again an id that a rule with one blocked.
func vary(rng *rand.Rand, r countlimit.Rule) countlimit.Rule {
	if rng.IntN(6) == 0 {
		r.Limit += int64(rng.IntN(3)) - 1
	}
	if rng.IntN(8) == 0 {
		r.Block = []time.Duration{0, time.Second, 4 * time.Second}[rng.IntN(3)]
	}
	return r
}

// gen makes n steps from seed, with smooth rules or without: the same
// steps for the same seed, every time (TestGenIsDeterministic).
func gen(seed uint64, n int, smooth bool) []Step {
	rng := rand.New(rand.NewPCG(seed, 0x636c))
	// mix draws the calls of other kinds in batches (otherCall), apart
	// from rng.
	mix := rand.New(rand.NewPCG(seed, 0x6d6978))
	// aside draws the lease calls beside a batch's Acquire (leaseCall):
	// a stream of its own, so mix's draws stay as they were.
	aside := rand.New(rand.NewPCG(seed, 0x6c65617365))
	rec := newRecorder(seed)
	loc, now, ids := setting(seed)
	rs := rules(loc, smooth)
	w := world{}
	var leases []countlimit.Lease
	// The rule and id the step before was on, for a late read that
	// joins the window or log it just wrote.
	var lastRule *countlimit.Rule
	var lastID string
	// penalized is the key a denial of the step before left in its
	// penalty box, which the next step often asks again; roomy, a key a
	// denial put in its penalty box while its window had room for two
	// more (the call asked for more than the room), whose penalty's end
	// a batch often lands on: two calls of one on it, or a call on it
	// beside keys of their own.
	var penalized, roomy *instant
	// empty is a key a denial of a new key left with an empty window (no
	// penalty set), which the next batch of keys of their own takes
	// first.
	var empty *instant
	// slid is set when the step before allowed a lone sliding check that
	// left two events or more: the next step is then often a late allow
	// on it (its event goes before the newest) or a refund of one (the
	// log keeps the others).
	slid := false
	var steps []Step
	for len(steps) < n {
		// The clock: small steps, large ones, an instant something ends
		// at (a penalty's end half the time one is near), or, rarely, a
		// read a little older than the last one; or, half the time after
		// a denial that left a key in its penalty box, less than a
		// second on, on that key (an id blocked, asked again).
		// focus, when set, is the key whose instant the clock landed on:
		// the step then works on it.
		var focus *instant
		again := false
		back := penalized != nil && rng.IntN(2) == 0
		if back {
			now = now.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
			focus = &instant{at: now.UnixMicro(), ut: penalized.ut, id: penalized.id}
		}
		penalized = nil
		if roomy != nil && roomy.at <= now.UnixMicro() {
			roomy = nil
		}
		atRoom := !back && roomy != nil && rng.IntN(2) == 0
		if atRoom {
			now, focus, roomy = time.UnixMicro(roomy.at).In(loc), roomy, nil
		}
		slidNext := 0 // 1: a late allow on the log, 2: a refund of one
		if slid && !back && !atRoom {
			slidNext = rng.IntN(3)
		}
		p := rng.IntN(20)
		if slidNext == 1 {
			p = 19
		}
		switch {
		case back || atRoom:
		case p < 11:
			now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		case p < 13:
			now = now.Add(time.Duration(5+rng.IntN(40)) * time.Second)
		case p < 18:
			var soon []instant
			for _, e := range w.expiries() {
				if e.at > now.UnixMicro() && e.at < now.UnixMicro()+30e6 {
					soon = append(soon, e)
				}
			}
			var ends []instant
			for _, e := range soon {
				if e.penalty {
					ends = append(ends, e)
				}
			}
			if len(ends) > 0 && rng.IntN(2) == 0 {
				soon = ends
			}
			if len(soon) > 0 {
				focus = &soon[rng.IntN(len(soon))]
				now = time.UnixMicro(focus.at).In(loc)
				if rng.IntN(3) == 0 {
					now = now.Add(-time.Microsecond)
				}
			}
		default:
			// A late read: only where nothing ends in between, so that a
			// store that drops what has ended (a Redis TTL) and one that
			// keeps it decide alike.
			back := now.Add(-time.Duration(1+rng.IntN(50)) * time.Millisecond)
			late := true
			for _, e := range w.expiries() {
				if e.at > back.UnixMicro()-1e6 && e.at <= now.UnixMicro()+1e6 {
					late = false
				}
			}
			if late {
				now = back
				// Half the time on the key just written, whose window or
				// log the late read joins (a late Allow on a log that
				// began after it, say); always when that was a sliding
				// log, whose event the late one goes before.
				again = lastRule != nil && (strings.HasPrefix(lastRule.Window.String(), "sliding") || rng.IntN(2) == 0)
			}
		}
		at := now
		rec.reqs = nil
		l := countlimit.New(rec, countlimit.WithClock(func() time.Time { return at }))
		ctx := context.Background()
		r := rs[rng.IntN(len(rs))]
		id := ids[rng.IntN(len(ids))]
		slots := false
		if again || slidNext == 2 {
			r, id = *lastRule, lastID
		} else if focus == nil && lastRule != nil && expose.WindowOf(lastRule.Window).Concurrent && rng.IntN(2) == 0 {
			// An Acquire on the slots the step before used: a key's
			// slots fill up, and a denial starts its penalty.
			r, id, slots = *lastRule, lastID, true
		} else if alt := otherKinds(rs, lastRule); len(alt) > 0 && rng.IntN(4) == 0 {
			// The rule of another kind on the key the step before
			// wrote: two processes whose rule files differ, by turns.
			r, id = alt[rng.IntN(len(alt))], lastID
		} else if focus != nil {
			for string(r.UseType) != focus.ut {
				r = rs[rng.IntN(len(rs))]
			}
			id = focus.id
		}
		r = vary(rng, r)
		if back && rng.IntN(3) == 0 {
			r.Block = 0 // asked again by a rule without a penalty
		}
		n := int64(1 + rng.IntN(3))
		var desc string
		op := rng.IntN(14)
		// hot: a batch of a hot id's calls, every one on the key the step
		// before wrote, whose row is then there, often with room for them
		// all (PostgreSQL's countlimit_allow_batch_pooled decides such a
		// batch by a statement of its own, which random keys seldom
		// reach), under its rule, or, when that rule is sliding or
		// smooth, a rule of a window on its use type (on a log or a
		// smooth instant); half the hot batches have a call on another
		// key whose window has room too, between them.
		hot, hotRule := false, windowRule(rs, lastRule)
		switch {
		case slidNext == 2:
			op = 8 // a refund of one
		case again || slots:
			op = 0 // an allow, or an acquire
		case atRoom:
			op = 5 // a batch of two calls on it
		case focus == nil && hotRule != nil && rng.IntN(5) == 0:
			op, hot = 5, true
		case focus != nil && !expose.WindowOf(r.Window).Concurrent && rng.IntN(5) < 4:
			op = []int{0, 5}[rng.IntN(2)] // an allow, or a batch, at the instant
		case focus != nil && expose.WindowOf(r.Window).Concurrent && rng.IntN(5) < 4:
			op = []int{0, 6, 8}[rng.IntN(3)] // an acquire, release or extend
		}
		switch {
		case expose.WindowOf(r.Window).Concurrent && op < 6:
			desc = fmt.Sprintf("Acquire(%s, %s)", r.UseType, id)
			if ls, _, _ := l.Acquire(ctx, r, id); ls.String() != "" {
				leases = append(leases, ls)
			}
		case expose.WindowOf(r.Window).Concurrent && op < 10 && len(leases) > 0:
			ls := leases[rng.IntN(len(leases))]
			if focus != nil {
				// The lease whose expiry the clock landed on.
				for _, c := range leases {
					if w.key(focus.ut, focus.id).Leases[rec.tokens[leaseforge.Token(c.String())]] == focus.at {
						ls = c
					}
				}
			}
			// Bound again to this step's Limiter, whose clock is now.
			if rl, err := l.ParseLease(ls.String(), r); err == nil {
				if op < 8 {
					desc = fmt.Sprintf("Release(%s %s %.6s)", expose.LeaseUseType(rl), rl.ID(), rec.tokens[leaseforge.Token(rl.String())])
					rl.Release(ctx)
				} else {
					desc = fmt.Sprintf("Extend(%s %s %.6s)", expose.LeaseUseType(rl), rl.ID(), rec.tokens[leaseforge.Token(rl.String())])
					rl.Extend(ctx)
				}
			}
		case expose.WindowOf(r.Window).Concurrent && op < 12:
			desc = fmt.Sprintf("Peek(%s, %s)", r.UseType, id)
			l.Peek(ctx, r, id)
		case expose.WindowOf(r.Window).Concurrent:
			desc = fmt.Sprintf("Reset(%s, %s)", r.UseType, id)
			l.Reset(ctx, r, id)
		case op < 5 && expose.WindowOf(r.Window).Smooth && rng.IntN(4) == 0:
			// A smooth key refunded before it drains: the clock rarely
			// stops inside a key's drain between an allow and a refund
			// step, and a refund's arithmetic then went untested for
			// thousands of steps.
			back := int64(1 + rng.IntN(3))
			desc = fmt.Sprintf("AllowN(%s %v limit %d, %s, %d) then Refund(%d)", r.UseType, r.Window, r.Limit, id, n, back)
			l.AllowN(ctx, r, id, n)
			l.Refund(ctx, r, id, back)
		case op < 5:
			desc = fmt.Sprintf("AllowN(%s %v limit %d, %s, %d)", r.UseType, r.Window, r.Limit, id, n)
			l.AllowN(ctx, r, id, n)
		case op < 7:
			// A batch: allows of rules that are not sliding, over the ids,
			// some of them on one id, as concurrent callers send them.
			// Half the batches have a key each (PostgreSQL's
			// countlimit_allow_distinct), the others repeat keys. At an
			// instant something of a key ends, a batch of keys of their
			// own has that key first, one that repeats keys has it in
			// two calls of three.
			k, distinct := 2+rng.IntN(5), rng.IntN(2) == 0
			if distinct {
				k = 2 + rng.IntN(len(ids)-1)
			}
			twoKeys, allFocus := false, false
			var other *countlimit.Rule
			var otherID string
			if hot {
				k, distinct = 2+rng.IntN(2), false // of one each: room for them all, under most limits
				if room := w.room(rs, at.UnixMicro(), string(hotRule.UseType), lastID); len(room) > 0 && rng.IntN(2) == 0 {
					o := room[rng.IntN(len(room))]
					twoKeys, other, otherID = true, &o.rule, o.id
				}
			}
			if focus != nil && !distinct && (atRoom || rng.IntN(2) == 0) {
				// Two calls of one each, both on the key whose instant
				// this is: room for both, at a penalty's end, where the
				// penalty came of a call that asked more than the room.
				allFocus, k = true, 2
			}
			order := rng.Perm(len(ids))
			if distinct && focus == nil && empty != nil {
				if k := w.key(empty.ut, empty.id); k.Begin == k.End {
					focus = empty
				}
				empty = nil
			}
			if distinct && focus != nil {
				i := slices.IndexFunc(order, func(i int) bool { return ids[i] == focus.id })
				order[0], order[i] = order[i], order[0]
			}
			var parts []string
			for j := range k {
				b := rs[rng.IntN(len(rs))]
				for expose.WindowOf(b.Window).Concurrent || strings.HasPrefix(b.Window.String(), "sliding") {
					b = rs[rng.IntN(len(rs))]
				}
				bid := ids[rng.IntN(len(ids))]
				if distinct {
					bid = ids[order[j]]
				}
				if hot {
					b, bid = *hotRule, lastID
					if twoKeys && j == 1 {
						b, bid = *other, otherID
					}
				}
				if focus != nil && (distinct && j == 0 || allFocus || !distinct && rng.IntN(3) > 0) {
					// Calls on the key whose instant this is.
					bid = focus.id
					for _, fr := range rs {
						if string(fr.UseType) == focus.ut && isWindow(&fr) {
							b = fr
						}
					}
				}
				bn := int64(1 + rng.IntN(2))
				if hot || allFocus {
					bn = 1
				} else {
					b = vary(rng, b)
					if back && bid == focus.id && rng.IntN(3) == 0 {
						b.Block = 0 // asked again by a rule without a penalty
					}
					if rng.IntN(8) == 0 {
						bn = b.Limit + 1 // more than the rule ever allows: denied, however empty the window
					}
				}
				if !hot && focus == nil && mix.IntN(3) == 0 {
					// A call of another kind beside them, as concurrent
					// callers send every kind: PostgreSQL's group commit of
					// countlimit_apply_batch takes it.
					parts = append(parts, otherCall(ctx, mix, aside, l, rs, bid, &leases))
					continue
				}
				l.AllowN(ctx, b, bid, bn)
				parts = append(parts, fmt.Sprintf("%s/%s", b.UseType, bid))
			}
			desc = "batch(" + strings.Join(parts, " ") + ")"
		case op < 8:
			desc = fmt.Sprintf("Peek(%s %v, %s)", r.UseType, r.Window, id)
			l.Peek(ctx, r, id)
		case op < 9:
			if slidNext == 2 || lastRule != nil && !expose.WindowOf(lastRule.Window).Concurrent && rng.IntN(2) == 0 {
				// One event back on the key the step before counted (the
				// SMS failed): a sliding log keeps the others.
				r, id, n = *lastRule, lastID, 1
			}
			desc = fmt.Sprintf("Refund(%s %v, %s, %d)", r.UseType, r.Window, id, n)
			l.Refund(ctx, r, id, n)
		case op < 10:
			desc = fmt.Sprintf("Reset(%s, %s)", r.UseType, id)
			l.Reset(ctx, r, id)
		case op < 12:
			// 1 to 9 rules, every use type that counts events at most
			// once, in any order, some limits moved.
			k := 1 + rng.IntN(9)
			all := []countlimit.Rule{r}
			parts := []string{fmt.Sprintf("%s %v limit %d", r.UseType, r.Window, r.Limit)}
			for _, j := range rng.Perm(len(rs)) {
				o := rs[j]
				if len(all) == k {
					break
				}
				if expose.WindowOf(o.Window).Concurrent || slices.ContainsFunc(all, func(a countlimit.Rule) bool { return a.UseType == o.UseType }) {
					continue
				}
				if rng.IntN(6) == 0 {
					o.Limit += int64(rng.IntN(3)) - 1
				}
				all = append(all, o)
				parts = append(parts, fmt.Sprintf("%s %v limit %d", o.UseType, o.Window, o.Limit))
			}
			desc = fmt.Sprintf("AllowAll(%s, %s)", id, strings.Join(parts, ", "))
			l.AllowAll(ctx, id, all...)
		default:
			begin := at.Add(-time.Duration(rng.IntN(20)) * time.Second)
			d := time.Duration(1+rng.IntN(15)) * time.Second
			desc = fmt.Sprintf("CheckLimit(rolling, %s, 3, %v, %s)", id, d, begin.Format("15:04:05.000000"))
			l.CheckLimit(ctx, "rolling", id, 3, d, begin)
		}
		if len(rec.reqs) == 0 {
			continue // nothing to do (a lease no longer parses, say)
		}
		done := clones(rec.reqs)
		w.apply(done)
		slid = false
		if q := done[0]; len(done) == 1 && len(q.Checks) == 1 && q.Op == driver.OpAllow {
			c := &q.Checks[0]
			slid = c.Span > 0 && c.State.Allowed && c.State.Used >= 2
		}
		for _, q := range done {
			for _, c := range q.Checks {
				if k := w.key(c.UseType, q.ID); empty == nil && !c.State.Allowed && k.Begin == k.End && k.Blocked == 0 && k.Denied > 0 &&
					c.Span == 0 && !c.Smooth() && c.TTL == 0 {
					empty = &instant{ut: c.UseType, id: q.ID}
				}
				if penalized == nil && !c.State.Allowed && c.State.BlockedUntil.After(q.Now) {
					penalized = &instant{ut: c.UseType, id: q.ID}
					if c.Span == 0 && !c.Smooth() && c.TTL == 0 && c.State.Used+2 <= c.Limit &&
						(c.State.End.IsZero() || c.State.End.After(c.State.BlockedUntil)) {
						roomy = &instant{at: c.State.BlockedUntil.UnixMicro(), ut: c.UseType, id: q.ID, penalty: true}
					}
				}
			}
		}
		lastRule, lastID = &r, id
		for _, id := range ids {
			if len(id) > 40 {
				desc = strings.ReplaceAll(desc, id, fmt.Sprintf("%.12s…(%d bytes)", id, len(id)))
			}
		}
		steps = append(steps, Step{Desc: at.UTC().Format("2006-01-02 15:04:05.000000 ") + desc, Reqs: rec.reqs})
	}
	return steps
}

// otherCall makes, through l, one call on id of a kind other than an
// allow of a window's rule, for a batch: an allow of any rule (sliding,
// smooth), a Peek, a Refund, an AllowAll of two or three rules, or an
// Acquire of slots (its lease joins leases), and at times a lease call
// beside it (leaseCall). It returns its description.
func otherCall(ctx context.Context, rng, aside *rand.Rand, l *countlimit.Limiter, rs []countlimit.Rule, id string, leases *[]countlimit.Lease) string {
	r := vary(rng, rs[rng.IntN(len(rs))])
	if expose.WindowOf(r.Window).Concurrent {
		if ls, _, _ := l.Acquire(ctx, r, id); ls.String() != "" {
			*leases = append(*leases, ls)
		}
		return fmt.Sprintf("Acquire(%s, %s)", r.UseType, id) + leaseCall(ctx, aside, l, r, *leases)
	}
	n := int64(1 + rng.IntN(2))
	switch rng.IntN(5) {
	case 0:
		l.Peek(ctx, r, id)
		return fmt.Sprintf("Peek(%s, %s)", r.UseType, id)
	case 1:
		l.Refund(ctx, r, id, n)
		return fmt.Sprintf("Refund(%s, %s, %d)", r.UseType, id, n)
	case 2:
		all := []countlimit.Rule{r}
		for _, j := range rng.Perm(len(rs))[:1+rng.IntN(2)] {
			if o := rs[j]; !expose.WindowOf(o.Window).Concurrent && o.UseType != r.UseType {
				all = append(all, o)
			}
		}
		uts := make([]string, len(all))
		for i, a := range all {
			uts[i] = string(a.UseType)
		}
		l.AllowAll(ctx, id, all...)
		return fmt.Sprintf("AllowAll(%s/%s)", strings.Join(uts, "+"), id)
	}
	l.AllowN(ctx, r, id, n)
	return fmt.Sprintf("AllowN(%s %v, %s, %d)", r.UseType, r.Window, id, n)
}

// leaseCall sends, half the time, a second call of a concurrency limit
// after a batch's Acquire: a held lease given back or kept longer, or the
// slots of r peeked at (PostgreSQL's group commit of
// countlimit_lease_batch takes them all). It returns the call as a batch's
// description shows it, or "".
func leaseCall(ctx context.Context, rng *rand.Rand, l *countlimit.Limiter, r countlimit.Rule, leases []countlimit.Lease) string {
	if len(leases) == 0 || rng.IntN(2) == 0 {
		return ""
	}
	ls := leases[rng.IntN(len(leases))]
	switch rng.IntN(3) {
	case 0:
		l.Peek(ctx, r, ls.ID())
		return fmt.Sprintf(" Peek(%s, %s)", r.UseType, ls.ID())
	case 1:
		if rl, err := l.ParseLease(ls.String(), r); err == nil {
			rl.Release(ctx)
			return fmt.Sprintf(" Release(%s %s)", expose.LeaseUseType(rl), rl.ID())
		}
	default:
		if rl, err := l.ParseLease(ls.String(), r); err == nil {
			rl.Extend(ctx)
			return fmt.Sprintf(" Extend(%s %s)", expose.LeaseUseType(rl), rl.ID())
		}
	}
	return ""
}

// keyRule is a key, with a rule of a window on its use type.
type keyRule struct {
	rule countlimit.Rule
	id   string
}

// room returns the keys of w but (ut, id) whose window, under a rule of
// rs of a window on their use type, is current at now with room for
// one more, no penalty running, in order of use type and id.
func (w world) room(rs []countlimit.Rule, now int64, ut, id string) []keyRule {
	var out []keyRule
	for name, k := range w {
		kut, kid, _ := strings.Cut(name, "\x00")
		if kut == ut && kid == id || k.Blocked > now || !(k.Begin < k.End && now < k.End) {
			continue
		}
		for _, r := range rs {
			if string(r.UseType) == kut && isWindow(&r) && k.Count+1 <= r.Limit {
				out = append(out, keyRule{r, kid})
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b keyRule) int {
		return cmp.Or(strings.Compare(string(a.rule.UseType), string(b.rule.UseType)), strings.Compare(a.id, b.id))
	})
	return out
}

// isWindow reports whether r is a rule of a window: not sliding, smooth
// or concurrent (the fast path's rules).
func isWindow(r *countlimit.Rule) bool {
	return !expose.WindowOf(r.Window).Concurrent && !expose.WindowOf(r.Window).Smooth && !strings.HasPrefix(r.Window.String(), "sliding")
}

// windowRule returns last when it is a rule of a window (not sliding,
// smooth or concurrent), else a rule of rs of a window on last's use
// type, if any; nil when last is nil or concurrent.
func windowRule(rs []countlimit.Rule, last *countlimit.Rule) *countlimit.Rule {
	if last == nil || expose.WindowOf(last.Window).Concurrent {
		return nil
	}
	if isWindow(last) {
		return last
	}
	for _, o := range otherKinds(rs, last) {
		if isWindow(&o) {
			return &o
		}
	}
	return nil
}

// otherKinds returns the rules of rs on last's use type whose window is of
// another kind than last's; none when last is nil.
func otherKinds(rs []countlimit.Rule, last *countlimit.Rule) []countlimit.Rule {
	var out []countlimit.Rule
	for _, r := range rs {
		if last != nil && r.UseType == last.UseType && kind(r.Window) != kind(last.Window) {
			out = append(out, r)
		}
	}
	return out
}

// kind is a window's kind: its String up to the first space.
func kind(w countlimit.Window) string {
	k, _, _ := strings.Cut(w.String(), " ")
	return k
}
