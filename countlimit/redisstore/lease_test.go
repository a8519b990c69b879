package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

func TestLeaseKeyBesideTheCounter(t *testing.T) {
	for _, tc := range []struct {
		ut   countlimit.UseType
		id   string
		want string
	}{
		{"export", "user-1", "countlimit:export:{user-1}:lease"},
		{"a:b", "{c}", "countlimit:a%3Ab:{%7Bc%7D}:lease"},
	} {
		if got := redisstore.LeaseKey(tc.ut, tc.id); got != tc.want {
			t.Errorf("LeaseKey(%q, %q) = %q, want %q", tc.ut, tc.id, got, tc.want)
		}
	}
}

// TestLeaseOnAKeyNoScriptWrote holds lease.lua to failing alone on a
// counter key that holds what no script writes (a string that is not a
// smooth key's, as a hand edit leaves): Peek and Acquire fail with
// WRONGTYPE, as every script does on such a key, and neither the key nor
// the lease set is written.
func TestLeaseOnAKeyNoScriptWrote(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	slots := countlimit.Rule{UseType: storetest.UseType(t, "lease.wrongtype"), Limit: 2, Window: countlimit.Concurrent(time.Minute), Block: time.Minute}
	key := redisstore.Key(slots.UseType, "bad")
	if err := c.Set(ctx, key, "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Peek(ctx, slots, "bad"); !errors.Is(err, countlimit.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Peek on a string key: %v; want ErrUnavailable with WRONGTYPE", err)
	}
	if _, _, err := l.Acquire(ctx, slots, "bad"); !errors.Is(err, countlimit.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Acquire on a string key: %v; want ErrUnavailable with WRONGTYPE", err)
	}
	if v, err := c.Get(ctx, key).Result(); err != nil || v != "not a hash" {
		t.Errorf("the key holds %q, %v; want it untouched", v, err)
	}
	if n, err := c.Exists(ctx, redisstore.LeaseKey(slots.UseType, "bad")).Result(); err != nil || n != 0 {
		t.Errorf("the lease set exists (%d, %v); want none written", n, err)
	}
}

// TestLeaseRetryAfterLostReply loses the reply of each lease operation
// after Redis ran it; go-redis sends it again. With one slot, a repeated
// Acquire that took a second slot, or found the slot taken, would be
// denied: it must find its own token and answer allowed.
func TestLeaseRetryAfterLostReply(t *testing.T) {
	t.Parallel()
	direct := client(t)
	proxy := newDropProxy(t, direct.Options().Addr)
	opts := *direct.Options()
	opts.Addr = proxy.addr()
	opts.PoolSize = 1
	viaProxy := redis.NewClient(&opts)
	t.Cleanup(func() { viaProxy.Close() })

	ctx := context.Background()
	l := countlimit.New(redisstore.New(viaProxy))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "lease.retry"), Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	// Load lease.lua and open the pooled connection.
	if _, err := l.Peek(ctx, rule, "warm"); err != nil {
		t.Fatal(err)
	}
	// Replies are kept per id: an id of its own, apart from other tests.
	id := string(storetest.UseType(t, "id"))
	lost := func(what string, call func() error) {
		t.Helper()
		drops := proxy.drops()
		proxy.arm("evalsha", nil)
		if err := call(); err != nil {
			t.Fatalf("%s after a lost reply: %v", what, err)
		}
		if n := proxy.drops() - drops; n != 1 {
			t.Fatalf("%s: the proxy lost %d replies, want 1", what, n)
		}
	}
	held := func(what string, want int64) {
		t.Helper()
		n, err := direct.ZCard(ctx, redisstore.LeaseKey(rule.UseType, id)).Result()
		if err != nil || n != want {
			t.Errorf("%s: the lease set holds %d (%v), want %d", what, n, err, want)
		}
	}

	var lease countlimit.Lease
	lost("Acquire", func() error {
		var r countlimit.Result
		var err error
		lease, r, err = l.Acquire(ctx, rule, id)
		if err == nil && (!r.Allowed || r.Used != 1) {
			t.Errorf("Acquire after a lost reply = %+v, want allowed with 1 slot held", r)
		}
		return err
	})
	held("after Acquire", 1)
	if n, err := direct.Exists(ctx, redisstore.Key(rule.UseType, id)).Result(); err != nil || n != 0 {
		t.Errorf("after an allowed Acquire the counter hash exists (%d, %v): a denial was counted", n, err)
	}
	lost("Extend", func() error { return lease.Extend(ctx) })
	held("after Extend", 1)
	lost("Release", func() error { return lease.Release(ctx) })
	held("after Release", 0)
	// Lease operations keep no replies.
	if keys, err := direct.Keys(ctx, "countlimit:{"+id+"}:reply:*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("reply keys %v (%v), want none", keys, err)
	}
}

