package modeltest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// stepText is all of a step a replay depends on: its description and
// every field of its requests.
func stepText(st Step) string {
	var b strings.Builder
	b.WriteString(st.Desc)
	for _, r := range st.Reqs {
		fmt.Fprintf(&b, "\n  %v %q at %d n %d lease %q", r.Op, r.ID, r.Now.UnixMicro(), r.N, r.Lease)
		for _, c := range r.Checks {
			fmt.Fprintf(&b, "\n    %q limit %d [%d, %d) span %v ttl %v interval %v burst %d block %v %s",
				c.UseType, c.Limit, c.Begin.UnixMicro(), c.End.UnixMicro(), c.Span, c.TTL, c.Interval, c.Burst, c.Block, c.Kind)
		}
	}
	return b.String()
}

// TestGenIsDeterministic generates each seed's steps several times: a
// seed replays only if they are the same every time (equal instants of
// several keys, which a map gives in any order, and lease tokens among
// them).
func TestGenIsDeterministic(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 6; seed++ {
		smooth := seed%2 == 0
		want := gen(seed, 400, smooth)
		for try := range 3 {
			got := gen(seed, 400, smooth)
			for i := range want {
				if g, w := stepText(got[i]), stepText(want[i]); g != w {
					t.Fatalf("seed %d, generation %d: step %d is\n%s\nthe first generation's\n%s", seed, try+2, i+1, g, w)
				}
			}
		}
	}
}

// TestSmoothIsDrawn holds a run with smooth rules to drawing every
// operation on them, alone and inside AllowAll beside other kinds, and to
// the model allowing, denying (for the rate and for the penalty) and
// changing a key's kind to and from smooth; a run without draws none.
func TestSmoothIsDrawn(t *testing.T) {
	t.Parallel()
	seen := map[string]int{}
	for seed := uint64(1); seed <= 4; seed++ {
		w := world{}
		for _, st := range gen(seed, 600, true) {
			reqs := clones(st.Reqs)
			before := map[string]model.Key{}
			for _, r := range reqs {
				for _, c := range r.Checks {
					before[c.UseType+r.ID] = keystate.Clone(*w.key(c.UseType, r.ID))
				}
			}
			w.apply(reqs)
			for _, r := range reqs {
				for _, c := range r.Checks {
					if c.Interval == 0 {
						b := before[c.UseType+r.ID]
						switch {
						case b.TAT <= r.Now.UnixMicro():
						case r.Op == driver.OpReset: // it takes no rule
							seen["reset"]++
						case r.Op == driver.OpAllow && c.State.Allowed && c.Span > 0:
							seen["smooth to sliding"]++
						case r.Op == driver.OpAllow && c.State.Allowed:
							seen["smooth to a window"]++
						}
						continue
					}
					if len(r.Checks) > 1 {
						seen["in AllowAll"]++
					}
					b := before[c.UseType+r.ID]
					switch {
					case r.Op == driver.OpAllow && c.State.Allowed:
						seen["allowed"]++
						if len(b.Log) > 0 {
							seen["sliding to smooth"]++
						} else if b.Begin < b.End {
							seen["a window to smooth"]++
						}
						if r.N > 1 {
							seen["weighted"]++
						}
					case r.Op == driver.OpAllow && c.Limit == 0:
						seen["denied, limit 0"]++
					case r.Op == driver.OpAllow && !c.State.FreeAt.IsZero():
						seen["denied by the rate"]++
					case r.Op == driver.OpAllow && !c.State.BlockedUntil.IsZero():
						seen["denied by the penalty"]++
					case r.Op != driver.OpAllow:
						seen[r.Op.String()]++
					}
				}
			}
		}
	}
	for _, what := range []string{"allowed", "weighted", "denied by the rate", "denied by the penalty", "in AllowAll", "peek", "refund", "reset", "denied, limit 0",
		"smooth to a window", "a window to smooth", "smooth to sliding", "sliding to smooth"} {
		if seen[what] == 0 {
			t.Errorf("no smooth check %s in 4 runs of 600 steps (seen: %v)", what, seen)
		}
	}
	for _, st := range gen(1, 600, false) {
		for _, r := range st.Reqs {
			if r.Smooth() {
				t.Fatalf("a run without smooth rules drew %s", st.Desc)
			}
		}
	}
}
