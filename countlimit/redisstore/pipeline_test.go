package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// pipeHook records every round trip of scripts a client sends that
// carries more than one call: a pipeline, or one fast.lua script of
// several calls. While armed, it holds the next plain command until the
// test releases it. beforePipeline, if set, runs once before the next
// pipeline is sent.
type pipeHook struct {
	mu             sync.Mutex
	sizes          []int      // calls a round trip carried
	names          [][]string // its commands' names
	beforePipeline func()

	hold    chan struct{} // closed by the test to release; nil: not armed
	holding chan struct{} // closed when a command is held
}

func (h *pipeHook) arm() {
	h.mu.Lock()
	h.hold, h.holding = make(chan struct{}), make(chan struct{})
	h.mu.Unlock()
}

func (h *pipeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		hold, holding := h.hold, h.holding
		h.hold = nil
		h.mu.Unlock()
		if hold != nil {
			close(holding)
			<-hold
		}
		if n := callsIn(cmd); n > 1 {
			h.mu.Lock()
			h.sizes = append(h.sizes, n)
			h.names = append(h.names, []string{cmd.Name()})
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}
func (h *pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		calls := 0
		for i, c := range cmds {
			names[i] = c.Name()
			calls += callsIn(c)
		}
		if calls == 0 {
			return next(ctx, cmds) // a connection's handshake
		}
		h.mu.Lock()
		h.sizes = append(h.sizes, calls)
		h.names = append(h.names, names)
		before := h.beforePipeline
		h.beforePipeline = nil
		h.mu.Unlock()
		if before != nil {
			before()
		}
		return next(ctx, cmds)
	}
}

// callsIn returns how many calls a command carries: a fast.lua script
// may carry several (KEYS: two a call), any other script one, and any
// other command (a connection's handshake, a Cluster pipeline's EXISTS)
// none.
func callsIn(cmd redis.Cmder) int {
	if !strings.HasPrefix(cmd.Name(), "eval") {
		return 0
	}
	args := cmd.Args()
	if len(args) < 3 || (args[1] != fastScript.Hash() && args[1] != redisstore.FastSource) {
		return 1
	}
	nkeys, _ := args[2].(int)
	return nkeys / 2
}

var fastScript = redis.NewScript(redisstore.FastSource)

// oneSlot adds a pipeHook to c and returns it with a Store on c with one
// pipeline slot (and opts) and its Limiter: what gathered works with.
func oneSlot(c redis.UniversalClient, opts ...redisstore.Option) (*pipeHook, *redisstore.Store, *countlimit.Limiter) {
	h := &pipeHook{}
	c.AddHook(h)
	s := redisstore.New(c, append(opts, redisstore.WithMaxInFlight(1))...)
	return h, s, countlimit.New(s)
}

// gathered holds one call in flight on a Store with one pipeline slot,
// starts calls while it is held, waits until they all queue, and releases
// the first call: the others then leave together in one pipeline. It
// returns their errors, in order.
func gathered(t *testing.T, s *redisstore.Store, h *pipeHook, first func() error, calls ...func() error) []error {
	t.Helper()
	h.arm()
	h.mu.Lock()
	holding := h.holding
	release := h.hold
	h.mu.Unlock()
	firstErr := make(chan error, 1)
	go func() { firstErr <- first() }()
	select {
	case <-holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the first call never reached Redis")
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() { errs[i] = call() })
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.QueuedForTest() != len(calls) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", s.QueuedForTest(), len(calls))
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-firstErr; err != nil {
		t.Errorf("the first call: %v", err)
	}
	wg.Wait()
	return errs
}

