//go:build unix

package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testenv/rediscluster"
)

// background lets a goroutine other than the test's use a helper that
// fails its test: Fatal reports and ends that goroutine alone.
type background struct{ testing.TB }

func (b background) Fatal(args ...any) { b.Error(args...); runtime.Goexit() }
func (b background) Fatalf(format string, args ...any) {
	b.Errorf(format, args...)
	runtime.Goexit()
}

// slotPath is one way calls reach Redis, with the rules it counts on.
type slotPath struct {
	name  string
	rules []countlimit.Rule // each counted once by warm and once by call
	// warm counts on id; call counts again, checking each Used is 2.
	warm, call func(t *testing.T, s *redisstore.Store, h *pipeHook, l *countlimit.Limiter, id string) error
	// first names the key of id to move alone for TRYAGAIN: with it on
	// the new node and the others on the old, the call's keys are split.
	// Empty for a path whose calls name one key, which no slot refuses.
	first func(id string) string
}

func slotPaths(t *testing.T) []slotPath {
	ctx := context.Background()
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "slot.fixed"), Limit: 10, Window: countlimit.Fixed(time.Hour)}
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "slot.sliding"), Limit: 10, Window: countlimit.Sliding(time.Hour)}
	fixed2, sliding2 := fixed, sliding
	fixed2.UseType, sliding2.UseType = fixed.UseType+".2", sliding.UseType+".2"
	lease := countlimit.Rule{UseType: storetest.UseType(t, "slot.lease"), Limit: 2, Window: countlimit.Concurrent(time.Minute)}
	want := func(t *testing.T, what string, want int64, res ...countlimit.Result) {
		t.Helper()
		for _, r := range res {
			if !r.Allowed || r.Used != want {
				t.Errorf("%s = %+v, want allowed with Used %d", what, r, want)
			}
		}
	}
	allow := func(r countlimit.Rule, used int64) func(t *testing.T, s *redisstore.Store, h *pipeHook, l *countlimit.Limiter, id string) error {
		return func(t *testing.T, _ *redisstore.Store, _ *pipeHook, l *countlimit.Limiter, id string) error {
			res, err := l.Allow(ctx, r, id)
			if err == nil {
				want(t, "Allow", used, res)
			}
			return err
		}
	}
	allowAll := func(used int64) func(t *testing.T, s *redisstore.Store, h *pipeHook, l *countlimit.Limiter, id string) error {
		return func(t *testing.T, _ *redisstore.Store, _ *pipeHook, l *countlimit.Limiter, id string) error {
			res, err := l.AllowAll(ctx, id, fixed2, sliding2)
			if err == nil {
				want(t, "AllowAll", used, res...)
			}
			return err
		}
	}
	// The pipeline's three calls, each a script of its own on a Cluster.
	three := func(l *countlimit.Limiter, id string, used int64, t *testing.T) []func() error {
		return []func() error{
			func() error { return allow(fixed, used)(t, nil, nil, l, id) },
			func() error { return allow(sliding, used)(t, nil, nil, l, id) },
			func() error { return allowAll(used)(t, nil, nil, l, id) },
		}
	}
	return []slotPath{
		{name: "fast", rules: []countlimit.Rule{fixed}, warm: allow(fixed, 1), call: allow(fixed, 2)},
		{name: "fast sliding", rules: []countlimit.Rule{sliding}, warm: allow(sliding, 1), call: allow(sliding, 2),
			first: func(id string) string { return redisstore.Key(sliding.UseType, id) }},
		{name: "apply", rules: []countlimit.Rule{fixed2, sliding2}, warm: allowAll(1), call: allowAll(2),
			first: func(id string) string { return redisstore.Key(fixed2.UseType, id) }},
		{name: "pipeline", rules: []countlimit.Rule{fixed, sliding, fixed2, sliding2},
			warm: func(t *testing.T, _ *redisstore.Store, _ *pipeHook, l *countlimit.Limiter, id string) error {
				var errs []error
				for _, call := range three(l, id, 1, t) {
					errs = append(errs, call())
				}
				return errors.Join(errs...)
			},
			call: func(t *testing.T, s *redisstore.Store, h *pipeHook, l *countlimit.Limiter, id string) error {
				errs := gathered(t, s, h, func() error { _, err := l.Allow(ctx, fixed, "elsewhere"); return err }, three(l, id, 2, t)...)
				h.mu.Lock()
				if !slices.Contains(h.sizes, 3) {
					t.Errorf("round trips of %v calls, want one of the three calls", h.sizes)
				}
				h.mu.Unlock()
				return errors.Join(errs...)
			},
			first: func(id string) string { return redisstore.Key(sliding.UseType, id) }},
		{name: "lease", rules: []countlimit.Rule{lease},
			warm: func(t *testing.T, _ *redisstore.Store, _ *pipeHook, l *countlimit.Limiter, id string) error {
				// Both keys: the lease set, and the hash a denial writes.
				if _, _, err := l.Acquire(ctx, lease, id); err != nil {
					return err
				}
				second, _, err := l.Acquire(ctx, lease, id)
				if err != nil {
					return err
				}
				if _, r, err := l.Acquire(ctx, lease, id); err != nil || r.Allowed {
					return fmt.Errorf("a third Acquire of a limit of 2 = %+v, %v; want denied", r, err)
				}
				return second.Release(ctx)
			},
			call: func(t *testing.T, _ *redisstore.Store, _ *pipeHook, l *countlimit.Limiter, id string) error {
				_, r, err := l.Acquire(ctx, lease, id)
				if err == nil {
					want(t, "Acquire", 2, r)
				}
				return err
			},
			first: func(id string) string { return redisstore.Key(lease.UseType, id) }},
	}
}

