package redisstore_test

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/store/redisurl"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// ExampleNew needs Redis: where there is none (and none is required) the
// examples are left out, as the tests skip.
func TestMain(m *testing.M) { testenv.MainNeeding(m, "Redis", testenv.FindRedis) }

var unguarded = flag.Bool("unguarded", false, "turn the lost-reply records off: the retry and CLIENT KILL tests should fail")

// guarded returns the options of the retry and CLIENT KILL tests' Stores:
// with -unguarded, the lost-reply records off.
func guarded() []redisstore.Option {
	if *unguarded {
		return []redisstore.Option{redisstore.WithUnguarded()}
	}
	return nil
}

// client returns a new client on the test Redis, closed when t ends.
func client(t testing.TB) *redis.Client {
	t.Helper()
	c, err := redisurl.Open(testbackend.RedisURL(t))
	if err != nil {
		t.Fatalf("%s: %v", testbackend.EnvRedis, err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", c.Options().Addr, err)
	}
	return c
}

func TestConformance(t *testing.T) {
	clients := []*redis.Client{client(t), client(t)}
	// Two clients (two connection pools) on one server, per subtest.
	next := testbackend.Alternate(clients...)
	storetest.Run(t, func(t *testing.T) driver.Store { return redisstore.New(next(t)) })
}

func TestKeysAreEscapedAndShareTheIDsSlot(t *testing.T) {
	for _, tc := range []struct {
		ut   countlimit.UseType
		id   string
		want string
	}{
		{"sms.code", "18500000000", "countlimit:sms.code:{18500000000}"},
		{"a:b", "c", "countlimit:a%3Ab:{c}"},
		{"a", "b:c", "countlimit:a:{b%3Ac}"},
		{"x", "{evil}", "countlimit:x:{%7Bevil%7D}"},
		{"x", "50%", "countlimit:x:{50%25}"},
		{"x", "50%25", "countlimit:x:{50%2525}"},
	} {
		if got := redisstore.Key(tc.ut, tc.id); got != tc.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tc.ut, tc.id, got, tc.want)
		}
	}
	// Every key of one id carries the same hash tag: the escaped id.
	for _, ut := range []countlimit.UseType{"a", "b:c", "{d}"} {
		k := redisstore.Key(ut, "u}1")
		if tag := k[strings.Index(k, "{")+1 : strings.Index(k, "}")]; tag != "u%7D1" {
			t.Errorf("Key(%q, \"u}1\") = %q has hash tag %q", ut, k, tag)
		}
	}
}

