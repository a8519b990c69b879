package promlimit_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/countlimit/countlimit/countlimit/promlimit"
)

// ruleNames returns n distinct rule labels, made before they are counted.
func ruleNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprint(prefix, i)
	}
	return names
}

// allocated returns the bytes the heap gave out while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestANewRuleCostsTheSameAfterMany: the work of counting a new rule does
// not grow with how many rules were counted before, measured in the bytes
// it allocates (work, not time: a copy of every rule seen, as each new one
// made before, shows as bytes in proportion): 1 000 new rules, each
// decided twice, after 20 000 take no more than twice what the first
// 1 000 took. Not parallel, so that no other test's allocations are
// counted.
func TestANewRuleCostsTheSameAfterMany(t *testing.T) {
	const batch, before = 1000, 20000
	m := promlimit.New()
	first, earlier, later := ruleNames("first-", batch), ruleNames("earlier-", before), ruleNames("later-", batch)
	decide := func(names []string) func() {
		return func() {
			for _, rule := range names {
				m.Decided(rule, true)
				m.Decided(rule, false)
			}
		}
	}
	atFirst := allocated(decide(first))
	decide(earlier)()
	atLater := allocated(decide(later))
	t.Logf("%d new rules: %d bytes allocated first, %d after %d more", batch, atFirst, atLater, before)
	if atLater > 2*atFirst {
		t.Errorf("%d new rules allocated %d bytes after %d rules, %.1f times the %d of the first %d: the cost of a new rule grows with the rules seen",
			batch, atLater, before+batch, float64(atLater)/float64(atFirst), atFirst, batch)
	}
}

// TestNewRulesAreReadWithoutLockSoon: a rule is read without the lock once
// as many decisions as there are rules have missed the copy read first,
// however they came (new rules, or rules not yet copied).
func TestNewRulesAreReadWithoutLockSoon(t *testing.T) {
	t.Parallel()
	m := promlimit.New()
	names := ruleNames("rule-", 1000)
	for _, rule := range names {
		m.Decided(rule, true)
	}
	if got := promlimit.ReadWithoutLock(m); got == len(names) {
		t.Fatalf("all %d new rules were read without the lock at once: the copy was made at each new rule", got)
	}
	for range len(names) {
		m.Decided(names[len(names)-1], true)
	}
	if got := promlimit.ReadWithoutLock(m); got != len(names) {
		t.Errorf("after %d decisions of a rule, %d of %d rules are read without the lock, want all", len(names), got, len(names))
	}
}

// TestDecidedOfASeenRuleAllocatesNothing: counting a decision of a rule
// already seen allocates nothing, as the Observer promises.
func TestDecidedOfASeenRuleAllocatesNothing(t *testing.T) {
	m := promlimit.New(promlimit.MaxRuleLabels(1))
	m.Decided("seen", true)
	m.Decided("over the bound", true)
	rule, over := string([]byte("seen")), string([]byte("over the bound")) // strings of their own, as decoded from a request
	if allocs := testing.AllocsPerRun(1000, func() {
		m.Decided(rule, true)
		m.Decided(over, false)
	}); allocs != 0 {
		t.Errorf("Decided of a seen rule and of one over the bound: %v allocations, want 0", allocs)
	}
}

// TestMaxRuleLabels: past MaxRuleLabels' bound, a new rule's decisions are
// counted under promlimit.OtherRule; rules that have their series keep
// them.
func TestMaxRuleLabels(t *testing.T) {
	t.Parallel()
	m := promlimit.New(promlimit.MaxRuleLabels(2))
	for _, d := range []struct {
		rule    string
		allowed bool
	}{
		{"a", true}, {"b", false}, {"c", true}, {"d", false}, {"a", true}, {"d", true}, {"b", true},
	} {
		m.Decided(d.rule, d.allowed)
	}
	got := gather(t, m)
	want := map[string]float64{
		"countlimit_decisions_total{rule=a,verdict=allowed}":     2,
		"countlimit_decisions_total{rule=a,verdict=denied}":      0,
		"countlimit_decisions_total{rule=b,verdict=allowed}":     1,
		"countlimit_decisions_total{rule=b,verdict=denied}":      1,
		"countlimit_decisions_total{rule=other,verdict=allowed}": 2,
		"countlimit_decisions_total{rule=other,verdict=denied}":  1,
	}
	checkSeries(t, "7 decisions of 4 rules, at most 2 labels", got, want)
	for name := range got {
		if _, ok := want[name]; !ok && strings.HasPrefix(name, "countlimit_decisions_total") {
			t.Errorf("series %s: want only those of a, b and %s", name, promlimit.OtherRule)
		}
	}
}

// TestMaxRuleLabelsConcurrent: goroutines deciding rules of their own,
// all new at once, make exactly the bound's worth of series besides
// OtherRule's, and every decision is counted once, under -race.
func TestMaxRuleLabelsConcurrent(t *testing.T) {
	t.Parallel()
	const goroutines, rules, bound = 16, 50, 100
	m := promlimit.New(promlimit.MaxRuleLabels(bound))
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for _, rule := range ruleNames(fmt.Sprint("g", g, "-"), rules) {
				m.Decided(rule, true)
				m.Decided(rule, false)
			}
		})
	}
	wg.Wait()
	series, allowed, denied := 0, 0.0, 0.0
	for name, v := range gather(t, m) {
		labels, ok := strings.CutPrefix(name, "countlimit_decisions_total{rule=")
		if !ok {
			continue
		}
		rule, verdict, _ := strings.Cut(labels, ",verdict=")
		if rule != promlimit.OtherRule && verdict == "allowed}" {
			series++
		}
		if verdict == "allowed}" {
			allowed += v
		} else {
			denied += v
		}
	}
	if series != bound || allowed != goroutines*rules || denied != goroutines*rules {
		t.Errorf("%d rules' series, %v allowed and %v denied counted; want %d, %d, %d", series, allowed, denied, bound, goroutines*rules, goroutines*rules)
	}
}

// BenchmarkNewRules is counting decisions of 1 000, 10 000 and 100 000 rules
// none seen before, in a fresh Metrics each op: ns/rule must not grow
// with their number. docs/benchmarks.md has the figures.
func BenchmarkNewRules(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprint("rules=", n), func(b *testing.B) {
			names := ruleNames("rule-", n)
			b.ReportAllocs()
			for b.Loop() {
				m := promlimit.New()
				for _, rule := range names {
					m.Decided(rule, true)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/rule")
		})
	}
}

// BenchmarkDecidedSeenRule is Decided of a rule already counted, among 100
// others, as every decision after a rule's first is: the read path a new
// rule's cost must not slow.
func BenchmarkDecidedSeenRule(b *testing.B) {
	m := promlimit.New()
	names := ruleNames("rule-", 100)
	for _, rule := range names {
		m.Decided(rule, true)
	}
	rule := string([]byte("rule-42")) // a string of its own, as decoded from a request
	b.ReportAllocs()
	for b.Loop() {
		m.Decided(rule, true)
	}
}
