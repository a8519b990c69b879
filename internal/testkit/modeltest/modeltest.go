// Package modeltest is the seeded differential harness that holds every
// store path to the reference model (model.Apply): random steps over a
// few ids and rules, on a stub clock that moves forward in small and large
// steps (sometimes landing exactly on a window's end, a penalty's end or a
// lease's expiry, sometimes reading a little late), are carried out by the
// model and by every path a store has; after each step the Results and the
// whole stored state of every key (count, window, tally, penalty, sliding
// log, live leases), read back from the store, must equal the model's. A
// key whose window, penalty, log and leases are all over counts as empty
// on a path that expires keys (Path.Expires: Redis), so there the tally
// of such a key (a denial of a new key without a Block leaves one) goes
// unchecked: modeltest.RunContract's ADenialOfANewKeyIsTallied holds it.
// On the other paths that tally must still agree.
//
// A failure prints the seed, the step and the shortest list of steps that
// still fails, found by dropping steps while the failure stays. The seed
// comes from COUNTLIMIT_MODEL_SEED (to replay one), else from the time;
// COUNTLIMIT_MODEL_STEPS sets how many random steps a run takes (default
// 300), before the few targeted ones every run ends with (targeted).
// A seed gives the same steps every time (TestGenIsDeterministic), lease
// tokens included. Each store's test package calls Run with its paths
// (memstore, pgstore and redisstore's model_test.go).
package modeltest

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the zones a run draws, on every machine

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/leaseforge"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// Path is one way a store carries out requests: PostgreSQL's one
// statement, its batches, countlimit_apply, a caller's transaction; a
// Redis script; memstore.
type Path struct {
	Name string
	// Do carries out a step: one request, or a batch of allows of one
	// rule that is not sliding each, which a path that batches sends
	// together and any other one after another. It writes the states.
	Do func(ctx context.Context, reqs []*driver.Request) error
	// Read returns what the store keeps of (ut, id).
	Read func(ctx context.Context, ut, id string) (model.Key, error)
	// Skip, when not nil, reports the steps the path cannot take (a path
	// of the fast statements takes no sliding check, say); the model and
	// the path then carry out the step with Fallback.
	Skip func(reqs []*driver.Request) bool
	// Fallback carries out the steps Skip reports, so the path's keys
	// stay in step with the model's.
	Fallback func(ctx context.Context, reqs []*driver.Request) error
	// Expires is set for a store that drops a key once its window,
	// penalty, log and leases are over (Redis, by TTL): such a key counts
	// as empty, its denial tally included. A store that keeps a key until
	// a Reset or a purge (memstore without its janitor, PostgreSQL) leaves
	// it false and is held to the tally of every key, even one with
	// nothing else live, as a denial of a new key without a Block leaves.
	Expires bool
	// Cases, when set, names the cases of the path's own statements that
	// a step reached, as "copy: case" (see Tally): it is called after
	// every step the path carried out itself (not Skip's), with the
	// requests as the path answered them and, for each request, its
	// checks' keys in the model just before it. It names only cases of
	// AllCases.
	Cases func(reqs []*driver.Request, before [][]model.Key) []string
	// AllCases are every case Cases may name: a case a run never reaches
	// is tallied 0.
	AllCases []string
}

// Each returns a Path.Do that carries out a step's requests with do, one
// after another: the Do of a path that sends no batch.
func Each(do func(context.Context, *driver.Request) error) func(context.Context, []*driver.Request) error {
	return func(ctx context.Context, reqs []*driver.Request) error {
		for _, r := range reqs {
			if err := do(ctx, r); err != nil {
				return err
			}
		}
		return nil
	}
}

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

// smoothEvery gives each use type with a smooth rule its interval and
// burst, in µs, for the instants a key's units drain at.
var smoothEvery = func() map[string][2]int64 {
	out := map[string][2]int64{}
	for _, r := range rules(time.UTC, true) {
		if expose.WindowOf(r.Window).Smooth {
			out[string(r.UseType)] = [2]int64{expose.Interval(r.Window, r.Limit).Microseconds(), expose.WindowOf(r.Window).Burst}
		}
	}
	return out
}()

// useTypes are the rules' use types, each once.
var useTypes = func() []string {
	var out []string
	for _, r := range rules(time.UTC, true) {
		if !slices.Contains(out, string(r.UseType)) {
			out = append(out, string(r.UseType))
		}
	}
	return out
}()

