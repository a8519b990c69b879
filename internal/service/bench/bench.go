package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/service/clikit"
	"github.com/countlimit/countlimit/internal/service/ruleops"
)

// Run runs "countlimit bench" with args (those after "bench"): it runs
// concurrent Allow calls against a store for a while and reports
// throughput and latency: the numbers the README records come from here
// and from the testing.B benchmarks. With --baseline it compares Allow with
// the hand-written SQL a user would otherwise write. A bad command line is
// a clikit.UsageError, -h a clikit.HelpRequest.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, env Env) error {
	fs := clikit.NewFlagSet("bench")
	storeURL := clikit.StoreFlag(fs, "", "memory, postgres://... or redis://...")
	rulesPath := fs.String("rules", "", "the YAML rule `FILE` of --rule (default: the built-in example rules)")
	ruleName := fs.String("rule", "", "check the rule or group `NAME` (a group with AllowAll; default: a fixed 1m window no call fills)")
	tier := fs.String("tier", "", "the tier `T` of --rule whose limits apply")
	duration := fs.Duration("duration", 10*time.Second, "how long each run lasts (default 10s; with --baseline each cell, default 5s)")
	concurrency := fs.String("concurrency", "", "the old name of --callers")
	ids := fs.Int("ids", 1000, "the calls spread over `N` distinct ids (default 1000; with --baseline 10000)")
	baseline := fs.Bool("baseline", false, "PostgreSQL: compare Allow with a hand-written upsert, side by side")
	callers := fs.String("callers", "", "concurrent callers, or a `LIST` like 1,4,16,64 for one run each (default 16; with --baseline 1,4,16,64)")
	rowsFlag := fs.String("rows", "existing,new", "with --baseline: the tables to compare on, a `LIST` of existing (every id counted before), new (every call a new id) and random (ids drawn at random from --ids, tables from TRUNCATE and ANALYZE, the series run twice)")
	checkFlag := fs.String("check", "fixed", "with --baseline: the kinds of check set beside the upsert, a `LIST` of fixed (Allow of a fixed window), smooth, sliding, allowall (AllowAll of a fixed and a calendar rule) and lease (Acquire + Release), or all")
	tableRows := fs.Int("table-rows", 0, "with --baseline --rows existing: fill both tables with `N` rows first and draw every call's id at random from them (instead of --ids)")
	asJSON := fs.Bool("json", false, "print the results as JSON (the table goes to stderr)")
	asCSV := fs.Bool("csv", false, "print the results as CSV, one row per run and side (the table goes to stderr)")
	plot := fs.String("plot", "", "also draw calls/s and p50/p99 latency against callers, as SVG, into `FILE.svg`")
	if err := clikit.Parse(fs, args); err != nil {
		return err
	}
	mode := "bench"
	if *baseline {
		mode = "bench --baseline"
	}
	switch {
	case fs.NArg() > 0:
		return clikit.UsageErrorf("bench: unexpected argument %q", fs.Arg(0))
	case *asJSON && *asCSV:
		return clikit.UsageErrorf("bench: --json and --csv both print to stdout; pick one")
	case *plot != "" && !strings.HasSuffix(strings.ToLower(*plot), ".svg"):
		return clikit.UsageErrorf("bench: --plot writes SVG: name a FILE.svg, got %q", *plot)
	case clikit.IsSet(fs, "concurrency") && clikit.IsSet(fs, "callers"):
		return clikit.UsageErrorf("%s: --concurrency is the old name of --callers; give one", mode)
	case !*baseline && clikit.IsSet(fs, "check"):
		return clikit.UsageErrorf("bench: --check goes with --baseline")
	case !*baseline && clikit.IsSet(fs, "rows"):
		return clikit.UsageErrorf("bench: --rows goes with --baseline")
	case *baseline && (*ruleName != "" || *tier != "" || *rulesPath != ""):
		return clikit.UsageErrorf("bench --baseline: compares a fixed 1m window; it takes no --rule, --tier or --rules")
	case *tier != "" && *ruleName == "":
		return clikit.UsageErrorf("bench: --tier goes with --rule")
	case *duration <= 0:
		return clikit.UsageErrorf("%s: --duration must be positive, got %v", mode, *duration)
	case *ids < 1:
		return clikit.UsageErrorf("%s: --ids must be at least 1, got %d", mode, *ids)
	case clikit.IsSet(fs, "table-rows") && !*baseline:
		return clikit.UsageErrorf("bench: --table-rows goes with --baseline --rows existing")
	case clikit.IsSet(fs, "table-rows") && (*tableRows < 1 || *tableRows > maxTableRows):
		return clikit.UsageErrorf("bench --baseline: --table-rows must be from 1 to %d, got %d", maxTableRows, *tableRows)
	case clikit.IsSet(fs, "table-rows") && strings.TrimSpace(*rowsFlag) != rowsExisting:
		return clikit.UsageErrorf("bench --baseline: --table-rows fills the tables of --rows existing alone; give --rows existing, got --rows %q", *rowsFlag)
	case clikit.IsSet(fs, "table-rows") && clikit.IsSet(fs, "ids"):
		return clikit.UsageErrorf("bench --baseline: --table-rows draws the ids from the rows it fills; give no --ids")
	}
	var checks []baselineCheck
	if *baseline {
		var err error
		if checks, err = parseChecks(*checkFlag); err != nil {
			return err
		}
		switch {
		case clikit.IsSet(fs, "table-rows") && (len(checks) != 1 || checks[0].name != "fixed"):
			return clikit.UsageErrorf("bench --baseline: --table-rows fills the tables with fixed-window rows; it goes with --check fixed alone, got --check %q", *checkFlag)
		case *plot != "" && len(checks) != 1:
			return clikit.UsageErrorf("bench --baseline: --plot draws one kind of check; give --check one kind, got %q", *checkFlag)
		}
	}
	list, flagName := cmp.Or(*callers, "16"), "--callers"
	if clikit.IsSet(fs, "concurrency") {
		list, flagName = *concurrency, "--concurrency"
	}
	if *baseline {
		list = cmp.Or(*callers, *concurrency, "1,4,16,64")
		if !clikit.IsSet(fs, "ids") {
			*ids = 10000
		}
		if !clikit.IsSet(fs, "duration") {
			*duration = 5 * time.Second
		}
	}
	cs, err := parseCallers(mode, flagName, list)
	if err != nil {
		return err
	}
	url, err := storeURL()
	if err != nil {
		return err
	}
	out := benchOutput{stdout: stdout, warn: stderr, json: *asJSON, csv: *asCSV}
	out.human = stdout
	if *asJSON || *asCSV {
		out.human = stderr
	}
	if *plot != "" {
		// Created now, so a bad path fails before a long run rather than after.
		if out.plot, err = os.Create(*plot); err != nil {
			return fmt.Errorf("bench: --plot: %w", err)
		}
		defer func() {
			if out.plot != nil {
				out.plot.Close()
				os.Remove(*plot)
			}
		}()
	}
	if *baseline {
		rows, err := parseRows(*rowsFlag)
		if err != nil {
			return err
		}
		if err := benchBaseline(ctx, url, checks, cs, *duration, *ids, *tableRows, rows, &out); err != nil {
			return err
		}
		return out.finish()
	}
	rf, err := clikit.LoadRules(*rulesPath)
	if err != nil {
		return err
	}
	b := benchRules{names: []string{"bench"}, rules: []countlimit.Rule{{UseType: "bench", Limit: 1 << 50, Window: countlimit.Fixed(time.Minute)}}}
	if *ruleName != "" {
		// As allow resolves it: a concurrent rule (slots, not events) is
		// refused here, before a run whose every call would fail.
		rs, err := ruleops.Resolve(rf, driver.OpAllow, *ruleName, *tier)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		b = benchRules{name: *ruleName, tier: *tier, names: rf.Members(*ruleName), rules: rs}
	}
	st, err := env.Open(ctx, url)
	if err != nil {
		return err
	}
	defer st.Close()
	return benchStore(ctx, st, b, cs, *duration, *ids, &out)
}

