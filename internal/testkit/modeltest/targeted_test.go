package modeltest

import (
	"slices"
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
// penalty box with no lease held, and a batch of several calls of one
// key of a window sent together at the instant its penalty ends, every
// call allowed in the current window (what PostgreSQL's group commit
// sends to countlimit_allow_batch_pooled's first statement), and a batch
// with a smooth allow denied on a key that holds nothing but its smooth
// instant (Redis keeps it as a string), beside a call on another id (a
// combined fast.lua script, which makes the string a hash); and every
// run to end with them, on use types of their own in the run's keyspace.
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
			if len(reqs) >= 2 && oneKeyAtPenaltyEnd(reqs, before) {
				seen["a batch of one key allowed at its penalty's end"]++
			}
			if smoothStringDeniedInBatch(reqs, before) {
				seen["a smooth allow denied on a bare instant, in a batch"]++
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
			"a batch of one key allowed at its penalty's end",
			"a smooth allow denied on a bare instant, in a batch",
		} {
			if seen[what] == 0 {
				t.Errorf("seed %d: the targeted steps reach no %s (seen: %v)", seed, what, seen)
			}
		}
	}
}

// oneKeyAtPenaltyEnd reports whether reqs, a batch, are allows of one
// rule of a window each, all on one key that existed before them, every
// one allowed in the current window at the instant the key's penalty
// ends, as the model decides them (before: each call's key just before
// it).
func oneKeyAtPenaltyEnd(reqs []*driver.Request, before [][]model.Key) bool {
	for j, r := range reqs {
		if r.Op != driver.OpAllow || len(r.Checks) != 1 || r.Checks[0].Span > 0 || r.Checks[0].Smooth() || r.Checks[0].TTL > 0 ||
			r.ID != reqs[0].ID || r.Checks[0].UseType != reqs[0].Checks[0].UseType || keystate.Empty(&before[j][0]) {
			return false
		}
		arms := Arms(before[j][0], r, &r.Checks[0])
		if !slices.Contains(arms, ArmAllowedIn) || !slices.Contains(arms, ArmBlockEndsNow) || !slices.Contains(arms, ArmEndsNowAllowed) {
			return false
		}
	}
	return true
}

// smoothStringDeniedInBatch reports whether reqs, a batch of allows of
// one rule each on ids of their own, has a smooth allow denied on a key
// that holds nothing but its smooth instant (no penalty, tally, log or
// lease), as the model decides it.
func smoothStringDeniedInBatch(reqs []*driver.Request, before [][]model.Key) bool {
	if len(reqs) < 2 {
		return false
	}
	ids := map[string]bool{}
	found := false
	for j, r := range reqs {
		if r.Op != driver.OpAllow || len(r.Checks) != 1 || ids[r.ID] {
			return false
		}
		ids[r.ID] = true
		k, c := before[j][0], &r.Checks[0]
		found = found || c.Smooth() && !c.State.Allowed && k.TAT > r.Now.UnixMicro() &&
			k.Blocked == 0 && k.Denied == 0 && len(k.Log) == 0 && len(k.Leases) == 0
	}
	return found
}
