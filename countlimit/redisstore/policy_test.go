package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/store/redisurl"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisproxy"
)

// proxied returns a client on the test Redis through a proxy that answers
// CONFIG with answer, and the proxy.
func proxied(t *testing.T, answer redisproxy.Answer, tune ...func(*redis.Options)) (*redis.Client, *redisproxy.Proxy) {
	t.Helper()
	p := redisproxy.Start(t, testbackend.RedisURL(t), answer)
	c, err := redisurl.Open(p.URL(), tune...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, p
}

func policy(p string) redisproxy.Answer {
	return redisproxy.ConfigGet(map[string]string{"maxmemory-policy": p})
}

// TestCheckEviction: noeviction passes; every other policy is an error
// naming maxmemory-policy and the policy, wrapping ErrEvictionPolicy and
// ErrUnavailable; a server that will not say is ErrPolicyUnknown, which is
// not ErrUnavailable (the store works); a server that is loading is
// ErrUnavailable.
func TestCheckEviction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("the test server", func(t *testing.T) {
		if err := redisstore.New(client(t)).CheckEviction(ctx); err != nil {
			t.Errorf("CheckEviction on the test Redis = %v, want nil: run it with maxmemory-policy noeviction", err)
		}
	})
	tests := []struct {
		name    string
		answer  redisproxy.Answer
		evicts  bool
		unknown bool
		down    bool
	}{
		{name: "noeviction", answer: policy("noeviction")},
		{name: "allkeys-lru", answer: policy("allkeys-lru"), evicts: true},
		{name: "allkeys-lfu", answer: policy("allkeys-lfu"), evicts: true},
		{name: "allkeys-random", answer: policy("allkeys-random"), evicts: true},
		{name: "volatile-lru", answer: policy("volatile-lru"), evicts: true},
		{name: "volatile-lfu", answer: policy("volatile-lfu"), evicts: true},
		{name: "volatile-random", answer: policy("volatile-random"), evicts: true},
		{name: "volatile-ttl", answer: policy("volatile-ttl"), evicts: true},
		{name: "a policy of tomorrow", answer: policy("allkeys-newest"), evicts: true},
		{name: "unknown command", answer: redisproxy.RefuseConfig("ERR unknown command 'CONFIG', with args beginning with: 'GET' 'maxmemory-policy'"), unknown: true},
		{name: "no permission", answer: redisproxy.RefuseConfig("NOPERM User app has no permissions to run the 'config|get' command"), unknown: true},
		{name: "no such parameter", answer: redisproxy.ConfigGet(nil), unknown: true},
		{name: "loading", answer: redisproxy.RefuseConfig("LOADING Redis is loading the dataset in memory"), down: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, _ := proxied(t, tc.answer)
			s := redisstore.New(c)
			err := s.CheckEviction(ctx)
			switch {
			case tc.evicts:
				if !errors.Is(err, redisstore.ErrEvictionPolicy) || !errors.Is(err, countlimit.ErrUnavailable) {
					t.Fatalf("CheckEviction = %v, want ErrEvictionPolicy and ErrUnavailable", err)
				}
				p := tc.name
				if p == "a policy of tomorrow" {
					p = "allkeys-newest"
				}
				if !strings.Contains(err.Error(), "maxmemory-policy") || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "noeviction") {
					t.Errorf("CheckEviction = %q: want it to name maxmemory-policy, %s and noeviction", err, p)
				}
			case tc.unknown:
				if !errors.Is(err, redisstore.ErrPolicyUnknown) || errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, redisstore.ErrEvictionPolicy) {
					t.Errorf("CheckEviction = %v, want ErrPolicyUnknown alone", err)
				}
			case tc.down:
				if !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, redisstore.ErrPolicyUnknown) || errors.Is(err, redisstore.ErrEvictionPolicy) {
					t.Errorf("CheckEviction = %v, want ErrUnavailable alone", err)
				}
			default:
				if err != nil {
					t.Errorf("CheckEviction = %v, want nil", err)
				}
			}
			// The policy is reported, not enforced: checks go on.
			l := countlimit.New(s)
			rule := countlimit.Rule{UseType: storetest.UseType(t, "policy"), Limit: 1, Window: countlimit.Fixed(time.Hour)}
			if r, err := l.Allow(ctx, rule, "policy-"+tc.name); err != nil || !r.Allowed {
				t.Errorf("Allow = %+v, %v; want allowed", r, err)
			}
		})
	}
	t.Run("a Ring asks every shard", func(t *testing.T) {
		t.Parallel()
		addrs := map[string]string{}
		for i, a := range []redisproxy.Answer{policy("noeviction"), policy("allkeys-lfu")} {
			_, p := proxied(t, a)
			addrs[string(rune('a'+i))] = p.Addr()
		}
		opts := client(t).Options()
		ring := redis.NewRing(&redis.RingOptions{Addrs: addrs, DB: opts.DB, Username: opts.Username, Password: opts.Password})
		defer ring.Close()
		if err := redisstore.New(ring).CheckEviction(ctx); !errors.Is(err, redisstore.ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lfu") {
			t.Errorf("CheckEviction on a Ring with one shard on allkeys-lfu = %v, want ErrEvictionPolicy naming it", err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
		defer c.Close()
		if err := redisstore.New(c).CheckEviction(ctx); !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, redisstore.ErrPolicyUnknown) {
			t.Errorf("CheckEviction with no server = %v, want ErrUnavailable alone", err)
		}
	})
}