// TestClusterSlots moves slots of a private three-master Redis Cluster
// between calls, one subtest after another (each moves slots the others'
// clients may meet).
func TestClusterSlots(t *testing.T) {
	t.Parallel()
	c := rediscluster.Start(t, 3, 0)
	t.Run("moves", func(t *testing.T) { testSlotMoves(t, c) })
	t.Run("in migration", func(t *testing.T) { testSlotInMigration(t, c) })
	t.Run("lost reply after a redirect", func(t *testing.T) { testLostReplyAfterRedirect(t, c) })
	t.Run("pipeline keeps order", func(t *testing.T) { testPipelineKeepsOrder(t, c) })
	t.Run("pipeline sends a script that ran once", func(t *testing.T) { testPipelineSendsOnce(t, c) })
}

// testSlotMoves moves the slot of an id between a call that counted on it
// and one that counts again through a ClusterClient that has not heard of
// the move, on every path a call takes (a fast.lua script alone, a
// pipeline of scripts, apply.lua, lease.lua): moved whole (the old node
// answers MOVED), in migration with the id's keys on the new node (ASK),
// and in migration with its keys split between the nodes (TRYAGAIN, until
// the test ends the migration). No redirect or refusal ran the script, so
// the second call counts, once, and answers.
func testSlotMoves(t *testing.T, c *rediscluster.Cluster) {
	for _, p := range slotPaths(t) {
		for _, kind := range []string{"MOVED", "ASK", "TRYAGAIN"} {
			if kind == "TRYAGAIN" && p.first == nil {
				continue // one key: never split (testSlotInMigration)
			}
			t.Run(p.name+"/"+kind, func(t *testing.T) { testSlotMove(t, c, p, kind) })
		}
	}
}

func testSlotMove(t *testing.T, c *rediscluster.Cluster, p slotPath, kind string) {
	cl, seen := c.Client(t)
	h, s, l := oneSlot(cl)
	id := string(storetest.UseType(t, "id"))
	if err := p.warm(t, s, h, l, id); err != nil {
		t.Fatalf("before the move: %v", err)
	}
	slot := c.Slot(t, redisstore.Key(p.rules[0].UseType, id))
	from := c.Owner(t, slot)
	to := c.Other(t, from)
	var err error
	switch kind {
	case "MOVED":
		c.MoveSlot(t, slot, from, to)
		err = p.call(t, s, h, l, id)
	case "ASK":
		c.BeginMigration(t, slot, from, to)
		c.MigrateKeys(t, slot, from, to)
		err = p.call(t, s, h, l, id)
		c.EndMigration(t, slot, from, to)
	case "TRYAGAIN":
		c.BeginMigration(t, slot, from, to)
		c.MigrateKeys(t, slot, from, to, p.first(id))
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			bg := background{t}
			for deadline := time.Now().Add(10 * time.Second); seen.Count(kind) == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					bg.Fatal("no TRYAGAIN within 10 s")
				}
			}
			// Past go-redis's own retries: the Store waits on.
			time.Sleep(300 * time.Millisecond)
			c.MigrateKeys(bg, slot, from, to)
			c.EndMigration(bg, slot, from, to)
		}()
		err = p.call(t, s, h, l, id)
		<-ended
	}
	if err != nil {
		t.Fatalf("after %s: %v", kind, err)
	}
	if seen.Count(kind) == 0 {
		t.Errorf("the call met no %s (replies %v): the test moved nothing in its way", kind, seen)
	}
	// The counts as stored, through a client that knows where they are.
	fresh, _ := c.Client(t)
	l2 := countlimit.New(redisstore.New(fresh))
	for _, r := range p.rules {
		res, err := l2.Peek(context.Background(), r, id)
		if err != nil || res.Used != 2 {
			t.Errorf("Peek(%s) after %s = %+v, %v; want Used 2", r.UseType, kind, res, err)
		}
	}
}

