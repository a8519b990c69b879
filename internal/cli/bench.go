package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
// from the testing.B benchmarks.
func bench(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlagSet("bench")
	storeURL := storeFlag(fs)
	rulesPath := fs.String("rules", "", "YAML rule file for --rule (default: the built-in rules)")
	ruleName := fs.String("rule", "", "check this rule (default: a fixed 1m window no call fills)")
	tier := fs.String("tier", "", "the tier of --rule")
	duration := fs.Duration("duration", 10*time.Second, "how long to run")
	workers := fs.Int("concurrency", 16, "concurrent callers")
	ids := fs.Int("ids", 1000, "distinct ids the calls spread over")
	if err := parse(fs, args); err != nil {
		return err
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

	type tally struct {
		lat             []time.Duration
		allowed, denied int
		errs            int
		firstErr        error
	}
	tallies := make([]tally, *workers)
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := &tallies[w]
			for i := w; runCtx.Err() == nil; i += *workers {
				t0 := time.Now()
				res, err := l.Allow(runCtx, rule, names[i%len(names)])
				t.lat = append(t.lat, time.Since(t0))
				switch {
				case err != nil && runCtx.Err() != nil:
					t.lat = t.lat[:len(t.lat)-1] // cut short by the end of the run
				case err != nil:
					t.errs++
					if t.firstErr == nil {
						t.firstErr = err
					}
				case res.Allowed:
					t.allowed++
				default:
					t.denied++
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	var all []time.Duration
	var total tally
	for _, t := range tallies {
		all = append(all, t.lat...)
		total.allowed += t.allowed
		total.denied += t.denied
		total.errs += t.errs
		if total.firstErr == nil {
			total.firstErr = t.firstErr
		}
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration {
		if len(all) == 0 {
			return 0
		}
		return all[min(len(all)-1, int(p*float64(len(all))))]
	}
	fmt.Fprintf(stdout, "countlimit bench: store %s, rule %s (%v, limit %d), %d callers over %d ids for %v\n",
		st.desc, rule.UseType, rule.Window, rule.Limit, *workers, *ids, elapsed.Round(time.Millisecond))
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "calls\t%d\t(%d allowed, %d denied, %d errors)\n", len(all), total.allowed, total.denied, total.errs)
	fmt.Fprintf(tw, "throughput\t%.0f calls/s\t\n", float64(len(all))/elapsed.Seconds())
	fmt.Fprintf(tw, "latency\tp50 %v\tp90 %v  p99 %v  max %v\n", pct(.5), pct(.9), pct(.99), pct(1))
	tw.Flush()
	if total.errs > 0 {
		return fmt.Errorf("bench: %d calls failed, the first: %w", total.errs, total.firstErr)
	}
	return nil
}
