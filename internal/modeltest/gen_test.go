package modeltest

import (
	"fmt"
	"strings"
	"testing"
)

// stepText is all of a step a replay depends on: its description and
// every field of its requests.
func stepText(st Step) string {
	var b strings.Builder
	b.WriteString(st.Desc)
	for _, r := range st.Reqs {
		fmt.Fprintf(&b, "\n  %v %q at %d n %d lease %q", r.Op, r.ID, r.Now.UnixMicro(), r.N, r.Lease)
		for _, c := range r.Checks {
			fmt.Fprintf(&b, "\n    %q limit %d [%d, %d) span %v ttl %v block %v %s",
				c.UseType, c.Limit, c.Begin.UnixMicro(), c.End.UnixMicro(), c.Span, c.TTL, c.Block, c.Kind)
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
		want := gen(seed, 400)
		for try := range 3 {
			got := gen(seed, 400)
			for i := range want {
				if g, w := stepText(got[i]), stepText(want[i]); g != w {
					t.Fatalf("seed %d, generation %d: step %d is\n%s\nthe first generation's\n%s", seed, try+2, i+1, g, w)
				}
			}
		}
	}
}
