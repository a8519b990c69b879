package modeltest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

// fuzzUseTypes are the use types a fuzzed run writes: AllowAll takes up to
// all of them at once. A use type's sliding rule always has the same span
// (fuzzSpan), so that a log read back is cut where the model cuts it.
const fuzzUseTypes = 12

func fuzzUT(j int) string { return fmt.Sprintf("f%d", j) }

func fuzzSpan(j int) time.Duration { return time.Duration(2+j) * time.Second }

// fuzzRule decodes rule j (of use type fuzzUT(j)) from three bytes: its
// kind, its limit (0 to 7; and a smooth rule's burst, 1 to 4) and its
// penalty (none most of the time). A run without smooth rules takes
// sliding ones for them.
func fuzzRule(j int, kind, limit, block byte, loc *time.Location, smooth bool) countlimit.Rule {
	r := countlimit.Rule{UseType: countlimit.UseType(fuzzUT(j)), Limit: int64(limit % 8)}
	switch kind % 8 {
	case 0:
		r.Window = countlimit.Fixed(time.Duration(1+kind/8%8) * time.Second)
	case 1:
		r.Window = countlimit.Rolling(time.Duration(1+kind/8%8) * time.Second)
	case 3:
		if smooth {
			r.Window = countlimit.Smooth(time.Duration(1+kind/8%8)*time.Second, int64(1+limit/8%4))
			break
		}
		r.Window = countlimit.Sliding(fuzzSpan(j))
	case 2:
		r.Window = countlimit.Sliding(fuzzSpan(j))
	case 4:
		r.Window = countlimit.Calendar(countlimit.Day, loc)
	case 5:
		r.Window = countlimit.Calendar(countlimit.Week, loc)
	case 6:
		r.Window = countlimit.Calendar(countlimit.Month, loc)
	default:
		r.Window = countlimit.Lifetime()
	}
	if block%4 == 0 {
		r.Block = time.Duration(1+block/4%8) * time.Second
	}
	return r
}

// fuzzSteps decodes data into steps: AllowAll over any number of rules
// (up to fuzzUseTypes, each of any kind, limit and penalty), weighted
// AllowN, Peek, Refund and Reset of one rule, for two ids, on a clock that
// starts a minute before Amman's second midnight of 2021-10-29 and moves
// as data says; with smooth rules or without. Every input is a valid run;
// bytes past the end read as 0.
func fuzzSteps(data []byte, smooth bool) []Step {
	at := 0
	next := func() byte {
		if at >= len(data) {
			return 0
		}
		at++
		return data[at-1]
	}
	loc, _ := time.LoadLocation("Asia/Amman")
	now := time.Date(2021, 10, 28, 20, 59, 0, 0, time.UTC)
	rec := newRecorder(1)
	var steps []Step
	for at < len(data) && len(steps) < 64 {
		op := next()
		now = now.Add(time.Duration(next()) * 100 * time.Millisecond)
		id := []string{"a", "b{c}"}[op/8%2]
		clock := now
		l := countlimit.New(rec, countlimit.WithClock(func() time.Time { return clock }))
		ctx := context.Background()
		rec.reqs = nil
		var desc string
		switch op % 8 {
		case 0, 1, 2, 3:
			k := 1 + int(next())%fuzzUseTypes
			first := int(next())
			var rules []countlimit.Rule
			var parts []string
			for i := range k {
				j := (first + i) % fuzzUseTypes
				r := fuzzRule(j, next(), next(), next(), loc, smooth)
				rules = append(rules, r)
				parts = append(parts, fmt.Sprintf("%s %v limit %d block %v", r.UseType, r.Window, r.Limit, r.Block))
			}
			desc = fmt.Sprintf("AllowAll(%s, %s)", id, strings.Join(parts, ", "))
			l.AllowAll(ctx, id, rules...)
		default:
			j := int(next()) % fuzzUseTypes
			r := fuzzRule(j, next(), next(), next(), loc, smooth)
			n := int64(1 + next()%4)
			switch op % 8 {
			case 4, 5:
				desc = fmt.Sprintf("AllowN(%s %v limit %d, %s, %d)", r.UseType, r.Window, r.Limit, id, n)
				l.AllowN(ctx, r, id, n)
			case 6:
				if n%2 == 0 {
					desc = fmt.Sprintf("Peek(%s %v, %s)", r.UseType, r.Window, id)
					l.Peek(ctx, r, id)
				} else {
					desc = fmt.Sprintf("Refund(%s %v, %s, %d)", r.UseType, r.Window, id, n)
					l.Refund(ctx, r, id, n)
				}
			default:
				desc = fmt.Sprintf("Reset(%s, %s)", r.UseType, id)
				l.Reset(ctx, r, id)
			}
		}
		if len(rec.reqs) > 0 {
			steps = append(steps, Step{Desc: now.UTC().Format("2006-01-02 15:04:05.000000 ") + desc, Reqs: rec.reqs})
		}
	}
	return steps
}

// Fuzz runs the steps data decodes to (AllowAll over any number of rules,
// above all) on p and on the model, and fails t at the first step whose
// Results or stored states differ. A store's fuzz target calls it with the
// fuzzer's bytes.
func Fuzz(t *testing.T, p Path, data []byte) {
	t.Helper()
	steps := fuzzSteps(data, true)
	ks := keyspace{ids: []string{"a", "b{c}"}, spans: map[string]int64{}}
	for j := range fuzzUseTypes {
		ks.uts = append(ks.uts, fuzzUT(j))
		ks.spans[fuzzUT(j)] = fuzzSpan(j).Microseconds()
	}
	at, why := replay(context.Background(), p, steps, ks, fmt.Sprintf("z%d.", runs.Add(1)))
	if at < 0 {
		return
	}
	var b strings.Builder
	for i, st := range steps[:at+1] {
		fmt.Fprintf(&b, "\n  %d. %s", i+1, st.Desc)
	}
	t.Fatalf("step %d of %d: %s\nthe steps:%s", at+1, len(steps), why, b.String())
}
