package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/rulefile"
	"github.com/countlimit/countlimit/internal/ruleops"
)

func loadRules(path string) (*rulefile.File, error) {
	if path == "" {
		return rulefile.Default(), nil
	}
	return rulefile.Load(path)
}

// check runs allow, peek, refund or reset for one id and reports whether
// the answer was a denial.
func check(ctx context.Context, verb string, args []string, stdout io.Writer) (denied bool, err error) {
	o, _ := ruleops.ParseOp(verb)
	fs := newFlagSet(verb)
	storeURL := storeFlag(fs)
	rulesPath := fs.String("rules", "", "YAML rule file (default: the built-in rules)")
	cost := fs.Int64("cost", 1, "the event's weight (allow), or how many to give back (refund)")
	tier := fs.String("tier", "", "the tier whose limit applies")
	asJSON := fs.Bool("json", false, "print the result as the HTTP API's JSON")
	pos, err := parseMixed(fs, args)
	if err != nil {
		return false, err
	}
	if len(pos) != 2 {
		return false, usageErrorf("%s: want RULE ID, got %d arguments", verb, len(pos))
	}
	name, id := pos[0], pos[1]
	rf, err := loadRules(*rulesPath)
	if err != nil {
		return false, err
	}
	var ce *ruleops.CostError
	if err := ruleops.CheckCost(rf, o, name, *cost, isSet(fs, "cost")); errors.As(err, &ce) {
		return false, usageErrorf("%s: %s", verb, ce.Named("--cost"))
	}
	rules, err := ruleops.Resolve(rf, o, name, *tier)
	if err != nil {
		if errors.Is(err, rulefile.ErrUnknown) {
			return false, fmt.Errorf("%s: unknown rule %q; rules: %s", verb, name, strings.Join(rf.Names(), ", "))
		}
		return false, fmt.Errorf("%s: %w", verb, err)
	}
	st, err := openStore(ctx, *storeURL, false, nil)
	if err != nil {
		return false, err
	}
	defer st.close()
	results, err := ruleops.Do(ctx, countlimit.New(st.store), o, rules, id, *cost)
	if err != nil {
		return false, err
	}
	if o == countlimit.OpReset {
		if *asJSON {
			fmt.Fprintln(stdout, `{"reset": true}`)
		} else {
			fmt.Fprintf(stdout, "reset %s for %s\n", name, id)
		}
		return false, nil
	}
	resp := ruleops.NewResponse(rf.Members(name), rules, results)
	if *asJSON {
		b, _ := json.MarshalIndent(resp, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return !resp.Allowed, nil
	}
	verdict := "allowed"
	if !resp.Allowed {
		verdict = "denied"
	}
	fmt.Fprintf(stdout, "%s: %s for %s", verdict, name, id)
	switch {
	case resp.RetryAfterSeconds < 0:
		fmt.Fprint(stdout, " (no wait helps)")
	case !resp.Allowed:
		fmt.Fprintf(stdout, " (retry in %v)", time.Duration(resp.RetryAfterSeconds*float64(time.Second)).Round(time.Millisecond))
	}
	fmt.Fprintln(stdout)
	for _, r := range resp.Results {
		fmt.Fprintf(stdout, "  %s: %d of %d used, %d left", r.Rule, r.Used, r.Limit, r.Remaining)
		if r.ResetAt != nil {
			fmt.Fprintf(stdout, ", resets %s", r.ResetAt.Format(time.RFC3339))
		}
		if r.BlockedUntil != nil {
			fmt.Fprintf(stdout, ", blocked until %s", r.BlockedUntil.Format(time.RFC3339))
		}
		fmt.Fprintln(stdout)
	}
	return !resp.Allowed, nil
}