// spans gives each use type the span of its sliding rule, for the live
// part of a log.
var spans = map[string]int64{"sliding": 9e6, "slidingblock": 4e6, "slidingwide": 13e6, "lifetime": 5e6}

// idPool is what a run's three ids are drawn from: short and long ids,
// the characters the stores' keys escape or split on (':', '{', '}',
// '%'), and other scripts.
var idPool = []string{"a", "b", "c", "用户:42", "a{b}c", "}{", "x%3Ay", "x:y", strings.Repeat("長", expose.MaxIDLen/3)}

// zones are what a run's calendar windows are drawn from: daylight saving
// time in both hemispheres, midnight skipped (Santiago) or twice (Amman,
// until 2021), a skipped day (Apia), 30- and 45-minute offsets and
// changes (Lord Howe, Chatham), and none (UTC, Kathmandu).
var zones = []string{"America/New_York", "Asia/Amman", "America/Santiago", "Pacific/Apia", "Australia/Lord_Howe", "Pacific/Chatham", "Asia/Kathmandu", "UTC", "Europe/Berlin"}

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

// Step is one step of a run: the clock's reading and the requests, built
// by the Limiter as a caller's call would be.
type Step struct {
	Desc string
	Reqs []*driver.Request
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

// world is the model's state of every key, by use type and id.
type world map[string]*model.Key

func keyName(ut, id string) string { return ut + "\x00" + id }

func (w world) key(ut, id string) *model.Key {
	k := w[keyName(ut, id)]
	if k == nil {
		k = &model.Key{}
		w[keyName(ut, id)] = k
	}
	return k
}

// apply carries out reqs on w, one after another.
func (w world) apply(reqs []*driver.Request) { w.applyFrom(reqs, false) }

// applyFrom carries out reqs on w, one after another; with before, it
// returns each request's checks' keys as they were just before it.
func (w world) applyFrom(reqs []*driver.Request, before bool) [][]model.Key {
	var out [][]model.Key
	if before {
		out = make([][]model.Key, len(reqs))
	}
	for j, r := range reqs {
		keys := make([]*model.Key, len(r.Checks))
		for i := range r.Checks {
			keys[i] = w.key(r.Checks[i].UseType, r.ID)
			if before {
				out[j] = append(out[j], keystate.Clone(*keys[i]))
			}
		}
		model.Apply(r, keys)
	}
	return out
}

// instant is when something of a key ends.
type instant struct {
	at      int64
	ut, id  string
	penalty bool // a penalty's end
}

// expiries returns every instant at which something of w ends: windows,
// penalties, sliding events and leases, in one order whatever order the
// maps give: by instant, use type and id (two equal instants of a key are
// alike), so that gen, which picks from them, gives a seed's steps again.
func (w world) expiries() []instant {
	var out []instant
	for name, k := range w {
		ut, id, _ := strings.Cut(name, "\x00")
		if k.Begin < k.End && k.End != model.Forever {
			out = append(out, instant{at: k.End, ut: ut, id: id})
		}
		if k.Blocked > 0 {
			out = append(out, instant{k.Blocked, ut, id, true})
		}
		for _, e := range k.Log {
			out = append(out, instant{at: e + spans[ut], ut: ut, id: id})
		}
		for _, e := range k.Leases {
			out = append(out, instant{at: e, ut: ut, id: id})
		}
		// When the key is drained, and when each unit of its burst is.
		if every, ok := smoothEvery[ut]; ok && k.TAT > 0 {
			for j := range every[1] {
				out = append(out, instant{at: k.TAT - j*every[0], ut: ut, id: id})
			}
		}
	}
	slices.SortFunc(out, func(a, b instant) int {
		return cmp.Or(cmp.Compare(a.at, b.at), strings.Compare(a.ut, b.ut), strings.Compare(a.id, b.id), compareBool(a.penalty, b.penalty))
	})
	return out
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
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

// clones returns deep copies of reqs, with prefix before every use type.
func clonesFor(reqs []*driver.Request, prefix string) []*driver.Request {
	out := make([]*driver.Request, len(reqs))
	for i, r := range reqs {
		c := *r
		c.Checks = slices.Clone(r.Checks)
		for j := range c.Checks {
			c.Checks[j].UseType = prefix + c.Checks[j].UseType
			c.Checks[j].State = driver.State{}
		}
		out[i] = &c
	}
	return out
}

func clones(reqs []*driver.Request) []*driver.Request { return clonesFor(reqs, "") }

// Canon is what must be equal of a key in every store at now: a key whose
// window, penalty, log and leases are all over may be gone (a Redis TTL,
// a janitor) or kept, and counts as empty, but for its denial tally when
// tally is set (a Path that does not expire keys); a log and the leases
// count by what is live, for a sliding span of span µs (0 for none).
func Canon(k model.Key, span, now int64, tally bool) string {
	k = keystate.Live(k, span, now)
	log, leases := k.Log, k.Leases
	window := k.Begin < k.End
	if (!window || k.End <= now) && k.Blocked <= now && len(log) == 0 && len(leases) == 0 && k.TAT <= now {
		if tally {
			return fmt.Sprintf("(nothing live) denied %d", k.Denied)
		}
		return "(nothing live)"
	}
	var b strings.Builder
	if window {
		end := "forever"
		if k.End != model.Forever {
			end = strconv.FormatInt(k.End, 10)
		}
		fmt.Fprintf(&b, "count %d [%d, %s) ", k.Count, k.Begin, end)
	}
	if len(log) > 0 {
		fmt.Fprintf(&b, "log %v ", log)
	}
	if k.TAT > now {
		fmt.Fprintf(&b, "tat %d ", k.TAT)
	}
	fmt.Fprintf(&b, "denied %d blocked %d", k.Denied, k.Blocked)
	if len(leases) > 0 {
		fmt.Fprintf(&b, " leases %v", leaseText(leases, 6))
	}
	return b.String()
}

func stateString(s driver.State) string {
	t := func(v time.Time) string {
		if v.IsZero() {
			return "-"
		}
		return strconv.FormatInt(v.UnixMicro(), 10)
	}
	return fmt.Sprintf("{%v used %d [%s, %s) blocked %s free %s}", s.Allowed, s.Used, t(s.Begin), t(s.End), t(s.BlockedUntil), t(s.FreeAt))
}

// Steps returns how many steps a run takes: COUNTLIMIT_MODEL_STEPS, else
// def.
func Steps(def int) int {
	if n, err := strconv.Atoi(os.Getenv("COUNTLIMIT_MODEL_STEPS")); err == nil && n > 0 {
		return n
	}
	return def
}

// Seed returns the run's seed: COUNTLIMIT_MODEL_SEED, else from the time.
func Seed() uint64 {
	if s, err := strconv.ParseUint(os.Getenv("COUNTLIMIT_MODEL_SEED"), 10, 64); err == nil {
		return s
	}
	return uint64(time.Now().UnixNano())
}

// prefixes make each run's keys its own.
var runs atomic.Int64

// keyspace is every key a run may write, read back after each step: its
// use types and ids, and the span of each use type's sliding rule (0 for
// none), for the live part of a log.
type keyspace struct {
	uts, ids []string
	spans    map[string]int64
}

// replay carries out steps on p and the model, on fresh keys, and returns
// the index of the first step whose Results or stored states differ, with
// what differs; -1 when none does.
func replay(ctx context.Context, p Path, steps []Step, ks keyspace, prefix string) (int, string) {
	return replayFrom(ctx, p, world{}, steps, ks, prefix, nil)
}

// replayFrom is replay from the keys of w, which the store holds already.
// With tally, it counts there the cases (Path.Cases) each step reached.
func replayFrom(ctx context.Context, p Path, w world, steps []Step, ks keyspace, prefix string, tally Tally) (int, string) {
	for i, st := range steps {
		want := clones(st.Reqs)
		before := w.applyFrom(want, tally != nil && p.Cases != nil)
		got := clonesFor(st.Reqs, prefix)
		do := p.Do
		skipped := p.Skip != nil && p.Skip(got)
		if skipped {
			do = p.Fallback
		}
		if err := protect(func() error { return do(ctx, got) }); err != nil {
			return i, fmt.Sprintf("%s: %v", p.Name, err)
		}
		if before != nil && !skipped {
			for _, c := range p.Cases(got, before) {
				tally[c]++
			}
		}
		for j := range want {
			for c := range want[j].Checks {
				if g, m := stateString(got[j].Checks[c].State), stateString(want[j].Checks[c].State); g != m {
					return i, fmt.Sprintf("request %d check %s: %s got %s, the model %s", j, want[j].Checks[c].UseType, p.Name, g, m)
				}
			}
		}
		if why := compareKeys(ctx, p, w, ks, prefix, st.Reqs[0].Now.UnixMicro()); why != "" {
			return i, why
		}
	}
	return -1, ""
}

// compareKeys reads every key of ks back from p and says how the first
// that differs from the model's, at now, differs; "" when none does.
func compareKeys(ctx context.Context, p Path, w world, ks keyspace, prefix string, now int64) string {
	for _, ut := range ks.uts {
		for _, id := range ks.ids {
			k, err := p.Read(ctx, prefix+ut, id)
			if err != nil {
				return fmt.Sprintf("reading (%s, %.12s): %v", ut, id, err)
			}
			if g, m := Canon(k, ks.spans[ut], now, !p.Expires), Canon(*w.key(ut, id), ks.spans[ut], now, !p.Expires); g != m {
				return fmt.Sprintf("stored (%s, %.12s): %s keeps %s, the model %s", ut, id, p.Name, g, m)
			}
		}
	}
	return ""
}

// Upgrade holds a store brought up from an earlier version of itself to
// the model: the first half of a seeded run is carried out by the model
// alone, and seed writes every key it leaves (counts mid-window,
// penalties, sliding logs, leases, denial tallies) as the earlier version
// kept them; upgrade then brings the store to its latest version. Every
// key read back must be the model's, and the run's second half, carried
// out by p and the model together, must agree after every step, as in Run.
//
// No released version kept smooth windows (v0.1.0 refused them), so the
// earlier version never holds a smooth instant: the first half's smooth
// rules count in the model alone, and their instants (TATs) are dropped
// from the model before the keys are written (as if they had drained;
// the keys' tallies and penalties stay). The second half then uses smooth rules on the upgraded store, on keys of every
// kind, a use type that changes kind included.
func Upgrade(t *testing.T, p Path, seed func(ctx context.Context, ut, id string, k model.Key) error, upgrade func(ctx context.Context) error) {
	t.Helper()
	s, n, steps, ks := planRun()
	ctx := context.Background()
	prefix := fmt.Sprintf("u%d.%d.", s%1e6, runs.Add(1))
	half := len(steps) / 2
	w := world{}
	for _, st := range steps[:half] {
		w.apply(clones(st.Reqs))
	}
	written := 0
	for _, ut := range ks.uts {
		for _, id := range ks.ids {
			w.key(ut, id).TAT = 0 // no earlier version kept one
			k := keystate.Clone(*w.key(ut, id))
			if keystate.Empty(&k) {
				continue
			}
			if err := seed(ctx, prefix+ut, id, k); err != nil {
				t.Fatalf("seed %d: writing (%s, %.12s) as the earlier version: %v", s, ut, id, err)
			}
			written++
		}
	}
	if written == 0 {
		t.Fatalf("seed %d: the first %d steps left no key to upgrade", s, half)
	}
	if err := upgrade(ctx); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	replayText := fmt.Sprintf("COUNTLIMIT_MODEL_SEED=%d COUNTLIMIT_MODEL_STEPS=%d to replay", s, n)
	if why := compareKeys(ctx, p, w, ks, prefix, steps[half-1].Reqs[0].Now.UnixMicro()); why != "" {
		t.Fatalf("seed %d (%s): after the upgrade, of %d keys written: %s", s, replayText, written, why)
	}
	if at, why := replayFrom(ctx, p, w, steps[half:], ks, prefix, nil); at >= 0 {
		t.Fatalf("seed %d (%s): step %d of %d, the %dth after the upgrade (%s): %s", s, replayText, half+at+1, n, at+1, steps[half+at].Desc, why)
	}
	smooth := 0
	for _, st := range steps[half:] {
		if slices.ContainsFunc(st.Reqs, (*driver.Request).Smooth) {
			smooth++
		}
	}
	if smooth == 0 {
		t.Fatalf("seed %d: no step after the upgrade has a smooth check", s)
	}
	t.Logf("seed %d: %d keys written as the earlier version kept them, read back and used for %d steps after the upgrade, %d of them with smooth checks", s, written, len(steps)-half, smooth)
}

// protect runs f and turns a panic into an error, so that a path that
// panics is a failing step, with its seed and steps, like any other.
func protect(f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panicked: %v", v)
		}
	}()
	return f()
}