// TestCheckEvictionAsksOncePerInterval: calls within PolicyCheckInterval
// share one CONFIG GET, a refusal included; a server that did not answer
// is asked again at once.
func TestCheckEvictionAsksOncePerInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var answer atomic.Value // of redisproxy.Answer
	answer.Store(policy("allkeys-lru"))
	noRetries := func(o *redis.Options) { o.MaxRetries = -1 } // go-redis retries LOADING
	c, p := proxied(t, func(cmd []string) (string, bool) { return answer.Load().(redisproxy.Answer)(cmd) }, noRetries)
	s := redisstore.New(c)
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	redisstore.SetPolicyClock(s, func() time.Time { return now })
	steps := []struct {
		name   string
		then   func()
		calls  int
		check  func(error) bool
		config int // CONFIG GETs the proxy has seen after the step
	}{
		{"first", nil, 10, evicts, 1},
		{"just before the interval ends", func() { now = now.Add(redisstore.PolicyCheckInterval - time.Nanosecond) }, 10, evicts, 1},
		{"policy fixed, not asked yet", func() { answer.Store(policy("noeviction")) }, 10, evicts, 1},
		{"the interval over", func() { now = now.Add(time.Nanosecond) }, 10, isNil, 2},
		{"refused after the interval", func() {
			answer.Store(redisproxy.RefuseConfig("ERR unknown command 'CONFIG'"))
			now = now.Add(redisstore.PolicyCheckInterval)
		}, 10, unknown, 3},
		{"loading after the interval", func() {
			answer.Store(redisproxy.RefuseConfig("LOADING Redis is loading the dataset in memory"))
			now = now.Add(redisstore.PolicyCheckInterval)
		}, 3, down, 6},
		{"loaded", func() { answer.Store(policy("volatile-ttl")) }, 10, evicts, 7},
	}
	for i, st := range steps {
		if st.then != nil {
			st.then()
		}
		for range st.calls {
			if err := s.CheckEviction(ctx); !st.check(err) {
				t.Fatalf("step %d (%s): CheckEviction = %v", i, st.name, err)
			}
		}
		if got := p.Count("config get"); got != st.config {
			t.Fatalf("step %d (%s): %d CONFIG GETs, want %d", i, st.name, got, st.config)
		}
	}
}

func persistence(appendonly, save string) redisproxy.Answer {
	return redisproxy.ConfigGet(map[string]string{"appendonly": appendonly, "save": save})
}

