package modeltest

import (
	"testing"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// TestTargetedReachesItsCases holds the targeted steps of a run, for
// several seeds, to the cases they are there for, as the model decides
// them: a smooth check denied beside a lifetime count (no instant it is
// free at), a lease op on a key that holds a smooth instant, an Acquire
// denied on such a key with its slots full, and an Acquire denied in its
// penalty box with no lease held; and every run to end with them, on use
// types of their own in the run's keyspace.
func TestTargetedReachesItsCases(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 8; seed++ {
		_, n, steps, ks := plan(seed, 50)
		if len(steps) <= n {
			t.Fatalf("seed %d: %d steps for %d: no targeted step", seed, len(steps), n)
		}
		for _, ut := range targetedUseTypes {
			found := false
			for _, k := range ks.uts {
				found = found || k == ut
			}
			if !found {
				t.Fatalf("seed %d: use type %s is not in the keyspace %v", seed, ut, ks.uts)
			}
		}
		seen := map[string]int{}
		w := world{}
		for i, st := range steps {
			reqs := clones(st.Reqs)
			before := w.applyFrom(reqs, true)
			if i < n {
				continue
			}
			if i > 0 && st.Reqs[0].Now.Before(steps[i-1].Reqs[0].Now) {
				t.Fatalf("seed %d: targeted step %d (%s) goes back in time", seed, i+1, st.Desc)
			}
			for j, r := range reqs {
				for c := range r.Checks {
					ch, k, now := &r.Checks[c], before[j][c], r.Now.UnixMicro()
					live := len(keystate.Live(k, 0, now).Leases)
					switch {
					case ch.Smooth() && r.Op != driver.OpReset && !ch.State.Allowed && k.TAT == 0 && k.End == model.Forever && k.Count > 0 && ch.State.FreeAt.IsZero() && ch.State.BlockedUntil.IsZero():
						seen["a smooth check denied beside a lifetime count"]++
					case r.OnLeases() && k.TAT > now && r.Op == driver.OpAcquire && !ch.State.Allowed && k.Blocked <= now:
						seen["an acquire denied, its slots full, on a smooth instant"]++
					case r.OnLeases() && k.TAT > now:
						seen["a lease op on a smooth instant"]++
					}
					if r.Op == driver.OpAcquire && !ch.State.Allowed && k.Blocked > now && live == 0 {
						seen["an acquire denied in its penalty box, no lease held"]++
					}
				}
			}
		}
		for _, what := range []string{
			"a smooth check denied beside a lifetime count",
			"a lease op on a smooth instant",
			"an acquire denied, its slots full, on a smooth instant",
			"an acquire denied in its penalty box, no lease held",
		} {
			if seen[what] == 0 {
				t.Errorf("seed %d: the targeted steps reach no %s (seen: %v)", seed, what, seen)
			}
		}
	}
}
