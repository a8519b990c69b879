//go:build unix

package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
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
	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisserver"
)

// sentinelName is the name the tests' Sentinels monitor their master by.
const sentinelName = "countlimit"

// sentinelSet is a private master, a replica of it and a Sentinel that
// monitors both.
type sentinelSet struct {
	master, replica, sentinel *redisserver.Server
	sc                        *redis.SentinelClient
}

// startSentinel starts a master, a replica of it and a Sentinel, and waits
// until the Sentinel could promote the replica: the replica is in sync, and
// the Sentinel knows it. Every process is killed when t ends.
func startSentinel(t *testing.T) *sentinelSet {
	t.Helper()
	ctx := context.Background()
	// Nothing persisted, as the project's test servers run, and a
	// replica's first sync at once: a diskless sync otherwise waits 5 s
	// for more replicas.
	settings := []string{"--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"}
	master := redisserver.Start(t, settings...)
	host, port, err := net.SplitHostPort(master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	replica := redisserver.Start(t, append(settings, "--replicaof", host, port)...)
	rc := replica.Client(t)
	testenv.WaitFor(t, 30*time.Second, "the replica's first sync", func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})

	// The failover is asked for (SENTINEL FAILOVER), never waited for: a
	// short down-after-milliseconds would only let a loaded machine's slow
	// PING start one that nobody asked for.
	sentinel := redisserver.StartSentinel(t, strings.Join([]string{
		fmt.Sprintf("sentinel monitor %s %s %s 1", sentinelName, host, port),
		fmt.Sprintf("sentinel down-after-milliseconds %s 10000", sentinelName),
		fmt.Sprintf("sentinel failover-timeout %s 30000", sentinelName),
	}, "\n"))
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr()})
	t.Cleanup(func() { sc.Close() })
	testenv.WaitFor(t, 30*time.Second, "the Sentinel to see the replica in sync", func() bool {
		rs, err := sc.Replicas(ctx, sentinelName).Result()
		return err == nil && slices.ContainsFunc(rs, func(r map[string]string) bool {
			return r["name"] == replica.Addr() && r["flags"] == "slave" && r["master-link-status"] == "ok"
		})
	})
	return &sentinelSet{master: master, replica: replica, sentinel: sentinel, sc: sc}
}

func (s *sentinelSet) options() *redis.FailoverOptions {
	return &redis.FailoverOptions{
		MasterName:            sentinelName,
		SentinelAddrs:         []string{s.sentinel.Addr()},
		ContextTimeoutEnabled: true,
	}
}

// failoverClient returns a redis.NewFailoverClient, closed when t ends.
func (s *sentinelSet) failoverClient(t *testing.T) *redis.Client {
	c := redis.NewFailoverClient(s.options())
	t.Cleanup(func() { c.Close() })
	return c
}

// failoverClusterClient returns a redis.NewFailoverClusterClient that
// sends read-only commands to the master or the replica at random, closed
// when t ends.
func (s *sentinelSet) failoverClusterClient(t *testing.T) *redis.ClusterClient {
	o := s.options()
	o.RouteRandomly = true
	c := redis.NewFailoverClusterClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// commandCalls returns how many times server was sent each command, by
// name (INFO commandstats): the calls it ran and those it rejected.
func commandCalls(t *testing.T, server *redis.Client) map[string]int64 {
	t.Helper()
	info, err := server.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(stats, ",") {
			if k, v, _ := strings.Cut(f, "="); k == "calls" || k == "rejected_calls" {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("INFO commandstats: %q: %v", line, err)
				}
				calls[strings.TrimPrefix(name, "cmdstat_")] += n
			}
		}
	}
	return calls
}

