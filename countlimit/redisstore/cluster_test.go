//go:build unix

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
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/rediscluster"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisserver"
)

// TestCluster starts a three-node Redis Cluster from the local redis-server
// and runs the model harness and the conformance suite through
// redis.NewClusterClient.
func TestCluster(t *testing.T) {
	addrs := rediscluster.Start(t, 3, 0).Addrs()
	ctx := context.Background()
	clients := make([]*redis.ClusterClient, 2)
	for i := range clients {
		clients[i] = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { clients[i].Close() })
		if err := clients[i].Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// One id's counters share a slot, so a multi-rule check is one script.
	l := countlimit.New(redisstore.New(clients[0]))
	rules := []countlimit.Rule{
		{UseType: "cluster.a", Limit: 1, Window: countlimit.Fixed(time.Hour)},
		{UseType: "cluster.b", Limit: 1, Window: countlimit.Sliding(time.Hour)},
		{UseType: "cluster:c{x}", Limit: 1, Window: countlimit.Lifetime()},
	}
	if res, err := l.AllowAll(ctx, "user-1", rules...); err != nil || !res[0].Allowed {
		t.Fatalf("AllowAll on the cluster: %v, %v", res, err)
	}
	slot := func(key string) int64 {
		s, err := clients[0].ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	want := slot(redisstore.Key(rules[0].UseType, "user-1"))
	for _, r := range rules {
		for _, k := range []string{redisstore.Key(r.UseType, "user-1"), redisstore.LogKey(r.UseType, "user-1")} {
			if got := slot(k); got != want {
				t.Errorf("%s is in slot %d, want %d with the id's other keys", k, got, want)
			}
		}
	}

	// The model harness through the Cluster client, smooth rules included:
	// a call alone, and pipelines of a script a call, which go-redis
	// splits by node. Its Store's scripts pad their TTLs (see TestModel).
	t.Run("model", func(t *testing.T) {
		s := redisstore.New(clients[0], redisstore.WithPaddedTTLs(time.Minute))
		read := func(ctx context.Context, ut, id string) (model.Key, error) { return readKey(ctx, clients[0], ut, id) }
		modeltest.Run(t, []modeltest.Path{
			{Name: "lone", Do: modeltest.Each(s.Do), Read: read, Expires: true},
			{Name: "pipeline", Do: s.PipelineForTest, Read: read, Expires: true},
		})
	})

	var n atomic.Int64
	storetest.Run(t, func(*testing.T) driver.Store { return redisstore.New(clients[n.Add(1)%2]) })
	// Pipelines of calls on ids of every node: go-redis sends each script to
	// the node of its slot.
	t.Run("many ids pipelined", func(t *testing.T) { testManyIDs(t, redisstore.New(clients[0])) })

	// CheckEviction asks every master: one that evicts is found.
	if err := redisstore.New(clients[0]).CheckEviction(ctx); err != nil {
		t.Errorf("CheckEviction on a cluster of noeviction nodes = %v, want nil", err)
	}
	node := redis.NewClient(&redis.Options{Addr: addrs[len(addrs)-1]})
	defer node.Close()
	if err := node.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := redisstore.New(clients[0]).CheckEviction(ctx); !errors.Is(err, redisstore.ErrEvictionPolicy) || !strings.Contains(err.Error(), "volatile-lru") {
		t.Errorf("CheckEviction with one master on volatile-lru = %v, want ErrEvictionPolicy naming it", err)
	}

	// CheckPersistence asks every master too: the nodes start persisting
	// nothing, and one that still does not is found.
	for i, addr := range addrs {
		if i == len(addrs)-1 {
			if err := redisstore.New(clients[0]).CheckPersistence(ctx); err != redisstore.ErrNoPersistence {
				t.Errorf("CheckPersistence with one master persisting nothing = %v, want ErrNoPersistence", err)
			}
		}
		node := redis.NewClient(&redis.Options{Addr: addr})
		defer node.Close()
		if err := node.ConfigSet(ctx, "save", "3600 1").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := redisstore.New(clients[0]).CheckPersistence(ctx); err != nil {
		t.Errorf("CheckPersistence on a cluster of masters with snapshots = %v, want nil", err)
	}
}

// TestClusterReadsSlotMapAfterFailure: after a call fails without a reply
// (a connection refused: a master that died), a ClusterClient reads its
// slot map anew, so calls reach the node that took the slots over (here a
// map the test changes, as a replica's promotion does) within seconds, not
// at go-redis's next reading of its own, a minute later.
func TestClusterReadsSlotMapAfterFailure(t *testing.T) {
	t.Parallel()
	srv := redisserver.Start(t, "--save", "", "--appendonly", "no")
	_, dead := testbackend.DeadAddrs(t)
	var promoted atomic.Bool
	var reads atomic.Int32
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			reads.Add(1)
			addr := dead
			if promoted.Load() {
				addr = srv.Addr()
			}
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: addr}}}}, nil
		},
	})
	t.Cleanup(func() { cl.Close() })
	l := countlimit.New(redisstore.New(cl))
	rule := countlimit.Rule{UseType: storetest.UseType(t, "failover"), Limit: 10, Window: countlimit.Fixed(time.Hour)}
	allow := func() (countlimit.Result, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return l.Allow(ctx, rule, "id")
	}
	if _, err := allow(); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Fatalf("Allow on a master that is gone = %v, want ErrUnavailable", err)
	}
	promoted.Store(true)
	before := reads.Load()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := allow()
		if err == nil {
			if r.Used != 1 {
				t.Errorf("Allow on the new master = %+v, want Used 1", r)
			}
			break
		}
		if !errors.Is(err, countlimit.ErrUnavailable) {
			t.Fatalf("Allow while the slot map is stale = %v, want ErrUnavailable", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call reached the new master within 5 s (the slot map was read %d times since)", reads.Load()-before)
		}
	}
}