// TestCheckPersistence: a server with appendonly no and no save schedule
// is ErrNoPersistence, which is neither ErrUnavailable nor
// ErrPolicyUnknown (the store works); AOF or a schedule is nil; a server
// that will not say is ErrPolicyUnknown; a loading one ErrUnavailable.
// Real servers of each kind are in TestRestart.
func TestCheckPersistence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name    string
		answer  redisproxy.Answer
		none    bool
		unknown bool
		down    bool
	}{
		{name: "neither AOF nor snapshots", answer: persistence("no", ""), none: true},
		{name: "AOF", answer: persistence("yes", "")},
		{name: "snapshots", answer: persistence("no", "3600 1 300 100 60 10000")},
		{name: "both", answer: persistence("yes", "3600 1")},
		{name: "unknown command", answer: redisproxy.RefuseConfig("ERR unknown command 'CONFIG', with args beginning with: 'GET' 'appendonly'"), unknown: true},
		{name: "no permission", answer: redisproxy.RefuseConfig("NOPERM User app has no permissions to run the 'config|get' command"), unknown: true},
		{name: "no such parameter", answer: redisproxy.ConfigGet(nil), unknown: true},
		{name: "no save parameter", answer: redisproxy.ConfigGet(map[string]string{"appendonly": "no"}), unknown: true},
		{name: "an appendonly of tomorrow", answer: persistence("maybe", ""), unknown: true},
		{name: "loading", answer: redisproxy.RefuseConfig("LOADING Redis is loading the dataset in memory"), down: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, p := proxied(t, tc.answer, func(o *redis.Options) { o.MaxRetries = -1 })
			s := redisstore.New(c)
			err := s.CheckPersistence(ctx)
			switch {
			case tc.none:
				if err != redisstore.ErrNoPersistence || errors.Is(err, countlimit.ErrUnavailable) {
					t.Fatalf("CheckPersistence = %v, want ErrNoPersistence alone", err)
				}
				for _, want := range []string{"appendonly", "save", "restart"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("CheckPersistence = %q: want it to name %q", err, want)
					}
				}
				if strings.Contains(err.Error(), "127.0.0.1") {
					t.Errorf("CheckPersistence = %q names an address", err)
				}
			case tc.unknown:
				if !errors.Is(err, redisstore.ErrPolicyUnknown) || errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, redisstore.ErrNoPersistence) {
					t.Errorf("CheckPersistence = %v, want ErrPolicyUnknown alone", err)
				}
			case tc.down:
				if !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, redisstore.ErrPolicyUnknown) || errors.Is(err, redisstore.ErrNoPersistence) {
					t.Errorf("CheckPersistence = %v, want ErrUnavailable alone", err)
				}
			default:
				if err != nil {
					t.Errorf("CheckPersistence = %v, want nil", err)
				}
			}
			// AOF on answers without asking for the schedule.
			if tc.name == "AOF" || tc.name == "both" {
				if n := p.Count("config get"); n != 1 {
					t.Errorf("%d CONFIG GETs with AOF on, want 1 (appendonly alone)", n)
				}
			}
			// Persistence is reported, not enforced: checks go on.
			rule := countlimit.Rule{UseType: storetest.UseType(t, "persistence"), Limit: 1, Window: countlimit.Fixed(time.Hour)}
			if r, err := countlimit.New(s).Allow(ctx, rule, "persistence-"+tc.name); err != nil || !r.Allowed {
				t.Errorf("Allow = %+v, %v; want allowed", r, err)
			}
		})
	}
	t.Run("a Ring asks every shard", func(t *testing.T) {
		t.Parallel()
		addrs := map[string]string{}
		for i, a := range []redisproxy.Answer{persistence("yes", ""), persistence("no", "")} {
			_, p := proxied(t, a)
			addrs[string(rune('a'+i))] = p.Addr()
		}
		opts := client(t).Options()
		ring := redis.NewRing(&redis.RingOptions{Addrs: addrs, DB: opts.DB, Username: opts.Username, Password: opts.Password})
		defer ring.Close()
		if err := redisstore.New(ring).CheckPersistence(ctx); !errors.Is(err, redisstore.ErrNoPersistence) {
			t.Errorf("CheckPersistence on a Ring with one shard persisting nothing = %v, want ErrNoPersistence", err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1})
		defer c.Close()
		if err := redisstore.New(c).CheckPersistence(ctx); !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, redisstore.ErrPolicyUnknown) {
			t.Errorf("CheckPersistence with no server = %v, want ErrUnavailable alone", err)
		}
	})
}

// TestChecksKeepTheirOwnAnswers: CheckEviction and CheckPersistence each
// keep their answer for PolicyCheckInterval, apart: asking one neither
// asks nor answers for the other.
func TestChecksKeepTheirOwnAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, p := proxied(t, redisproxy.ConfigGet(map[string]string{"maxmemory-policy": "allkeys-lru", "appendonly": "no", "save": ""}))
	s := redisstore.New(c)
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	redisstore.SetPolicyClock(s, func() time.Time { return now })
	for i := range 3 {
		if err := s.CheckEviction(ctx); !evicts(err) {
			t.Fatalf("call %d: CheckEviction = %v, want ErrEvictionPolicy", i, err)
		}
		if err := s.CheckPersistence(ctx); err != redisstore.ErrNoPersistence {
			t.Fatalf("call %d: CheckPersistence = %v, want ErrNoPersistence", i, err)
		}
	}
	// One for the policy, two for persistence (appendonly, then save).
	if n := p.Count("config get"); n != 3 {
		t.Errorf("%d CONFIG GETs for three calls of each, want 3", n)
	}
	now = now.Add(redisstore.PolicyCheckInterval)
	if err := s.CheckPersistence(ctx); err != redisstore.ErrNoPersistence {
		t.Fatalf("after the interval: CheckPersistence = %v, want ErrNoPersistence", err)
	}
	if n := p.Count("config get"); n != 5 {
		t.Errorf("%d CONFIG GETs after asking persistence again, want 5", n)
	}
}

func evicts(err error) bool  { return errors.Is(err, redisstore.ErrEvictionPolicy) }
func isNil(err error) bool   { return err == nil }
func unknown(err error) bool { return errors.Is(err, redisstore.ErrPolicyUnknown) }
func down(err error) bool {
	return errors.Is(err, countlimit.ErrUnavailable) && !errors.Is(err, redisstore.ErrEvictionPolicy)
}