// planRun makes a run's steps from its seed and step count, and the keys
// it may write.
func planRun() (seed uint64, n int, steps []Step, ks keyspace) { return plan(Seed(), Steps(300)) }

// plan is a run of seed: n random steps, then the targeted ones
// (targeted), and the keys they may write.
func plan(seed uint64, n int) (uint64, int, []Step, keyspace) {
	_, _, ids := setting(seed)
	steps := gen(seed, n, true)
	steps = append(steps, targeted(seed, steps[len(steps)-1].Reqs[0].Now, ids)...)
	return seed, n, steps, keyspace{uts: append(slices.Clone(useTypes), targetedUseTypes...), ids: ids, spans: spans}
}

// Run drives every path of paths and the model through one seeded run and
// fails t at the first difference, with the seed and the shortest list of
// steps that still shows it. The seed, the first step that differs and
// why are printed at once (on standard error, so that they survive a
// timeout), before the steps are shrunk; shrinking stops when its budget
// is spent (ShrinkBudget) and prints what it has so far.
func Run(t *testing.T, paths []Path) {
	t.Helper()
	seed, n, steps, ks := planRun()
	ctx := context.Background()
	for _, p := range paths {
		t.Run(p.Name, func(t *testing.T) {
			prefix := fmt.Sprintf("m%d.%d.", seed%1e6, runs.Add(1))
			tally := Tally{}
			at, why := replayFrom(ctx, p, world{}, steps, ks, prefix, tally)
			if at < 0 {
				writeTally(t, p, tally)
				return
			}
			replayText := fmt.Sprintf("COUNTLIMIT_MODEL_SEED=%d COUNTLIMIT_MODEL_STEPS=%d to replay", seed, n)
			fmt.Fprintf(os.Stderr, "modeltest: %s: seed %d (%s), step %d of %d (%s): %s; shrinking\n",
				t.Name(), seed, replayText, at+1, n, steps[at].Desc, why)
			budget := ShrinkBudget()
			if d, ok := t.Deadline(); ok {
				budget = min(budget, time.Until(d)/2)
			}
			short, done := shrink(ctx, p, steps[:at+1], ks, prefix+"s", time.Now().Add(budget))
			var b strings.Builder
			for i, st := range short {
				fmt.Fprintf(&b, "\n  %d. %s", i+1, st.Desc)
			}
			what := "the shortest steps that still differ"
			if !done {
				what = fmt.Sprintf("shrinking stopped after %v (COUNTLIMIT_MODEL_SHRINK); steps that still differ", budget.Round(time.Second))
			}
			t.Fatalf("seed %d (%s), step %d of %d: %s\n%s (%d):%s",
				seed, replayText, at+1, n, why, what, len(short), b.String())
		})
	}
}