func TestScriptsSurviveScriptFlush(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "flush"), Limit: 2, Window: countlimit.Fixed(time.Hour)}
	if r, err := l.Allow(ctx, rule, "id"); err != nil || !r.Allowed {
		t.Fatalf("Allow: %+v, %v", r, err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx, rule, "id"); err != nil || r.Used != 2 {
		t.Fatalf("Allow after SCRIPT FLUSH: %+v, %v; want Used 2", r, err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(ctx, rule, "id"); err != nil {
		t.Fatalf("Reset after SCRIPT FLUSH: %v", err)
	}
}

// TestKeysExpire uses real time: once a window and its penalty are over,
// the keys are gone, and no update ever leaves a key without a TTL.
func TestKeysExpire(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "ttl.fixed"), Limit: 3, Window: countlimit.Rolling(time.Second)}
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "ttl.sliding"), Limit: 2, Window: countlimit.Sliding(time.Second)}
	penalty := countlimit.Rule{UseType: storetest.UseType(t, "ttl.penalty"), Limit: 1, Window: countlimit.Rolling(500 * time.Millisecond), Block: 2 * time.Second}
	lifetime := countlimit.Rule{UseType: storetest.UseType(t, "ttl.lifetime"), Limit: 1, Window: countlimit.Lifetime()}
	keys := func(r countlimit.Rule) []string {
		return []string{redisstore.Key(r.UseType, "id"), redisstore.LogKey(r.UseType, "id")}
	}
	checkTTL := func(step string, r countlimit.Rule, max time.Duration) {
		t.Helper()
		for _, k := range keys(r) {
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case ttl == -2*time.Nanosecond: // no such key (go-redis reports -2 as a Duration)
			case ttl < 0:
				t.Errorf("%s: %s has no TTL (%v)", step, k, ttl)
			case ttl > max+redisstore.ExpiryGrace:
				t.Errorf("%s: %s TTL %v, want at most %v and the grace", step, k, ttl, max)
			}
		}
	}
	for i := range 5 {
		for _, r := range []countlimit.Rule{fixed, sliding, penalty} {
			if _, err := l.Allow(ctx, r, "id"); err != nil {
				t.Fatal(err)
			}
			limit := time.Second
			if r.Block > 0 {
				limit = r.Block
			}
			checkTTL(string(r.UseType)+" call "+string(rune('1'+i)), r, limit)
		}
		if _, err := l.Refund(ctx, sliding, "id", 1); err != nil {
			t.Fatal(err)
		}
		checkTTL("after refund", sliding, time.Second)
	}
	if _, err := l.Allow(ctx, lifetime, "id"); err != nil {
		t.Fatal(err)
	}
	exists := func(r countlimit.Rule) int64 {
		n, err := c.Exists(ctx, keys(r)...).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Every key outlives its end by the grace (see
	// TestClockBehindRedisKeepsCounts).
	time.Sleep(1500*time.Millisecond + redisstore.ExpiryGrace)
	if n := exists(fixed); n != 0 {
		t.Errorf("1.5s after a 1s window: %d keys remain", n)
	}
	if n := exists(sliding); n != 0 {
		t.Errorf("1.5s after the last event of a 1s sliding window: %d keys remain", n)
	}
	if n := exists(penalty); n != 1 {
		t.Errorf("inside a 2s penalty: %d keys remain, want the counter", n)
	}
	time.Sleep(1000 * time.Millisecond)
	if n := exists(penalty); n != 0 {
		t.Errorf("after the penalty: %d keys remain", n)
	}
	if n := exists(lifetime); n != 1 {
		t.Errorf("lifetime counter: %d keys, want 1", n)
	}
}

// scriptCounter counts the commands a client sends.
type scriptCounter struct {
	mu   sync.Mutex
	cmds []string
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.cmds = append(h.cmds, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestOneScriptPerOperation(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "one"), Limit: 3, Window: countlimit.Sliding(time.Minute)}
	other := countlimit.Rule{UseType: storetest.UseType(t, "one.other"), Limit: 3, Window: countlimit.Fixed(time.Minute)}
	// Load the scripts first (apply.lua, fast.lua for the Allow of one
	// rule that is not sliding, reset.lua): the very first call may add an
	// EVAL after NOSCRIPT.
	if _, err := l.AllowAll(ctx, "warm", rule, other); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, other, "warm"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(ctx, rule, "warm"); err != nil {
		t.Fatal(err)
	}
	h := &scriptCounter{}
	c.AddHook(h)
	calls := map[string]func() error{
		"Allow":      func() error { _, err := l.Allow(ctx, rule, "id"); return err },
		"AllowN":     func() error { _, err := l.AllowN(ctx, rule, "id", 2); return err },
		"AllowAll":   func() error { _, err := l.AllowAll(ctx, "id", rule, other); return err },
		"Peek":       func() error { _, err := l.Peek(ctx, rule, "id"); return err },
		"Refund":     func() error { _, err := l.Refund(ctx, rule, "id", 1); return err },
		"AllowFixed": func() error { _, err := l.Allow(ctx, other, "id"); return err },
		"CheckLimit": func() error { _, err := l.CheckLimit(ctx, other.UseType, "id", 1, time.Hour, time.Time{}); return err },
		"Reset":      func() error { return l.Reset(ctx, rule, "id") },
	}
	for name, call := range calls {
		h.mu.Lock()
		h.cmds = nil
		h.mu.Unlock()
		if err := call(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		h.mu.Lock()
		if len(h.cmds) != 1 || h.cmds[0] != "evalsha" {
			t.Errorf("%s sent %v, want one evalsha", name, h.cmds)
		}
		h.mu.Unlock()
	}
}

func TestUnreachable(t *testing.T) {
	silent, refused := testbackend.DeadAddrs(t)
	rule := countlimit.Rule{UseType: "down", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	for _, addr := range []string{silent, refused} {
		c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second, DialTimeout: 30 * time.Second, MaxRetries: -1,
			ContextTimeoutEnabled: true})
		l := countlimit.New(redisstore.New(c))
		const deadline = 300 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		res, err := l.Allow(ctx, rule, "id")
		elapsed := time.Since(start)
		cancel()
		c.Close()
		if !errors.Is(err, countlimit.ErrUnavailable) || res.Allowed {
			t.Errorf("%s: Allow = %+v, %v; want ErrUnavailable, not allowed", addr, res, err)
		}
		if elapsed > deadline+5*time.Second {
			t.Errorf("%s: returned after %v, long past the context deadline", addr, elapsed)
		}
	}
}

//go:embed testdata/incr.lua
var incrSrc string

// BenchmarkAllowVersusBareScript compares Allow with a bare EVALSHA of a
// minimal INCR+PEXPIRE script through the same client, at 1, 4, 16 and 64
// concurrent callers over 256 ids: the price of countlimit's semantics over
// the simplest counter, and what pipelining wins back. Each caller count
// runs the bare script first, then Allow (fixed window), then Allow
// (sliding window); the Allow rows report their throughput over the bare
// script's as x-bare.
func BenchmarkAllowVersusBareScript(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	rule := countlimit.Rule{UseType: storetest.UseType(b, "bench"), Limit: 1 << 50, Window: countlimit.Fixed(time.Hour)}
	sliding := rule
	sliding.UseType += ".sliding"
	sliding.Window = countlimit.Sliding(time.Second)
	sliding.Limit = expose.MaxSlidingLimit
	incr := redis.NewScript(incrSrc)
	if err := incr.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	bare := func(id string) error {
		return incr.EvalSha(ctx, c, []string{"countlimit-bench:" + id}, 3600000).Err()
	}
	for _, callers := range []int{1, 4, 16, 64} {
		var bareNs float64
		b.Run(fmt.Sprintf("callers=%d/bare_INCR+PEXPIRE", callers), func(b *testing.B) {
			bareNs = runCallers(b, callers, bare)
		})
		for _, r := range []struct {
			name string
			countlimit.Rule
		}{{"Allow_fixed", rule}, {"Allow_sliding", sliding}} {
			b.Run(fmt.Sprintf("callers=%d/%s", callers, r.name), func(b *testing.B) {
				ns := runCallers(b, callers, func(id string) error { _, err := l.Allow(ctx, r.Rule, id); return err })
				b.ReportMetric(bareNs/ns, "x-bare")
			})
		}
	}
}

// BenchmarkPipelinesInFlight measures Allow with 1, 2, 4 and 8 pipelines in
// flight at 1, 4, 16 and 64 callers: how WithMaxInFlight's default was
// chosen.
func BenchmarkPipelinesInFlight(b *testing.B) {
	c := client(b)
	ctx := context.Background()
	rule := countlimit.Rule{UseType: storetest.UseType(b, "bench.inflight"), Limit: 1 << 50, Window: countlimit.Fixed(time.Hour)}
	for _, callers := range []int{1, 4, 16, 64} {
		for _, n := range []int{1, 2, 4, 8} {
			l := countlimit.New(redisstore.New(c, redisstore.WithMaxInFlight(n)))
			b.Run(fmt.Sprintf("callers=%d/inflight=%d", callers, n), func(b *testing.B) {
				runCallers(b, callers, func(id string) error { _, err := l.Allow(ctx, rule, id); return err })
			})
		}
	}
}

var benchIDs = func() []string {
	ids := make([]string, 256)
	for i := range ids {
		ids[i] = "user-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	return ids
}()

// runCallers runs b.N calls of call from exactly callers goroutines, each
// on the next of 256 ids (runCallersOver benchIDs), and returns the wall
// time per call in ns. It reports calls/s.
func runCallers(b *testing.B, callers int, call func(id string) error) float64 {
	b.Helper()
	return runCallersOver(b, callers, benchIDs, call)
}

// TestSmoothKeysExpire: a Smooth rule's hash lives until the id is drained
// (its instant), or until its penalty ends if that is later, on the real
// clock: a count, a weighted count and a refund each set it so, and the
// hash is gone once both are over. Only upper bounds are checked, and
// absence after the longest of them: a slow machine can only make them
// truer.
func TestSmoothKeysExpire(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	// One every 100ms, bursts of 5.
	smooth := countlimit.Rule{UseType: storetest.UseType(t, "ttl.smooth"), Limit: 10, Window: countlimit.Smooth(time.Second, 5)}
	// One every 100ms, and a denial blocks for 800ms.
	penalty := countlimit.Rule{UseType: storetest.UseType(t, "ttl.smoothblock"), Limit: 1, Window: countlimit.Smooth(100*time.Millisecond, 1), Block: 800 * time.Millisecond}
	ttl := func(step string, r countlimit.Rule, atMost time.Duration) {
		t.Helper()
		d, err := c.PTTL(ctx, redisstore.Key(r.UseType, "id")).Result()
		switch {
		case err != nil:
			t.Fatal(err)
		case d == -1*time.Nanosecond:
			t.Errorf("%s: the hash has no TTL", step)
		case d > atMost+redisstore.ExpiryGrace:
			t.Errorf("%s: TTL %v, want at most %v and the grace", step, d, atMost)
		}
	}
	allow := func(r countlimit.Rule, n int64) countlimit.Result {
		t.Helper()
		res, err := l.AllowN(ctx, r, "id", n)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for range 3 {
		allow(smooth, 1)
	}
	ttl("3 counted", smooth, 300*time.Millisecond)
	allow(smooth, 2)
	ttl("5 counted", smooth, 500*time.Millisecond)
	if _, err := l.Refund(ctx, smooth, "id", 3); err != nil {
		t.Fatal(err)
	}
	ttl("3 refunded", smooth, 200*time.Millisecond)
	allow(penalty, 1)
	ttl("counted", penalty, 100*time.Millisecond)
	if res := allow(penalty, 1); res.Allowed {
		t.Fatalf("a second call within the interval: %+v, want denied", res)
	}
	ttl("denied, penalty", penalty, 800*time.Millisecond)
	time.Sleep(time.Second + redisstore.ExpiryGrace)
	for _, r := range []countlimit.Rule{smooth, penalty} {
		n, err := c.Exists(ctx, redisstore.Key(r.UseType, "id"), redisstore.LogKey(r.UseType, "id")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s: %d keys remain past drain, penalty and grace", r.UseType, n)
		}
	}
}

// TestClockBehindRedisKeepsCounts: a Limiter whose clock runs behind
// Redis's (a lagging host, or a clock read that waited behind a stall)
// still finds the key of a window its clock has not seen end, though
// Redis's clock is past that end: every TTL carries ExpiryGrace. Without
// it the key would be gone and the call would start the window over.
func TestClockBehindRedisKeepsCounts(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	// The window ends 500ms after the first call; the second call runs
	// 700ms after it on the real clock, when its own clock, 600ms behind,
	// reads 100ms after it: 400ms of slack for a stall either way.
	const window, wait, lag = 500 * time.Millisecond, 700 * time.Millisecond, 600 * time.Millisecond
	if lag >= redisstore.ExpiryGrace {
		t.Fatalf("a lag of %v is not covered by the grace of %v", lag, redisstore.ExpiryGrace)
	}
	first := countlimit.New(redisstore.New(c))
	behind := countlimit.New(redisstore.New(c), countlimit.WithClock(func() time.Time { return time.Now().Add(-lag) }))
	rules := []countlimit.Rule{
		{UseType: storetest.UseType(t, "behind.rolling"), Limit: 1, Window: countlimit.Rolling(window)},
		{UseType: storetest.UseType(t, "behind.sliding"), Limit: 1, Window: countlimit.Sliding(window)},
		{UseType: storetest.UseType(t, "behind.smooth"), Limit: 1, Window: countlimit.Smooth(window, 1)},
		// Nothing fits: the first call's denial earns the penalty.
		{UseType: storetest.UseType(t, "behind.penalty"), Limit: 0, Window: countlimit.Rolling(time.Hour), Block: window},
	}
	// Each rule alone on one id (fast.lua), all of them on another
	// (AllowAll: apply.lua): one allowed, one denied; the penalty's
	// first denial.
	blocked := map[string]time.Time{} // by id
	for _, r := range rules {
		for _, id := range []string{"one", "all"} {
			for call := range 2 {
				if r.Limit == 0 && call == 0 {
					continue
				}
				res, err := first.Allow(ctx, r, id)
				if err != nil || res.Allowed != (call == 0) {
					t.Fatalf("%s: call %d on %s: %+v, %v", r.UseType, call+1, id, res, err)
				}
				if r.Block > 0 {
					blocked[id] = res.BlockedUntil
				}
			}
		}
	}
	time.Sleep(wait)
	// Denied, and by what the first calls stored: the count, or the
	// penalty they set (a key gone, a new denial would set a later one).
	seen := func(r countlimit.Rule, id string, res countlimit.Result) bool {
		if r.Block > 0 {
			return res.BlockedUntil.Equal(blocked[id])
		}
		return res.Used == 1
	}
	for _, r := range rules {
		res, err := behind.Allow(ctx, r, "one")
		if err != nil || res.Allowed || !seen(r, "one", res) {
			t.Errorf("%s: a clock %v behind, inside the window it saw begin: %+v, %v; want a denial by what is stored", r.UseType, lag, res, err)
		}
	}
	res, err := behind.AllowAll(ctx, "all", rules...)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Allowed || !seen(rules[i], "all", r) {
			t.Errorf("AllowAll, %s: a clock %v behind: %+v; want a denial by what is stored", rules[i].UseType, lag, r)
		}
	}
}

// TestTestBuildsAreTheStoresOwn runs a Store whose scripts pad their TTLs
// and keep no lost-reply records (a test's build) beside a Store of the
// package's scripts, on one server, from many goroutines: each Store's
// keys are as its own scripts write them, whatever the other runs.
func TestTestBuildsAreTheStoresOwn(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	built := countlimit.New(redisstore.New(c))
	test := countlimit.New(redisstore.New(c, redisstore.WithPaddedTTLs(time.Hour), redisstore.WithUnguarded()))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "builds"), Limit: 1 << 20, Window: countlimit.Fixed(time.Minute)}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				l, id := built, "built"
				if (g+i)%2 == 1 {
					l, id = test, "test"
				}
				if _, err := l.Allow(ctx, rule, id); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, tc := range []struct {
		id       string
		record   bool
		min, max time.Duration
	}{
		{"built", true, 0, time.Minute + redisstore.ExpiryGrace},
		{"test", false, time.Hour, time.Hour + time.Minute + redisstore.ExpiryGrace},
	} {
		k := redisstore.Key(rule.UseType, tc.id)
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil || ttl <= tc.min || ttl > tc.max {
			t.Errorf("%s: PTTL %v, %v; want it in (%v, %v]", k, ttl, err, tc.min, tc.max)
		}
		n, err := c.HGet(ctx, k, "c").Int64()
		if err != nil || n != 320 {
			t.Errorf("%s: count %d, %v; want 320", k, n, err)
		}
		if has, err := c.HExists(ctx, k, "r").Result(); err != nil || has != tc.record {
			t.Errorf("%s: a lost-reply record (field r): %v, %v; want %v", k, has, err, tc.record)
		}
	}
}