// TestSentinel runs the conformance suite through go-redis's two Sentinel
// clients, on a private master, replica and Sentinel:
// redis.NewFailoverClient, a *redis.Client on the master the Sentinel
// names, and redis.NewFailoverClusterClient with RouteRandomly, which sends
// read-only commands to the master or the replica. Every operation, Peek
// included, is a script (EVALSHA, or EVAL after NOSCRIPT) that go-redis
// does not count as read-only, so the second client sends them all to the
// master too: the replica, which did serve that client's GETs, ran none.
// On the first client a pipeline's Allows of one rule go as one combined
// script, as on any *redis.Client; on the second each is a script of its
// own, as on a Cluster. A client with ReplicaOnly, which sends everything
// to a replica, where no script may write, fails an Allow with
// ErrUnavailable, and nothing is counted.
func TestSentinel(t *testing.T) {
	t.Parallel()
	set := startSentinel(t)
	ctx := context.Background()

	t.Run("conformance", func(t *testing.T) {
		t.Run("NewFailoverClient", func(t *testing.T) {
			t.Parallel()
			next := testbackend.Alternate(set.failoverClient(t), set.failoverClient(t))
			storetest.Run(t, func(t *testing.T) driver.Store { return redisstore.New(next(t)) })
		})
		t.Run("NewFailoverClusterClient", func(t *testing.T) {
			t.Parallel()
			next := testbackend.Alternate(set.failoverClusterClient(t), set.failoverClusterClient(t))
			storetest.Run(t, func(t *testing.T) driver.Store { return redisstore.New(next(t)) })
		})
	})

	t.Run("scripts go to the master", func(t *testing.T) {
		c := set.failoverClusterClient(t)
		for i := range 40 {
			if err := c.Get(ctx, fmt.Sprintf("absent-%d", i)).Err(); err != redis.Nil {
				t.Fatalf("GET through the cluster client: %v, want redis.Nil", err)
			}
		}
		onReplica, onMaster := commandCalls(t, set.replica.Client(t)), commandCalls(t, set.master.Client(t))
		if onReplica["get"] == 0 {
			t.Fatalf("the replica ran none of 40 GETs sent with RouteRandomly: the client does not route reads to it, and the test shows nothing")
		}
		for _, name := range []string{"evalsha", "eval", "evalsha_ro", "eval_ro"} {
			if n := onReplica[name]; n != 0 {
				t.Errorf("the replica was sent %d %s commands, want none: scripts write", n, strings.ToUpper(name))
			}
		}
		if onMaster["evalsha"] == 0 {
			t.Errorf("the master ran no EVALSHA: the conformance suite sent its scripts elsewhere")
		}
	})

	// Five Allows of one rule on ids counted 0 to 4 times leave together
	// while a first call holds the Store's only pipeline slot.
	t.Run("pipelines", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			client redis.UniversalClient
			names  []string // the commands of the pipeline's one round trip
		}{
			{"NewFailoverClient", set.failoverClient(t), []string{"evalsha"}},
			{"NewFailoverClusterClient", set.failoverClusterClient(t), slices.Repeat([]string{"evalsha"}, 5)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := &pipeHook{}
				tc.client.AddHook(h)
				s := redisstore.New(tc.client, redisstore.WithMaxInFlight(1))
				l := countlimit.New(s)
				rule := countlimit.Rule{UseType: storetest.UseType(t, "pipelined"), Limit: 10, Window: countlimit.Rolling(time.Hour)}
				ids := []string{"a", "b", "c", "d", "e"}
				for i, id := range ids[1:] {
					if _, err := l.AllowN(ctx, rule, id, int64(i+1)); err != nil {
						t.Fatal(err)
					}
				}
				h.mu.Lock()
				h.sizes, h.names = nil, nil
				h.mu.Unlock()
				results := make([]countlimit.Result, len(ids))
				calls := make([]func() error, len(ids))
				for i, id := range ids {
					calls[i] = func() (err error) { results[i], err = l.Allow(ctx, rule, id); return err }
				}
				errs := gathered(t, s, h, func() error { _, err := l.Allow(ctx, rule, "first"); return err }, calls...)
				h.mu.Lock()
				if !slices.Equal(h.sizes, []int{len(ids)}) || !slices.EqualFunc(h.names, [][]string{tc.names}, slices.Equal) {
					t.Errorf("round trips of %v calls (%v) sent, want one of %d (%v)", h.sizes, h.names, len(ids), tc.names)
				}
				h.mu.Unlock()
				for i, id := range ids {
					if want := int64(i + 1); errs[i] != nil || !results[i].Allowed || results[i].Used != want {
						t.Errorf("Allow(%q) = %+v, %v; want allowed, Used %d", id, results[i], errs[i], want)
					}
				}
			})
		}
	})

	t.Run("ReplicaOnly", func(t *testing.T) {
		o := set.options()
		o.ReplicaOnly = true
		c := redis.NewFailoverClient(o)
		defer c.Close()
		l := countlimit.New(redisstore.New(c))
		rule := countlimit.Rule{UseType: storetest.UseType(t, "replica"), Limit: 10, Window: countlimit.Rolling(time.Hour)}
		if res, err := l.Allow(ctx, rule, "a"); !errors.Is(err, countlimit.ErrUnavailable) {
			t.Errorf("Allow through a ReplicaOnly client = %+v, %v; want ErrUnavailable", res, err)
		}
		if n, err := set.master.Client(t).Exists(ctx, redisstore.Key(rule.UseType, "a")).Result(); err != nil || n != 0 {
			t.Errorf("the master holds %d counters of the refused call (%v), want none", n, err)
		}
	})
}