// TestFailingScriptFailsOnlyItsCaller sends five calls in one round trip,
// one of them on a key that someone made a string: that one fails with
// ErrUnavailable and WRONGTYPE, the four others count as usual, each from
// its own count (0 to 3 before), so a reply given to the wrong caller shows.
// On one
// server the five go as one fast.lua script, which leaves the failing call
// undone, to be sent again alone (and fail there); with a script a call,
// as on a Cluster, they go as a pipeline of five scripts.
func TestFailingScriptFailsOnlyItsCaller(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		opts  []redisstore.Option
		names [][]string
	}{
		{"one script", nil, [][]string{{"evalsha"}}},
		{"script per call", []redisstore.Option{redisstore.WithScriptPerCall()}, [][]string{{"evalsha", "evalsha", "evalsha", "evalsha", "evalsha"}}},
	} {
		t.Run(tc.name, func(t *testing.T) { testFailingScript(t, tc.opts, tc.names) })
	}
}

func testFailingScript(t *testing.T, opts []redisstore.Option, names [][]string) {
	t.Parallel()
	c := client(t)
	h, s, l := oneSlot(c, opts...)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: storetest.UseType(t, "wrongtype"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	if err := c.Set(ctx, redisstore.Key(rule.UseType, "bad"), "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "bad", "c", "d"}
	before := map[string]int64{"b": 1, "c": 2, "d": 3}
	for id, n := range before {
		if _, err := l.AllowN(ctx, rule, id, n); err != nil {
			t.Fatal(err)
		}
	}
	results := make([]countlimit.Result, len(ids))
	calls := make([]func() error, len(ids))
	for i, id := range ids {
		calls[i] = func() (err error) { results[i], err = l.Allow(ctx, rule, id); return err }
	}
	errs := gathered(t, s, h, func() error { _, err := l.Allow(ctx, rule, "first"); return err }, calls...)

	h.mu.Lock()
	if !slices.Equal(h.sizes, []int{len(ids)}) || !slices.EqualFunc(h.names, names, slices.Equal) {
		t.Errorf("round trips of %v calls (%v) sent, want one of %d (%v)", h.sizes, h.names, len(ids), names)
	}
	h.mu.Unlock()
	for i, id := range ids {
		if id == "bad" {
			if !errors.Is(errs[i], countlimit.ErrUnavailable) || !strings.Contains(errs[i].Error(), "WRONGTYPE") {
				t.Errorf("Allow on a string key: %v; want ErrUnavailable with WRONGTYPE", errs[i])
			}
			continue
		}
		if want := before[id] + 1; errs[i] != nil || !results[i].Allowed || results[i].Used != want {
			t.Errorf("Allow(%q) in the pipeline with the failing call = %+v, %v; want allowed, Used %d", id, results[i], errs[i], want)
		}
	}
}

// TestNoScriptInAPipeline flushes the scripts while calls gather: every
// command of the pipeline (the three Allows' one script, two of a fixed
// window and one sliding, the Peek's and the Reset's) gets NOSCRIPT and is
// sent again, once, with EVAL, and each call gets its own reply.
func TestNoScriptInAPipeline(t *testing.T) {
	c := client(t)
	other := client(t)
	h, s, l := oneSlot(c)
	ctx := context.Background()
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "noscript"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "noscript.sliding"), Limit: 5, Window: countlimit.Sliding(time.Hour)}
	for _, id := range []string{"once", "gone"} {
		if _, err := l.Allow(ctx, fixed, id); err != nil {
			t.Fatal(err)
		}
	}
	h.beforePipeline = func() {
		if err := other.ScriptFlush(ctx).Err(); err != nil {
			t.Error(err)
		}
	}
	var res [4]countlimit.Result
	errs := gathered(t, s, h,
		func() error { _, err := l.Allow(ctx, fixed, "first"); return err },
		func() (err error) { res[0], err = l.Allow(ctx, fixed, "x"); return err },
		func() (err error) { res[1], err = l.AllowN(ctx, sliding, "x", 2); return err },
		func() (err error) { res[2], err = l.Peek(ctx, fixed, "once"); return err },
		func() error { return l.Reset(ctx, fixed, "gone") },
		func() (err error) { res[3], err = l.AllowN(ctx, fixed, "once", 3); return err },
	)
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d after SCRIPT FLUSH: %v", i, err)
		}
	}
	// The Peek of "once" and its AllowN of 3 are concurrent: either order.
	if res[0].Used != 1 || res[1].Used != 2 || (res[2].Used != 1 && res[2].Used != 4) || res[3].Used != 4 {
		t.Errorf("Used after SCRIPT FLUSH = %d, %d, %d, %d; want 1, 2, 1 or 4, 4", res[0].Used, res[1].Used, res[2].Used, res[3].Used)
	}
	h.mu.Lock()
	want := [][]string{{"evalsha", "evalsha", "evalsha"}, {"eval", "eval", "eval"}}
	if len(h.names) != 2 || !slices.Equal(h.names[0], want[0]) || !slices.Equal(h.names[1], want[1]) {
		t.Errorf("pipelines sent: %v, want %v", h.names, want)
	}
	h.mu.Unlock()
	if r, err := l.Peek(ctx, fixed, "gone"); err != nil || r.Used != 0 {
		t.Errorf("Peek after the Reset = %+v, %v; want Used 0", r, err)
	}
}