// TestLeaseKeysExpire uses real time: the lease set expires with its latest
// lease, and a denial keeps the counter hash as long as its penalty, gives
// a lifetime count no TTL, and never shortens a TTL.
func TestLeaseKeysExpire(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	ut := storetest.UseType(t, "lease.ttl")
	slots := countlimit.Rule{UseType: ut, Limit: 1, Window: countlimit.Concurrent(time.Second), Block: 2 * time.Second}
	pttl := func(key string) time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	acquire := func(r countlimit.Rule, id string, want bool) countlimit.Lease {
		t.Helper()
		lease, res, err := l.Acquire(ctx, r, id)
		if err != nil || res.Allowed != want {
			t.Fatalf("Acquire(%s, %s) = %+v, %v; want Allowed %v", r.UseType, id, res, err, want)
		}
		return lease
	}

	// An abandoned lease: its set expires with it.
	acquire(slots, "a", true)
	// Every TTL carries the grace (see TestClockBehindRedisKeepsCounts).
	const grace = redisstore.ExpiryGrace
	if d := pttl(redisstore.LeaseKey(ut, "a")); d <= 0 || d > time.Second+grace {
		t.Errorf("lease set TTL %v, want in (0, 1s + %v]", d, grace)
	}
	// A denial: the tally and the penalty, for as long as the penalty.
	acquire(slots, "a", false)
	h := redisstore.Key(ut, "a")
	if d := pttl(h); d <= time.Second+grace || d > 2*time.Second+grace {
		t.Errorf("counter hash TTL %v after a denial with a 2s penalty, want in (1s, 2s] + %v", d, grace)
	}
	if f, err := c.HMGet(ctx, h, "d", "x", "c", "b").Result(); err != nil || f[0] != "1" || f[1] == nil || f[2] != nil || f[3] != nil {
		t.Errorf("counter hash after a denial: d, x, c, b = %v (%v); want 1, set, absent, absent", f, err)
	}

	// A released lease takes its set with it.
	lease := acquire(slots, "b", true)
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, redisstore.LeaseKey(ut, "b")).Result(); err != nil || n != 0 {
		t.Errorf("after the only lease was released its set exists (%d, %v)", n, err)
	}

	// A lifetime count keeps no TTL through a lease denial.
	none := countlimit.Rule{UseType: ut, Limit: 0, Window: countlimit.Concurrent(time.Second), Block: time.Second}
	if _, err := l.Allow(ctx, countlimit.Rule{UseType: ut, Limit: 1, Window: countlimit.Lifetime()}, "c"); err != nil {
		t.Fatal(err)
	}
	acquire(none, "c", false)
	if d := pttl(redisstore.Key(ut, "c")); d != -1 {
		t.Errorf("lifetime counter TTL %v after a lease denial, want none", d)
	}
	// A window longer than the penalty keeps its TTL.
	if _, err := l.Allow(ctx, countlimit.Rule{UseType: ut, Limit: 1, Window: countlimit.Rolling(time.Minute)}, "d"); err != nil {
		t.Fatal(err)
	}
	acquire(none, "d", false)
	if d := pttl(redisstore.Key(ut, "d")); d <= 50*time.Second {
		t.Errorf("counter TTL %v after a lease denial with a 1s penalty, want the window's minute", d)
	}

	time.Sleep(1200*time.Millisecond + grace)
	if n, err := c.Exists(ctx, redisstore.LeaseKey(ut, "a")).Result(); err != nil || n != 0 {
		t.Errorf("1.2s and the grace after a 1s lease its set exists (%d, %v)", n, err)
	}
}

func TestLeaseOneScriptPerOperation(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	l := countlimit.New(redisstore.New(c))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "lease.one"), Limit: 2, Window: countlimit.Concurrent(time.Minute)}
	// After a SCRIPT FLUSH the first call meets NOSCRIPT and is sent again with EVAL.
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Peek(ctx, rule, "warm"); err != nil {
		t.Fatalf("Peek after SCRIPT FLUSH: %v", err)
	}
	h := &scriptCounter{}
	c.AddHook(h)
	var lease countlimit.Lease
	for _, step := range []struct {
		name string
		call func() error
	}{
		{"Acquire", func() (err error) { lease, _, err = l.Acquire(ctx, rule, "id"); return err }},
		{"Peek", func() error { _, err := l.Peek(ctx, rule, "id"); return err }},
		{"Extend", func() error { return lease.Extend(ctx) }},
		{"Release", func() error { return lease.Release(ctx) }},
		{"Extend released", func() error {
			switch err := lease.Extend(ctx); {
			case err == nil:
				return errors.New("succeeded, want ErrLeaseExpired")
			case errors.Is(err, countlimit.ErrLeaseExpired):
				return nil
			default:
				return err
			}
		}},
	} {
		h.mu.Lock()
		h.cmds = nil
		h.mu.Unlock()
		if err := step.call(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		h.mu.Lock()
		if len(h.cmds) != 1 || h.cmds[0] != "evalsha" {
			t.Errorf("%s sent %v, want one evalsha", step.name, h.cmds)
		}
		h.mu.Unlock()
	}
}
