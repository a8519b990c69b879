package memstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/countlimit/countlimit/countlimit"
)

// TestChainsKeepCollidingIDsApart puts the counters of two ids under one
// hash, as a 64-bit collision would: each is found, dropped and moved on
// its own.
func TestChainsKeepCollidingIDsApart(t *testing.T) {
	const h = 42
	sh := &shard{m: map[uint64]*entry{}}
	keys := []struct {
		ut string
		id string
	}{{"a", "x"}, {"b", "x"}, {"a", "y"}, {"b", "y"}}
	for i, k := range keys {
		sh.add(h, &entry{useType: k.ut, id: k.id, count: int64(i), expires: int64(i)})
	}
	check := func(step string, want map[int]bool) {
		t.Helper()
		if sh.n != len(want) {
			t.Errorf("%s: n = %d, want %d", step, sh.n, len(want))
		}
		for i, k := range keys {
			e := sh.get(h, k.ut, k.id)
			switch {
			case want[i] && (e == nil || e.count != int64(i)):
				t.Errorf("%s: get(%s, %s) = %+v, want count %d", step, k.ut, k.id, e, i)
			case !want[i] && e != nil:
				t.Errorf("%s: get(%s, %s) = %+v, want nil", step, k.ut, k.id, e)
			}
		}
	}
	check("added", map[int]bool{0: true, 1: true, 2: true, 3: true})
	if e := sh.get(h, "a", "z"); e != nil {
		t.Errorf("get(a, z) = %+v, want nil", e)
	}
	sh.remove(h, "b", "x") // mid-chain
	check("removed (b, x)", map[int]bool{0: true, 2: true, 3: true})
	sh.remove(h, "b", "y") // the head: added last
	check("removed (b, y)", map[int]bool{0: true, 2: true})
	sh.remove(h, "b", "y")
	check("removed (b, y) again", map[int]bool{0: true, 2: true})

	sh.add(h, &entry{useType: "b", id: "x", count: 1, expires: 1})
	sh.add(h, &entry{useType: "b", id: "y", count: 3, expires: 3})
	seen, low := sh.prune(sh.m, nil, h, 1) // drops expires 0 and 1
	if seen != 4 || low != 2 {
		t.Errorf("prune = %d seen, low %d; want 4, 2", seen, low)
	}
	check("pruned", map[int]bool{2: true, 3: true})

	sh.old, sh.m = sh.m, map[uint64]*entry{}
	sh.add(h, &entry{useType: "a", id: "x", count: 0, expires: 5})
	if len(sh.m) != 0 {
		t.Errorf("a counter joining a chain in old went to m")
	}
	check("joined in old", map[int]bool{0: true, 2: true, 3: true})
	if seen, low := sh.prune(sh.old, sh.m, h, 0); seen != 3 || low != 2 || len(sh.old) != 0 || len(sh.m) != 1 {
		t.Errorf("prune moving = %d seen, low %d, %d in old, %d in m; want 3, 2, 0, 1", seen, low, len(sh.old), len(sh.m))
	}
	sh.old = nil
	check("moved", map[int]bool{0: true, 2: true, 3: true})
	for _, k := range keys {
		sh.remove(h, k.ut, k.id)
	}
	check("all removed", map[int]bool{})
	if len(sh.m) != 0 {
		t.Errorf("%d chains left, want 0", len(sh.m))
	}
}

// TestUseTypesHaveChainsOfTheirOwn: a lookup walks past none of its id's
// other counters, so its cost does not grow with how many use types the
// id has: the 2 000 counters of one id are 2 000 chains of one (two would
// share a chain only if their 64-bit hashes collided).
func TestUseTypesHaveChainsOfTheirOwn(t *testing.T) {
	s := New(WithJanitorInterval(0))
	defer s.Close()
	l := countlimit.New(s)
	for i := range 2000 {
		rule := countlimit.Rule{UseType: countlimit.UseType(fmt.Sprint("ut-", i)), Limit: 1, Window: countlimit.Lifetime()}
		if _, err := l.Allow(context.Background(), rule, "one-id"); err != nil {
			t.Fatal(err)
		}
	}
	chains, longest := 0, 0
	for i := range s.shards {
		for _, head := range s.shards[i].m {
			n := 0
			for e := head; e != nil; e = e.next {
				n++
			}
			chains, longest = chains+1, max(longest, n)
		}
	}
	if chains != 2000 || longest != 1 {
		t.Errorf("one id's 2000 counters are in %d chains, the longest of %d; want 2000 chains of 1", chains, longest)
	}
}
