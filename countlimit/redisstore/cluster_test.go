package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/modeltest"
	"github.com/countlimit/countlimit/internal/testbackend"
	"github.com/countlimit/countlimit/internal/testenv"
)

// TestCluster starts a three-node Redis Cluster from the local redis-server
// and runs the model harness and the conformance suite through
// redis.NewClusterClient.
func TestCluster(t *testing.T) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		testbackend.Unavailable(t, "redis-server (for a Redis Cluster)", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		testbackend.Unavailable(t, "redis-cli (for a Redis Cluster)", err)
	}
	addrs := startCluster(t, server, cli, 3)
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
	// splits by node. A subtest of its own, so that the scripts' padded
	// TTLs (see TestModel) are restored before the suite below runs.
	t.Run("model", func(t *testing.T) {
		t.Cleanup(redisstore.PadTTLsForTest(time.Minute))
		s := redisstore.New(clients[0])
		read := func(ctx context.Context, ut, id string) (driver.Key, error) { return readKey(ctx, clients[0], ut, id) }
		modeltest.Run(t, []modeltest.Path{
			{Name: "lone", Do: modeltest.Each(s.Do), Read: read, Expires: true, NoSmooth: noSmooth},
			{Name: "pipeline", Do: s.PipelineForTest, Read: read, Expires: true, NoSmooth: noSmooth},
		})
	})

	var n atomic.Int64
	storetest.RunWith(t, func(*testing.T) driver.Store { return redisstore.New(clients[n.Add(1)%2]) }, storetest.Options{NoSmooth: noSmooth})
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

// startCluster starts n cluster-enabled redis-server processes on free
// loopback ports, forms a cluster of them, and stops them when t ends.
func startCluster(t *testing.T, server, cli string, n int) []string {
	t.Helper()
	var addrs []string
	for _, port := range freePorts(t, n) {
		dir := t.TempDir()
		logf, err := os.Create(filepath.Join(dir, "redis.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(server,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "5000",
			"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
			logf.Close()
		})
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		addrs = append(addrs, addr)
		waitFor(t, 10*time.Second, "redis-server on "+addr, func() bool {
			select {
			case <-exited: // a port taken since freePorts looked, say
				log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
				t.Fatalf("redis-server on %s exited (%v):\n%s", addr, waitErr, log)
			default:
			}
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			return c.Ping(context.Background()).Err() == nil
		})
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, addr := range addrs {
		waitFor(t, 30*time.Second, "cluster_state:ok on "+addr, func() bool {
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			info, err := c.ClusterInfo(context.Background()).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	}
	return addrs
}

// freePorts finds n loopback ports free for clients, with port+10000 free
// for the cluster bus, both below the kernel's ephemeral range, where no
// other test's outgoing connection can take one between this look and
// redis-server's bind (the ports testenv.FreePort leaves to such pairs).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	low := testenv.EphemeralLow()
	var ports []int
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := low - 12000 + rand.IntN(2000) // the bus, p+10000, below low too
		if testenv.PortFree(p) && testenv.PortFree(p+10000) && !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	if len(ports) < n {
		t.Fatal("no free ports for a Redis Cluster")
	}
	return ports
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