// testSlotInMigration holds a slot in migration (IMPORTING on one master,
// MIGRATING on another; one key of an id moved): calls of every kind on an
// id that has keys there and on a new id of that slot succeed, those that
// name one key at once, the others once the migration ends, and count once
// each.
func testSlotInMigration(t *testing.T, c *rediscluster.Cluster) {
	ctx := context.Background()
	cl, _ := c.Client(t)
	l := countlimit.New(redisstore.New(cl))
	ut := func(name string) countlimit.UseType { return storetest.UseType(t, "migrating."+name) }
	fixed := countlimit.Rule{UseType: ut("fixed"), Limit: 10, Window: countlimit.Fixed(time.Hour)}
	smooth := countlimit.Rule{UseType: ut("smooth"), Limit: 10, Window: countlimit.Smooth(time.Hour, 10)}
	sliding := countlimit.Rule{UseType: ut("sliding"), Limit: 10, Window: countlimit.Sliding(time.Hour)}
	fixed2 := countlimit.Rule{UseType: ut("fixed2"), Limit: 10, Window: countlimit.Lifetime()}
	sliding2 := countlimit.Rule{UseType: ut("sliding2"), Limit: 10, Window: countlimit.Sliding(time.Hour)}
	lease := countlimit.Rule{UseType: ut("lease"), Limit: 10, Window: countlimit.Concurrent(time.Minute)}

	old := string(storetest.UseType(t, "old"))
	slot := c.Slot(t, redisstore.Key(fixed.UseType, old))
	if got := rediscluster.KeySlot(redisstore.Key(fixed.UseType, old)); got != slot {
		t.Fatalf("KeySlot = %d, Redis says %d", got, slot)
	}
	var young string // a new id of the same slot
	for i := 0; young == ""; i++ {
		if id := fmt.Sprintf("%s-%d", old, i); rediscluster.KeySlot(redisstore.Key(fixed.UseType, id)) == slot {
			young = id
		}
	}
	type call struct {
		name   string
		oneKey bool // names one key: served during the migration
		do     func(id string) (int64, error)
	}
	calls := []call{
		{"Allow fixed", true, func(id string) (int64, error) { r, err := l.Allow(ctx, fixed, id); return r.Used, err }},
		{"Allow smooth", true, func(id string) (int64, error) { r, err := l.Allow(ctx, smooth, id); return r.Used, err }},
		{"Allow sliding", false, func(id string) (int64, error) { r, err := l.Allow(ctx, sliding, id); return r.Used, err }},
		{"AllowAll", false, func(id string) (int64, error) {
			r, err := l.AllowAll(ctx, id, fixed2, sliding2)
			if err != nil {
				return 0, err
			}
			return r[0].Used, err
		}},
		{"Acquire", false, func(id string) (int64, error) { _, r, err := l.Acquire(ctx, lease, id); return r.Used, err }},
	}
	for _, c := range calls {
		if _, err := c.do(old); err != nil {
			t.Fatalf("%s before the migration: %v", c.name, err)
		}
	}

	from := c.Owner(t, slot)
	to := c.Other(t, from)
	c.BeginMigration(t, slot, from, to)
	c.MigrateKeys(t, slot, from, to, redisstore.LogKey(sliding.UseType, old))

	type outcome struct {
		call call
		id   string
		used int64
		err  error
	}
	oneKey, others := make(chan outcome, 2*len(calls)), make(chan outcome, 2*len(calls))
	for _, cl := range calls {
		for _, id := range []string{old, young} {
			go func() {
				u, err := cl.do(id)
				o := outcome{cl, id, u, err}
				if cl.oneKey {
					oneKey <- o
				} else {
					others <- o
				}
			}()
		}
	}
	check := func(o outcome) {
		t.Helper()
		want := int64(1)
		if o.id == old {
			want = 2
		}
		if o.err != nil || o.used != want {
			t.Errorf("%s(%s) during the migration: Used %d, %v; want %d", o.call.name, o.id, o.used, o.err, want)
		}
	}
	// The calls that name one key are served while the slot stays in
	// migration: the test ends it only after they all returned.
	for range 2 * 2 {
		select {
		case o := <-oneKey:
			check(o)
		case <-time.After(10 * time.Second):
			t.Fatal("a call that names one key waited 10 s for a slot in migration")
		}
	}
	c.MigrateKeys(t, slot, from, to)
	c.EndMigration(t, slot, from, to)
	for range 2 * (len(calls) - 2) {
		check(<-others)
	}
	// Each counted once: the counts as stored.
	for _, tc := range []struct {
		rule       countlimit.Rule
		old, fresh int64
	}{{fixed, 2, 1}, {smooth, 2, 1}, {sliding, 2, 1}, {fixed2, 2, 1}, {sliding2, 2, 1}, {lease, 2, 1}} {
		for id, want := range map[string]int64{old: tc.old, young: tc.fresh} {
			r, err := l.Peek(ctx, tc.rule, id)
			if err != nil || r.Used != want {
				t.Errorf("Peek(%s, %s) after the migration = Used %d, %v; want %d", tc.rule.UseType, id, r.Used, err, want)
			}
		}
	}
}