// benchRules is what a plain bench checks: one rule, or a group's rules
// (with AllowAll), and the names the rule file gives them.
type benchRules struct {
	name, tier string // --rule and --tier; "" for the default rule
	names      []string
	rules      []countlimit.Rule
}

// forRun returns the rules with use types of their own for one run,
// "bench.<random>.<run>[.<use type>]", so that no run counts into a real
// counter or into another run's.
func (b benchRules) forRun(prefix string, run int) []countlimit.Rule {
	out := slices.Clone(b.rules)
	for i := range out {
		ut := fmt.Sprintf("%s.%d", prefix, run)
		if b.name != "" {
			ut += "." + string(out[i].UseType)
		}
		out[i].UseType = countlimit.UseType(ut)
	}
	return out
}

// benchStore runs one plain bench per number of callers against st, then
// deletes the counters it made.
func benchStore(ctx context.Context, st *Store, b benchRules, callers []int, d time.Duration, ids int, out *benchOutput) error {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	prefix := "bench." + hex.EncodeToString(rnd[:])
	l := countlimit.New(st.Store)
	names := benchIDs(ids)
	call := "allow"
	if len(b.rules) > 1 {
		call = "allow_all"
	}
	out.report = benchReport{Mode: "bench", Store: st.Desc, Rule: b.name, Tier: b.tier, RunSeconds: d.Seconds(), Started: time.Now().UTC()}
	for i, r := range b.rules {
		out.report.Rules = append(out.report.Rules, benchRule{Name: b.names[i], Window: r.Window.String(), Limit: r.Limit, BlockSeconds: r.Block.Seconds()})
	}
	what := "rule " + b.describe()
	fmt.Fprintf(out.human, "countlimit bench: store %s, %s, over %s, %v per run\n", st.Desc, what, clikit.Plural(ids, "id", "ids"), d)
	out.header()
	var used []countlimit.Rule
	defer func() {
		if err := cleanUp(ctx, st, l, used, names); err != nil {
			fmt.Fprintf(out.human, "countlimit: bench: deleting its counters (use types %s.*): %v\n", prefix, err)
		}
	}()
	var failed *measurement
	for run, c := range callers {
		rules := b.forRun(prefix, run)
		used = append(used, rules...)
		m := measure(ctx, c, d, inTurn(names), func(ctx context.Context, id string) (bool, error) {
			if len(rules) == 1 {
				res, err := l.Allow(ctx, rules[0], id)
				return res.Allowed, err
			}
			res, err := l.AllowAll(ctx, id, rules...)
			return err == nil && res[0].Allowed, err
		})
		if err := ctx.Err(); err != nil {
			return err
		}
		m.stalled(out.warn, call, c)
		out.add(newBenchRun(m, c, ids, call))
		if m.errs > 0 && failed == nil {
			failed = m
		}
	}
	if err := out.finish(); err != nil {
		return err
	}
	if failed != nil {
		return fmt.Errorf("bench: %s failed, the first: %w", clikit.Plural(failed.errs, "call", "calls"), failed.firstErr)
	}
	return nil
}

