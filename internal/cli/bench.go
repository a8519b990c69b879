package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

// bench runs concurrent Allow calls against a store for a while and reports
// throughput and latency: the numbers the README records come from here and
// from the testing.B benchmarks. With --baseline it compares Allow with the
// hand-written SQL a user would otherwise write.
func bench(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("bench")
	storeURL := storeFlag(fs)
	rulesPath := fs.String("rules", "", "YAML rule file for --rule (default: the built-in rules)")
	ruleName := fs.String("rule", "", "check this rule (default: a fixed 1m window no call fills)")
	tier := fs.String("tier", "", "the tier of --rule")
	duration := fs.Duration("duration", 10*time.Second, "how long to run")
	workers := fs.Int("concurrency", 16, "concurrent callers")
	ids := fs.Int("ids", 1000, "distinct ids the calls spread over")
	baseline := fs.Bool("baseline", false, "PostgreSQL: compare Allow with a hand-written upsert, side by side")
	callers := fs.String("callers", "1,4,16,64", "with --baseline: the numbers of concurrent callers to compare at")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *baseline {
		cs, err := parseCallers(*callers)
		if err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return usageErrorf("bench: unexpected argument %q", fs.Arg(0))
		}
		if !isSet(fs, "ids") {
			*ids = 10000
		}
		if !isSet(fs, "duration") {
			*duration = 5 * time.Second
		}
		return benchBaseline(ctx, *storeURL, cs, *duration, *ids, stdout)
	}
	switch {
	case fs.NArg() > 0:
		return usageErrorf("bench: unexpected argument %q", fs.Arg(0))
	case *duration <= 0:
		return usageErrorf("bench: --duration must be positive, got %v", *duration)
	case *workers < 1 || *workers > 10000:
		return usageErrorf("bench: --concurrency must be 1 to 10000, got %d", *workers)
	case *ids < 1:
		return usageErrorf("bench: --ids must be at least 1, got %d", *ids)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	// A use type of its own, so a run never touches real counters.
	rule := countlimit.Rule{UseType: countlimit.UseType("bench." + hex.EncodeToString(b[:])), Limit: 1 << 50, Window: countlimit.Fixed(time.Minute)}
	if *ruleName != "" {
		rf, err := loadRules(*rulesPath)
		if err != nil {
			return err
		}
		rs, err := rf.Resolve(*ruleName, *tier)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if len(rs) != 1 {
			return usageErrorf("bench: --rule %s is a group; name one rule", *ruleName)
		}
		rule = rs[0]
		rule.UseType += countlimit.UseType("." + hex.EncodeToString(b[:]))
	}
	st, err := openStore(ctx, *storeURL, false, nil)
	if err != nil {
		return err
	}
	defer st.close()
	l := countlimit.New(st.store)
	names := make([]string, *ids)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%d", i)
	}
	m := measure(ctx, *workers, *duration, names, func(ctx context.Context, id string) (bool, error) {
		res, err := l.Allow(ctx, rule, id)
		return res.Allowed, err
	})
	fmt.Fprintf(stdout, "countlimit bench: store %s, rule %s (%v, limit %d), %d callers over %d ids for %v\n",
		st.desc, rule.UseType, rule.Window, rule.Limit, *workers, *ids, m.elapsed.Round(time.Millisecond))
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "calls\t%d\t(%d allowed, %d denied, %d errors)\n", m.calls(), m.allowed, m.denied, m.errs)
	fmt.Fprintf(tw, "throughput\t%.0f calls/s\t\n", m.rate())
	fmt.Fprintf(tw, "latency\tp50 %v\tp90 %v  p99 %v  max %v\n", m.pct(.5), m.pct(.9), m.pct(.99), m.pct(1))
	tw.Flush()
	if m.errs > 0 {
		return fmt.Errorf("bench: %d calls failed, the first: %w", m.errs, m.firstErr)
	}
	return nil
}

// measurement is what measure saw: every call's latency and its outcome.
type measurement struct {
	lat             []time.Duration // sorted
	allowed, denied int
	errs            int
	firstErr        error
	elapsed         time.Duration
}

func (m *measurement) calls() int    { return len(m.lat) }
func (m *measurement) rate() float64 { return float64(len(m.lat)) / m.elapsed.Seconds() }

// add merges o, measured after m, into m.
func (m *measurement) add(o *measurement) {
	m.lat = append(m.lat, o.lat...)
	slices.Sort(m.lat)
	m.allowed += o.allowed
	m.denied += o.denied
	m.errs += o.errs
	if m.firstErr == nil {
		m.firstErr = o.firstErr
	}
	m.elapsed += o.elapsed
}

// pct returns the p-th latency quantile (0 < p <= 1).
func (m *measurement) pct(p float64) time.Duration {
	if len(m.lat) == 0 {
		return 0
	}
	return m.lat[min(len(m.lat)-1, int(p*float64(len(m.lat))))]
}

// measure runs call from workers goroutines for d, spreading the calls over
// ids in turn, and records what happened. Calls cut short by the end of the
// run are not counted.
func measure(ctx context.Context, workers int, d time.Duration, ids []string, call func(context.Context, string) (bool, error)) *measurement {
	tallies := make([]measurement, workers)
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := &tallies[w]
			for i := w; runCtx.Err() == nil; i += workers {
				t0 := time.Now()
				allowed, err := call(runCtx, ids[i%len(ids)])
				lat := time.Since(t0)
				switch {
				case err != nil && runCtx.Err() != nil:
					continue // cut short by the end of the run
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
			}
		}()
	}
	wg.Wait()
	m := &measurement{elapsed: time.Since(start)}
	for _, t := range tallies {
		m.lat = append(m.lat, t.lat...)
		m.allowed += t.allowed
		m.denied += t.denied
		m.errs += t.errs
		if m.firstErr == nil {
			m.firstErr = t.firstErr
		}
	}
	slices.Sort(m.lat)
	return m
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