// testLostReplyAfterRedirect loses the reply of a script that ran on the
// node a MOVED sent it to: go-redis sends it again, and the repeat, which
// knows that an earlier send may have run, answers from its record without
// counting twice.
func testLostReplyAfterRedirect(t *testing.T, c *rediscluster.Cluster) {
	ctx := context.Background()
	rule := countlimit.Rule{UseType: storetest.UseType(t, "lost.moved"), Limit: 10, Window: countlimit.Fixed(time.Hour)}
	id := "id"
	slot := c.Slot(t, redisstore.Key(rule.UseType, id))
	from := c.Owner(t, slot)
	to := c.Other(t, from)
	proxy := newDropProxy(t, to.Addr)
	// Connections to the slot's new node go through the proxy.
	cl, seen := c.Client(t, func(o *redis.ClusterOptions) {
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == to.Addr {
				addr = proxy.addr()
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	})
	l := countlimit.New(redisstore.New(cl))
	if r, err := l.Allow(ctx, rule, id); err != nil || r.Used != 1 {
		t.Fatalf("Allow before the move = %+v, %v; want Used 1", r, err)
	}
	c.MoveSlot(t, slot, from, to)
	// The node has the script: the reply lost is the script's, not a
	// NOSCRIPT's.
	if err := to.Client(t).ScriptLoad(ctx, redisstore.FastSource).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.arm("evalsha", nil)
	r, err := l.Allow(ctx, rule, id)
	if err != nil || r.Used != 2 {
		t.Errorf("Allow after MOVED and a lost reply = %+v, %v; want Used 2", r, err)
	}
	if seen.Count("MOVED") == 0 || proxy.drops() != 1 {
		t.Errorf("the call met %d MOVED and %d lost replies, want 1 or more and 1", seen.Count("MOVED"), proxy.drops())
	}
	n, err := to.Client(t).HGet(ctx, redisstore.Key(rule.UseType, id), "c").Int64()
	if err != nil || n != 2 {
		t.Errorf("stored count = %d, %v; want 2", n, err)
	}
}

// capture is a Store that keeps the requests a Limiter makes, answering
// each allowed, for a test to send them itself.
type capture struct{ reqs []*driver.Request }

func (c *capture) Do(_ context.Context, r *driver.Request) error {
	q := *r
	q.Checks = slices.Clone(r.Checks)
	c.reqs = append(c.reqs, &q)
	for i := range r.Checks {
		r.Checks[i].State = driver.State{Allowed: true}
	}
	return nil
}

// testPipelineKeepsOrder: on a Cluster a call names a sliding log only
// where it needs one, and a call that finds a log it was not given (its use
// type counted with a sliding rule before) goes again after its pipeline.
// A pipeline whose later call is on the same id still applies its calls in
// order: each gets what it gets when the calls go one by one.
func testPipelineKeepsOrder(t *testing.T, c *rediscluster.Cluster) {
	cl, _ := c.Client(t)
	s := redisstore.New(cl)
	ctx := context.Background()
	start := time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC)
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "order"), Limit: 5, Window: countlimit.Sliding(time.Minute)}
	fixed, smooth := sliding, sliding
	fixed.Window, smooth.Window = countlimit.Fixed(time.Hour), countlimit.Smooth(time.Minute, 5)
	// requests returns the requests of the calls on id: a sliding Allow,
	// then, a second later, another kind's AllowN and a Refund.
	requests := func(then countlimit.Rule, id string) (first, pair []*driver.Request) {
		rec := &capture{}
		at := start
		l := countlimit.New(rec, countlimit.WithClock(func() time.Time { return at }))
		_, err1 := l.Allow(ctx, sliding, id)
		at = at.Add(time.Second)
		_, err2 := l.AllowN(ctx, then, id, 2)
		_, err3 := l.Refund(ctx, then, id, 1)
		if err := errors.Join(err1, err2, err3); err != nil {
			t.Fatal(err)
		}
		return rec.reqs[:1], rec.reqs[1:]
	}
	for _, then := range []countlimit.Rule{fixed, smooth} {
		var states [2][]driver.State
		for k, together := range []bool{false, true} {
			first, pair := requests(then, fmt.Sprintf("%s-%v", then.Window, together))
			if err := s.PipelineForTest(ctx, first); err != nil {
				t.Fatal(err)
			}
			if together {
				if err := s.PipelineForTest(ctx, pair); err != nil {
					t.Fatal(err)
				}
			} else {
				for _, r := range pair {
					if err := s.PipelineForTest(ctx, []*driver.Request{r}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, r := range pair {
				states[k] = append(states[k], r.Checks[0].State)
			}
		}
		if !slices.Equal(states[0], states[1]) {
			t.Errorf("after a sliding Allow, %v's AllowN and Refund one by one = %+v, in one pipeline = %+v", then.Window, states[0], states[1])
		}
	}
}

// testPipelineSendsOnce: go-redis sends a node's part of a pipeline again
// whole when its first command meets TRYAGAIN, the commands that ran
// included. A script whose keys a slot in migration has split (TRYAGAIN)
// goes first in a pipeline beside one that runs: the one that ran is sent
// once, and counts once.
func testPipelineSendsOnce(t *testing.T, c *rediscluster.Cluster) {
	cl, seen := c.Client(t)
	s := redisstore.New(cl)
	ctx := context.Background()
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "once.sliding"), Limit: 5, Window: countlimit.Sliding(time.Hour)}
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "once.fixed"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	rec := &capture{}
	l := countlimit.New(rec)
	for _, r := range []countlimit.Rule{sliding, fixed, sliding, fixed} {
		if _, err := l.Allow(ctx, r, "id"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PipelineForTest(ctx, rec.reqs[:2]); err != nil {
		t.Fatal(err)
	}
	slot := c.Slot(t, redisstore.Key(fixed.UseType, "id"))
	from := c.Owner(t, slot)
	to := c.Other(t, from)
	c.BeginMigration(t, slot, from, to)
	c.MigrateKeys(t, slot, from, to, redisstore.Key(sliding.UseType, "id"))
	before := seen.Sends(redisstore.Key(fixed.UseType, "id"))
	err := s.PipelineForTest(ctx, rec.reqs[2:])
	if !redis.IsTryAgainError(err) {
		t.Errorf("the split sliding call = %v, want TRYAGAIN (which the Store's Do waits out)", err)
	}
	if r := rec.reqs[3].Checks[0].State; !r.Allowed || r.Used != 2 {
		t.Errorf("the fixed call beside it = %+v, want allowed with Used 2", r)
	}
	if n := seen.Sends(redisstore.Key(fixed.UseType, "id")) - before; n != 1 {
		t.Errorf("the fixed call's script was sent %d times, want once", n)
	}
	c.MigrateKeys(t, slot, from, to)
	c.EndMigration(t, slot, from, to)
}
