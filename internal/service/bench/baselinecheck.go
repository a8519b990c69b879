package bench

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/expose"
	"github.com/countlimit/countlimit/internal/service/clikit"
)

// baselineCheck is a kind of check bench --baseline sets beside the
// hand-written upsert (--check): its rules, which no call fills, and the
// call it makes.
type baselineCheck struct {
	name  string // as --check names it
	call  string // countlimit's side in --json and --csv: allow, allow_all or acquire_release
	label string // countlimit's side in the table's head: Allow/s, AllowAll/s, pairs/s
	what  string // what one call does, for the table's title
	rules []countlimit.Rule
}

// The kinds of check --check names, in the order --check all runs them.
var baselineChecks = []baselineCheck{
	{name: "fixed", call: "allow", label: "Allow", what: "Allow of a fixed 1m window",
		rules: []countlimit.Rule{{UseType: "bench", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Minute)}}},
	// One event a microsecond, the finest rate a smooth rule takes, and a
	// burst of a minute's worth: no call fills it.
	{name: "smooth", call: "allow", label: "Allow", what: "Allow of a smooth rate, Smooth(1m, 60000000) of 60 000 000",
		rules: []countlimit.Rule{{UseType: "bench", Limit: 60_000_000, Window: countlimit.Smooth(time.Minute, 60_000_000)}}},
	// A log of each id's events of the last second, up to the most a
	// sliding rule takes.
	{name: "sliding", call: "allow", label: "Allow", what: "Allow of a sliding 1s window of 10 000 (a log of each id's events)",
		rules: []countlimit.Rule{{UseType: "bench", Limit: 10_000, Window: countlimit.Sliding(time.Second)}}},
	{name: "allowall", call: "allow_all", label: "AllowAll", what: "AllowAll of a fixed 1m window and a calendar day (UTC), all or nothing",
		rules: []countlimit.Rule{
			{UseType: "bench", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Minute)},
			{UseType: "bench.day", Limit: expose.MaxLimit, Window: countlimit.Calendar(countlimit.Day, time.UTC)},
		}},
	{name: "lease", call: "acquire_release", label: "pairs", what: "Acquire and Release of a Concurrent(1m) lease of 10 000 slots, two calls counted as one pair",
		rules: []countlimit.Rule{{UseType: "bench", Limit: 10_000, Window: countlimit.Concurrent(time.Minute)}}},
}

// parseChecks parses --check: a list of the kinds of baselineChecks, or all.
func parseChecks(s string) ([]baselineCheck, error) {
	var out []baselineCheck
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "all" {
			out = append(out, baselineChecks...)
			continue
		}
		i := slices.IndexFunc(baselineChecks, func(c baselineCheck) bool { return c.name == f })
		if i < 0 {
			return nil, clikit.UsageErrorf("bench --baseline: --check wants a list of fixed, smooth, sliding, allowall and lease, or all (e.g. fixed,smooth), got %q", s)
		}
		out = append(out, baselineChecks[i])
	}
	var once []baselineCheck
	for _, c := range out {
		if !slices.ContainsFunc(once, func(o baselineCheck) bool { return o.name == c.name }) {
			once = append(once, c)
		}
	}
	return once, nil
}

// on returns the check as one call on l: Allow, AllowAll, or an Acquire
// followed, when it took a slot, by the Release of its lease.
func (c baselineCheck) on(l *countlimit.Limiter) func(context.Context, string) (bool, error) {
	switch c.name {
	case "allowall":
		return func(ctx context.Context, id string) (bool, error) {
			res, err := l.AllowAll(ctx, id, c.rules...)
			return err == nil && res[0].Allowed, err
		}
	case "lease":
		return func(ctx context.Context, id string) (bool, error) {
			ls, res, err := l.Acquire(ctx, c.rules[0], id)
			if err != nil || !res.Allowed {
				return false, err
			}
			return true, ls.Release(ctx)
		}
	}
	return func(ctx context.Context, id string) (bool, error) {
		res, err := l.Allow(ctx, c.rules[0], id)
		return res.Allowed, err
	}
}
