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
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the zones a run draws, on every machine

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/keystate"
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

// Step is one step of a run: the clock's reading and the requests, built
// by the Limiter as a caller's call would be.
type Step struct {
	Desc string
	Reqs []*driver.Request
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