// describe names what b checks, for the header line.
func (b benchRules) describe() string {
	if b.name == "" {
		return fmt.Sprintf("bench (%v, a limit no call reaches)", b.rules[0].Window)
	}
	parts := make([]string, len(b.rules))
	for i, r := range b.rules {
		parts[i] = fmt.Sprintf("%s (%v, limit %d)", b.names[i], r.Window, r.Limit)
		if r.Block > 0 {
			parts[i] = strings.TrimSuffix(parts[i], ")") + fmt.Sprintf(", block %v)", r.Block)
		}
	}
	s := strings.Join(parts, " AND ")
	if len(b.rules) > 1 {
		s = fmt.Sprintf("%s = %s, with AllowAll", b.name, s)
	}
	if b.tier != "" {
		s += ", tier " + b.tier
	}
	return s
}

// settle waits until no connection of st is in use, or ctx ends. A call cut
// short at the end of a run returns while the batch or pipeline it joined
// goes on (it is sent on for the calls that still wait): one that landed
// after cleanUp would leave a counter behind.
func settle(ctx context.Context, st *Store) {
	busy := func() bool {
		if st.Pool != nil {
			return st.Pool.Stat().AcquiredConns() > 0
		}
		s := st.Redis.PoolStats()
		return s.TotalConns > s.IdleConns
	}
	for busy() && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

// cleanUp deletes the counters of rules for ids: with one statement on
// PostgreSQL, with Reset on Redis (a Redis key with a lifetime or calendar
// window would stay for long). A memory store goes with the process.
func cleanUp(ctx context.Context, st *Store, l *countlimit.Limiter, rules []countlimit.Rule, ids []string) error {
	if len(rules) == 0 || st.Pool == nil && st.Redis == nil {
		return nil
	}
	// Clean up even when ctx was cancelled (Ctrl-C).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	settle(ctx, st)
	if st.Pool != nil {
		uts := make([]string, len(rules))
		for i, r := range rules {
			uts[i] = string(r.UseType)
		}
		// Unprepared: a transaction pooler between here and the database
		// keeps no prepared statement for the next command.
		_, err := st.Pool.Exec(ctx, "DELETE FROM count_limit WHERE use_type = ANY($1)", pgx.QueryExecModeExec, uts)
		return err
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	const workers = 16
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(ids); i += workers {
				for _, r := range rules {
					if err := l.Reset(ctx, r, ids[i]); err != nil {
						mu.Lock()
						first = cmp.Or(first, err)
						mu.Unlock()
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// benchIDs returns the n ids a bench spreads its calls over.
func benchIDs(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%d", i)
	}
	return names
}

// measurement is what measure saw: every call's latency and its outcome.
type measurement struct {
	lat             []time.Duration // sorted
	done            []time.Duration // when each call ended, since the start of the measured time
	allowed, denied int
	errs            int
	firstErr        error
	elapsed         time.Duration
	// cut counts the calls that failed because their run ended under them,
	// which no rate counts; longestCut is how long the longest had run.
	cut        int
	longestCut time.Duration
}

func (m *measurement) calls() int    { return len(m.lat) }
func (m *measurement) rate() float64 { return float64(len(m.lat)) / m.elapsed.Seconds() }

// add merges o, measured after m, into m.
func (m *measurement) add(o *measurement) {
	m.merge(o, m.elapsed)
	slices.Sort(m.lat)
	m.elapsed += o.elapsed
}

// fifths returns the calls per second of the first and the last fifth of
// the measured time.
func (m *measurement) fifths() (first, last float64) {
	fifth := m.elapsed / 5
	if fifth <= 0 {
		return 0, 0
	}
	var a, b int
	for _, d := range m.done {
		switch {
		case d < fifth:
			a++
		case d >= m.elapsed-fifth:
			b++
		}
	}
	return float64(a) / fifth.Seconds(), float64(b) / fifth.Seconds()
}

// pct returns the p-th latency quantile (0 < p <= 1).
func (m *measurement) pct(p float64) time.Duration {
	if len(m.lat) == 0 {
		return 0
	}
	return m.lat[min(len(m.lat)-1, int(p*float64(len(m.lat))))]
}

// inTurn picks the ids of a run in turn, the i-th call taking the i-th.
func inTurn(ids []string) func(w, i int) string {
	return func(_, i int) string { return ids[i%len(ids)] }
}

// firstCall is how long past the end of a run a caller's first call may
// take.
const firstCall = 30 * time.Second

// measure runs call from workers goroutines for d, and until each has
// finished its first call, worker w's i-th call on the id pick(w, i) (i
// counts every worker's calls, w's being w, w+workers, ...), and records
// what happened. Calls cut short by the end of the run are not counted.
func measure(ctx context.Context, workers int, d time.Duration, pick func(w, i int) string, call func(context.Context, string) (bool, error)) *measurement {
	tallies := make([]measurement, workers)
	start := time.Now()
	end := start.Add(d)
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	// A store may derive its own deadline from the run's and fail on it a
	// moment before runCtx's timer fires: the clock says when the run is over.
	over := func() bool { return runCtx.Err() != nil || !time.Now().Before(end) }
	// A caller's first call is never cut short by the end of the run (a
	// cell shorter than a new connection's first statement, on a loaded
	// machine, would otherwise finish none): it may take until firstCall
	// past the end, and the run lasts until every caller has finished one.
	firstCtx, cancelFirst := context.WithDeadline(ctx, end.Add(firstCall))
	defer cancelFirst()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := &tallies[w]
			for i := w; i == w || !over(); i += workers {
				id := pick(w, i)
				callCtx, cut := runCtx, over
				if i == w {
					callCtx, cut = firstCtx, func() bool { return firstCtx.Err() != nil }
				}
				t0 := time.Now()
				allowed, err := call(callCtx, id)
				t1 := time.Now()
				lat := t1.Sub(t0)
				switch {
				case err != nil && cut():
					// Cut short by the end of the run: not counted, but a
					// run that ends with nothing else finished says so.
					t.cut++
					t.longestCut = max(t.longestCut, lat)
					continue
				case err != nil:
					t.errs++
					if t.firstErr == nil {
						t.firstErr = err
					}
				case allowed:
					t.allowed++
				default:
					t.denied++
				}
				t.lat = append(t.lat, lat)
				t.done = append(t.done, t1.Sub(start))
			}
		}()
	}
	wg.Wait()
	m := &measurement{elapsed: time.Since(start)}
	for i := range tallies {
		m.merge(&tallies[i], 0)
	}
	slices.Sort(m.lat)
	return m
}

// merge takes o's calls and tallies into m, o's end times moved on by at
// (m's lat is left to sort).
func (m *measurement) merge(o *measurement, at time.Duration) {
	m.lat = append(m.lat, o.lat...)
	for _, d := range o.done {
		m.done = append(m.done, at+d)
	}
	m.allowed += o.allowed
	m.denied += o.denied
	m.errs += o.errs
	if m.firstErr == nil {
		m.firstErr = o.firstErr
	}
	m.cut += o.cut
	m.longestCut = max(m.longestCut, o.longestCut)
}

// stalled warns on w when m finished no call at all but had calls cut
// short by the end of its time: a store that stalled for the whole run,
// whose rate of 0 would otherwise read like a result.
func (m *measurement) stalled(w io.Writer, what string, callers int) {
	if m.calls() > 0 || m.cut == 0 {
		return
	}
	fmt.Fprintf(w, "countlimit: bench: %s finished no call at %d callers in %v: %s cut short when the time ran out, the longest after %v; the store stalled, and the rate of 0 (and a ratio of 0) measures the stall\n",
		what, callers, m.elapsed.Round(time.Millisecond), clikit.Plural(m.cut, "call was", "calls were"), m.longestCut.Round(time.Millisecond))
}