// ShrinkBudget is how long a failing run may spend shrinking its steps:
// COUNTLIMIT_MODEL_SHRINK (a duration, "2m"), else one minute. Run takes
// at most half of what is left of the test's -timeout besides.
func ShrinkBudget() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("COUNTLIMIT_MODEL_SHRINK")); err == nil && d > 0 {
		return d
	}
	return time.Minute
}

// shrink drops steps from failing while the path still differs from the
// model: runs of half the steps, then of a quarter, down to one step at a
// time. It returns what is left, and whether it got to the end before
// deadline.
func shrink(ctx context.Context, p Path, failing []Step, ks keyspace, prefix string, deadline time.Time) ([]Step, bool) {
	tries := 0
	for chunk := max(1, len(failing)/2); ; chunk /= 2 {
		for i := 0; i < len(failing); {
			if time.Now().After(deadline) {
				return failing, false
			}
			candidate := append(slices.Clone(failing[:i]), failing[min(i+chunk, len(failing)):]...)
			tries++
			if at, _ := replay(ctx, p, candidate, ks, fmt.Sprintf("%s%d.", prefix, tries)); at >= 0 {
				failing = candidate[:at+1]
				continue
			}
			i += chunk
		}
		if chunk == 1 {
			return failing, true
		}
	}
}