// failoverSide is one client's Limiter in TestSentinelFailover, and what
// its callers saw while the Sentinel failed over.
type failoverSide struct {
	name string
	l    *countlimit.Limiter

	calls, denied, unavailable atomic.Int64 // on ids at their limit
	roomAllowed, roomFailed    []atomic.Int64
}

// TestSentinelFailover counts events for ids through both Sentinel clients
// (see TestSentinel), some ids to their limit, others far below it, and
// waits until the replica has them (WAIT). Then, while 4 callers a client
// keep calling on those ids, it has the Sentinel fail over to the replica
// (SENTINEL FAILOVER), and waits until both clients write to the new
// master. It shows:
//
//   - no call on an id at its limit is allowed, before, during or after
//     the switch, on either master: every one is denied with Used at the
//     limit, or fails with countlimit.ErrUnavailable (a call whose
//     connection the client closed as it switched, whose retry cannot tell
//     whether it counted); no other error;
//   - the new master holds every count the replica had: an id at its limit
//     stays denied, and an id below it keeps its count;
//   - an id's count on the new master is never above the calls allowed on
//     it plus those that failed: nothing counted twice;
//   - the Limiter goes on after the switch, exactly: a new id is allowed
//     its limit and no more.
//
// It logs what a failover loses: calls the old master answered after the
// replica's promotion and before the client learned of it (the client
// switches when the Sentinel announces the new master). The old master
// counted them, the new one never will: their ids were allowed more.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	set := startSentinel(t)
	ctx := context.Background()
	// The Limiter's clock stands still: windows of an hour, and the keys'
	// TTLs, outlast the test.
	now := time.Now().UTC()
	clock := func() time.Time { return now }
	full := countlimit.Rule{UseType: "failover.full", Limit: 5, Window: countlimit.Rolling(time.Hour)}
	room := countlimit.Rule{UseType: "failover.room", Limit: 1 << 40, Window: countlimit.Rolling(time.Hour)}
	const ids, before = 8, 3 // ids per kind and client; events counted before on each room id
	sides := []*failoverSide{
		{name: "NewFailoverClient", l: countlimit.New(redisstore.New(set.failoverClient(t)), countlimit.WithClock(clock))},
		{name: "NewFailoverClusterClient", l: countlimit.New(redisstore.New(set.failoverClusterClient(t)), countlimit.WithClock(clock))},
	}
	id := func(s *failoverSide, kind string, i int) string { return fmt.Sprintf("%s-%s-%d", s.name, kind, i) }

	// Before: each id at its limit is asked one more time than its limit,
	// concurrently; each id with room is counted before times.
	var wg sync.WaitGroup
	allowed := make([]atomic.Int64, len(sides)*ids)
	for j, s := range sides {
		s.roomAllowed, s.roomFailed = make([]atomic.Int64, ids), make([]atomic.Int64, ids)
		for i := range ids {
			for range full.Limit + 1 {
				wg.Go(func() {
					res, err := s.l.Allow(ctx, full, id(s, "full", i))
					if err != nil {
						t.Errorf("%s: Allow before the failover: %v", s.name, err)
					} else if res.Allowed {
						allowed[j*ids+i].Add(1)
					}
				})
			}
			wg.Go(func() {
				if _, err := s.l.AllowN(ctx, room, id(s, "room", i), before); err != nil {
					t.Errorf("%s: AllowN before the failover: %v", s.name, err)
				}
			})
		}
	}
	wg.Wait()
	for j, s := range sides {
		for i := range ids {
			if n := allowed[j*ids+i].Load(); n != full.Limit {
				t.Errorf("%s: %d of %d concurrent calls on %s allowed before the failover, want %d", s.name, n, full.Limit+1, id(s, "full", i), full.Limit)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The replica has everything once it has acknowledged a write made
	// after it: replication is one ordered stream.
	mc, rc := set.master.Client(t), set.replica.Client(t)
	if err := mc.Set(ctx, "failover.barrier", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := mc.Do(ctx, "WAIT", 1, 10_000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 10000 = %d, %v; want 1 replica", n, err)
	}
	counts := func(c *redis.Client, s *failoverSide, rule countlimit.Rule, kind string) []int64 {
		t.Helper()
		out := make([]int64, ids)
		for i := range ids {
			n, err := c.HGet(ctx, redisstore.Key(rule.UseType, id(s, kind, i)), "c").Int64()
			if err != nil {
				t.Fatalf("%s: HGET %s c: %v", c.Options().Addr, redisstore.Key(rule.UseType, id(s, kind, i)), err)
			}
			out[i] = n
		}
		return out
	}
	for _, s := range sides {
		if got := counts(rc, s, full, "full"); slices.ContainsFunc(got, func(n int64) bool { return n != full.Limit }) {
			t.Fatalf("%s: the replica holds counts %v before the failover, want %d each", s.name, got, full.Limit)
		}
	}

	// During: callers on every id, until after the switch.
	stop := make(chan struct{})
	for _, s := range sides {
		for g := range 4 {
			wg.Go(func() {
				for k := g; ; k++ {
					select {
					case <-stop:
						return
					default:
					}
					i := k % ids
					s.calls.Add(1)
					res, err := s.l.Allow(ctx, full, id(s, "full", i))
					switch {
					case errors.Is(err, countlimit.ErrUnavailable):
						s.unavailable.Add(1)
					case err != nil:
						t.Errorf("%s: Allow(%s) = %v, want a Result or ErrUnavailable", s.name, id(s, "full", i), err)
					case res.Allowed || res.Used != full.Limit:
						t.Errorf("%s: Allow(%s) = %+v, want denied with Used %d: allowed past the limit", s.name, id(s, "full", i), res, full.Limit)
					default:
						s.denied.Add(1)
					}
					res, err = s.l.Allow(ctx, room, id(s, "room", i))
					switch {
					case errors.Is(err, countlimit.ErrUnavailable):
						s.roomFailed[i].Add(1)
					case err != nil:
						t.Errorf("%s: Allow(%s) = %v, want a Result or ErrUnavailable", s.name, id(s, "room", i), err)
					case !res.Allowed:
						t.Errorf("%s: Allow(%s) = %+v, want allowed", s.name, id(s, "room", i), res)
					default:
						s.roomAllowed[i].Add(1)
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer halt()
	// callsAtLeast reports whether each client's callers made n calls
	// more on ids at their limit than they had made at base.
	callsAtLeast := func(n int64, base []int64) func() bool {
		return func() bool {
			for j, s := range sides {
				if s.calls.Load() < base[j]+n {
					return false
				}
			}
			return true
		}
	}
	testenv.WaitFor(t, 30*time.Second, "callers to call", callsAtLeast(20, []int64{0, 0}))

	start := time.Now()
	var reply string
	testenv.WaitFor(t, 30*time.Second, "SENTINEL FAILOVER to be accepted", func() bool {
		var err error
		reply, err = set.sc.Failover(ctx, sentinelName).Result()
		if err != nil && strings.HasPrefix(err.Error(), "INPROG") {
			reply, err = "INPROG", nil // an earlier try started it
		}
		return err == nil // NOGOODSLAVE: ask again
	})
	testenv.WaitFor(t, 30*time.Second, "the Sentinel to name the replica master", func() bool {
		addr, err := set.sc.GetMasterAddrByName(ctx, sentinelName).Result()
		return err == nil && net.JoinHostPort(addr[0], addr[1]) == set.replica.Addr()
	})
	switched := time.Since(start)
	// A client writes to the new master once a probe's counter appears
	// there.
	probe := countlimit.Rule{UseType: "failover.probe", Limit: 1, Window: countlimit.Rolling(time.Hour)}
	for _, s := range sides {
		k := 0
		testenv.WaitFor(t, 30*time.Second, s.name+" to write to the new master", func() bool {
			k++
			p := fmt.Sprintf("%s-%d", s.name, k)
			if _, err := s.l.Allow(ctx, probe, p); err != nil {
				return false
			}
			n, err := rc.Exists(ctx, redisstore.Key(probe.UseType, p)).Result()
			return err == nil && n == 1
		})
	}
	arrived := time.Since(start)
	// The callers go on, on the new master, for a while.
	testenv.WaitFor(t, 30*time.Second, "callers to call after the switch", callsAtLeast(40, []int64{sides[0].calls.Load(), sides[1].calls.Load()}))
	halt()
	// The replica ran the scripts' effects, not the scripts: the new
	// master answers NOSCRIPT until the store sends each one with EVAL.
	t.Logf("SENTINEL FAILOVER answered %s; the Sentinel named the new master after %v, both clients wrote to it after %v; it was sent %d EVALs",
		reply, switched.Round(time.Millisecond), arrived.Round(time.Millisecond), commandCalls(t, rc)["eval"])

	// After: the counts on the new master, read directly, then through the
	// Limiters.
	for _, s := range sides {
		if got := counts(rc, s, full, "full"); slices.ContainsFunc(got, func(n int64) bool { return n != full.Limit }) {
			t.Errorf("%s: the new master holds counts %v on ids at their limit, want %d each", s.name, got, full.Limit)
		}
		var allowed, failed, lost int64
		for i, n := range counts(rc, s, room, "room") {
			a, f := before+s.roomAllowed[i].Load(), s.roomFailed[i].Load()
			allowed, failed = allowed+a-before, failed+f
			if n < before || n > a+f {
				t.Errorf("%s: %s counts %d on the new master, want from %d (counted before) to %d (allowed %d, failed %d)",
					s.name, id(s, "room", i), n, before, a+f, a, f)
			}
			lost += max(0, a-n)
		}
		for i := range ids {
			res, err := s.l.Allow(ctx, full, id(s, "full", i))
			if err != nil || res.Allowed || res.Used != full.Limit {
				t.Errorf("%s: Allow(%s) after the failover = %+v, %v; want denied with Used %d", s.name, id(s, "full", i), res, err, full.Limit)
			}
		}
		fresh := fmt.Sprintf("%s-after", s.name)
		for n := int64(1); n <= full.Limit+1; n++ {
			res, err := s.l.Allow(ctx, full, fresh)
			if want := n <= full.Limit; err != nil || res.Allowed != want || res.Used != min(n, full.Limit) {
				t.Errorf("%s: call %d on a new id after the failover = %+v, %v; want allowed %v, Used %d", s.name, n, res, err, want, min(n, full.Limit))
			}
		}
		t.Logf("%s: %d calls on ids at their limit, from before the failover to after the switch: %d denied, %d ErrUnavailable, none allowed; "+
			"on ids with room %d allowed, %d ErrUnavailable, and %d allowed calls missing from the new master",
			s.name, s.calls.Load(), s.denied.Load(), s.unavailable.Load(), allowed, failed, lost)
	}
}