// TestExactThroughTwoClients: 64 goroutines on two clients (two Stores,
// two connection pools) call Allow on one id with limit 100: exactly 100
// are allowed, with Used 1 to 100, each once, and calls were pipelined.
func TestExactThroughTwoClients(t *testing.T) {
	t.Parallel()
	clients := []*redis.Client{client(t), client(t)}
	h := &pipeHook{}
	limiters := make([]*countlimit.Limiter, len(clients))
	for i, c := range clients {
		c.AddHook(h)
		limiters[i] = countlimit.New(redisstore.New(c))
	}
	rule := countlimit.Rule{UseType: storetest.UseType(t, "exact"), Limit: 100, Window: countlimit.Rolling(time.Hour)}
	const callers, each = 64, 4
	ctx := context.Background()
	testbackend.AllAtOnce(t, callers, each, 100, func(i int) (countlimit.Result, error) { return limiters[i%2].Allow(ctx, rule, "hot") })
	stored, err := clients[0].HGet(ctx, redisstore.Key(rule.UseType, "hot"), "c").Int64()
	if err != nil || stored != 100 {
		t.Errorf("stored count %d (%v), want 100", stored, err)
	}
	h.mu.Lock()
	if len(h.sizes) == 0 {
		t.Errorf("%d concurrent calls sent no pipeline", callers*each)
	}
	h.mu.Unlock()
}

// TestConnectionKilledMidPipeline kills the client's connections (CLIENT
// KILL), again and again, while 64 callers run: every call gets an answer
// or ErrUnavailable before its deadline, and no call counts twice. With
// go-redis's retries the kills cost nothing but time; without them, the
// calls of a pipeline whose connection died fail with ErrUnavailable.
func TestConnectionKilledMidPipeline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		maxRetries int
	}{
		{"retries", 0}, // go-redis's default: 3
		{"no retries", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testConnectionKilled(t, tc.maxRetries)
		})
	}
}

func testConnectionKilled(t *testing.T, maxRetries int) {
	direct := client(t)
	opts := *direct.Options()
	opts.ClientName = "countlimit-kill-" + string(storetest.UseType(t, "x"))[len("storetest.x."):]
	opts.ContextTimeoutEnabled = true
	opts.ReadTimeout = 30 * time.Second // a hang would show
	opts.MaxRetries = maxRetries
	victim := redis.NewClient(&opts)
	t.Cleanup(func() { victim.Close() })
	l := countlimit.New(redisstore.New(victim, guarded()...))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "kill"), Limit: 1 << 40, Window: countlimit.Fixed(time.Hour)}
	ids := []string{"k0", "k1", "k2", "k3"}

	const (
		callers  = 64
		run      = 3 * time.Second
		deadline = time.Second
		slack    = time.Second // scheduling under -race on a busy machine, not a hang
	)
	var (
		mu          sync.Mutex
		used        = map[string][]int64{}
		unavailable = map[string]int64{}
		late        []time.Duration
		kills       atomic.Int64
		wg          sync.WaitGroup
	)
	stop := time.Now().Add(run)
	ctx := context.Background()
	for i := range callers {
		wg.Go(func() {
			for n := 0; time.Now().Before(stop); n++ {
				id := ids[(i+n)%len(ids)]
				cctx, cancel := context.WithTimeout(ctx, deadline)
				began := time.Now()
				res, err := l.Allow(cctx, rule, id)
				took := time.Since(began)
				cancel()
				mu.Lock()
				switch {
				case took > deadline+slack:
					late = append(late, took)
				case err == nil && res.Allowed:
					used[id] = append(used[id], res.Used)
				case errors.Is(err, countlimit.ErrUnavailable):
					unavailable[id]++
				default:
					t.Errorf("Allow = %+v, %v; want allowed or ErrUnavailable", res, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for time.Now().Before(stop) {
			list, err := direct.ClientList(ctx).Result()
			if err != nil {
				t.Error(err)
				return
			}
			for _, line := range strings.Split(list, "\n") {
				if !strings.Contains(line, " name="+opts.ClientName+" ") {
					continue
				}
				id := strings.TrimPrefix(strings.Fields(line)[0], "id=")
				if err := direct.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err == nil {
					kills.Add(1)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	wg.Wait()

	if len(late) > 0 {
		t.Errorf("%d calls returned past their %v deadline: %v", len(late), deadline, late)
	}
	if kills.Load() < 10 {
		t.Errorf("%d connections killed, want 10 or more", kills.Load())
	}
	var answered, failed int64
	for _, id := range ids {
		u := used[id]
		slices.Sort(u)
		if len(slices.Compact(slices.Clone(u))) != len(u) {
			t.Errorf("%s: two answers with the same Used: one event counted twice", id)
		}
		stored, err := direct.HGet(ctx, redisstore.Key(rule.UseType, id), "c").Int64()
		if err != nil {
			t.Fatal(err)
		}
		// A call that failed may or may not have counted; none counts twice.
		if n := int64(len(u)); stored < n || stored > n+unavailable[id] {
			t.Errorf("%s: stored count %d, want between %d allowed and %d allowed or failed", id, stored, n, n+unavailable[id])
		}
		answered += int64(len(u))
		failed += unavailable[id]
	}
	if answered == 0 {
		t.Error("no call was answered")
	}
	if maxRetries < 0 && failed == 0 {
		t.Error("no call failed: no kill hit a pipeline in flight")
	}
	t.Logf("%d connections killed; %d calls answered, %d ErrUnavailable", kills.Load(), answered, failed)
}

// TestManyIDsPipelined checks exact counts over many ids at once (every
// caller's own Result, as if alone) with pipelines of several ids.
func TestManyIDsPipelined(t *testing.T) {
	t.Parallel()
	testManyIDs(t, redisstore.New(client(t)))
}

func testManyIDs(t *testing.T, s driver.Store) {
	t.Helper()
	l := countlimit.New(s)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: storetest.UseType(t, "many"), Limit: 10, Window: countlimit.Rolling(time.Hour)}
	const ids, callers, each = 32, 64, 8 // 512 calls: 16 per id, 10 allowed
	var (
		mu   sync.Mutex
		used = map[string][]int64{}
		wg   sync.WaitGroup
	)
	for i := range callers {
		wg.Go(func() {
			for n := range each {
				id := fmt.Sprintf("id%d", (i*each+n)%ids)
				res, err := l.Allow(ctx, rule, id)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					mu.Lock()
					used[id] = append(used[id], res.Used)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for i := range ids {
		id := fmt.Sprintf("id%d", i)
		u := used[id]
		slices.Sort(u)
		if !slices.Equal(u, []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
			t.Errorf("%s: allowed with Used %v, want 1..10 each once", id, u)
		}
	}
}

// refuseHook answers every script of several calls with CROSSSLOT, as a
// Cluster node (or a proxy that checks slots) does, without sending it.
type refuseHook struct{ refused atomic.Int32 }

type slotError struct{}

func (slotError) Error() string { return "CROSSSLOT Keys in request don't hash to the same slot" }
func (slotError) RedisError()   {}

func (h *refuseHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refuseHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if callsIn(cmd) > 1 {
			h.refused.Add(1)
			cmd.SetErr(slotError{})
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}
func (h *refuseHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var send []redis.Cmder
		for _, cmd := range cmds {
			if callsIn(cmd) > 1 {
				h.refused.Add(1)
				cmd.SetErr(slotError{})
				continue
			}
			send = append(send, cmd)
		}
		if len(send) == 0 {
			return nil
		}
		return next(ctx, send)
	}
}

// TestRefusedCombinedScript: a server that refuses a script whose keys
// span slots (CROSSSLOT) refuses the combined script once; its calls go
// again, each its own script, and count once each, and the Store sends
// every later call as a script of its own.
func TestRefusedCombinedScript(t *testing.T) {
	t.Parallel()
	c := client(t)
	refuse := &refuseHook{}
	c.AddHook(refuse)
	h, s, l := oneSlot(c)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: storetest.UseType(t, "refused"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	ids := []string{"a", "b", "c", "d"}
	for round := int64(1); round <= 2; round++ {
		results := make([]countlimit.Result, len(ids))
		calls := make([]func() error, len(ids))
		for i, id := range ids {
			calls[i] = func() (err error) { results[i], err = l.Allow(ctx, rule, id); return err }
		}
		errs := gathered(t, s, h, func() error { _, err := l.Allow(ctx, rule, "first"); return err }, calls...)
		for i, id := range ids {
			if errs[i] != nil || !results[i].Allowed || results[i].Used != round {
				t.Errorf("round %d: Allow(%q) = %+v, %v; want allowed, Used %d", round, id, results[i], errs[i], round)
			}
		}
	}
	if n := refuse.refused.Load(); n != 1 {
		t.Errorf("%d combined scripts refused, want 1: the first refusal turns combining off", n)
	}
	for _, id := range ids {
		if n, err := c.HGet(ctx, redisstore.Key(rule.UseType, id), "c").Int64(); err != nil || n != 2 {
			t.Errorf("stored count of %q: %d, %v; want 2", id, n, err)
		}
	}
}

// TestCombinedScriptsAreBounded gathers five Allows into one pipeline on a
// Store whose combined scripts carry at most two calls, or about 3000
// bytes of keys and arguments (two calls of 500-byte ids): the pipeline
// carries three scripts, of two, two and one calls, and every call counts
// once, from its own count.
func TestCombinedScriptsAreBounded(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 500)
	for _, tc := range []struct {
		name string
		opt  redisstore.Option
		id   string
	}{
		{"calls", redisstore.WithMaxScript(2, 0), ""},
		{"bytes", redisstore.WithMaxScript(0, 3000), long},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := client(t)
			h, s, l := oneSlot(c, tc.opt)
			ctx := context.Background()
			rule := countlimit.Rule{UseType: storetest.UseType(t, "bounded"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
			ids := []string{"a", "b", "c", "d", "e"}
			before := map[string]int64{"b": 1, "c": 2, "d": 3, "e": 4}
			for id, n := range before {
				if _, err := l.AllowN(ctx, rule, tc.id+id, n); err != nil {
					t.Fatal(err)
				}
			}
			results := make([]countlimit.Result, len(ids))
			calls := make([]func() error, len(ids))
			for i, id := range ids {
				calls[i] = func() (err error) { results[i], err = l.Allow(ctx, rule, tc.id+id); return err }
			}
			errs := gathered(t, s, h, func() error { _, err := l.Allow(ctx, rule, "first"); return err }, calls...)
			h.mu.Lock()
			if want := [][]string{{"evalsha", "evalsha", "evalsha"}}; !slices.Equal(h.sizes, []int{len(ids)}) || !slices.EqualFunc(h.names, want, slices.Equal) {
				t.Errorf("round trips of %v calls (%v) sent, want one of %d (%v)", h.sizes, h.names, len(ids), want)
			}
			h.mu.Unlock()
			for i, id := range ids {
				if want := before[id] + 1; errs[i] != nil || !results[i].Allowed || results[i].Used != want {
					t.Errorf("Allow(%q) = %+v, %v; want allowed, Used %d", id, results[i], errs[i], want)
				}
			}
		})
	}
}
