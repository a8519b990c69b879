//go:build unix

// Package rediscluster starts a private Redis Cluster for a test: the
// machine's own redis-server, one process a node on free loopback ports,
// formed with redis-cli --cluster create, killed when the test ends. A
// test moves slots itself, one at a time (the steps redis-cli takes, so
// that a call can be made between them) or many with redis-cli --cluster
// reshard, and kills nodes.
package rediscluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisserver"
)

// Cluster is a private Redis Cluster. Its methods are for the test's own
// goroutine.
type Cluster struct {
	// Nodes are the cluster's nodes, in the order they started.
	Nodes []*Node
	cli   string
}

// Node is one redis-server of a Cluster.
type Node struct {
	// Addr is the node's address, host:port; ID its cluster node id.
	Addr, ID string
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd has exited
	log      *os.File
}

// Start starts masters*(1+replicas) cluster-enabled redis-server processes
// without persistence, with args (further settings as flags, such as
// "--cluster-node-timeout", "2000"; 5000 by default), forms a cluster of
// them with replicas replicas a master, and waits until every node serves
// and knows every other, and every replica is in sync. The nodes are
// killed when t ends, and the last lines of their logs shown if t failed.
// Without redis-server and redis-cli on PATH the test is skipped, or
// failed when backends are required.
func Start(t testing.TB, masters, replicas int, args ...string) *Cluster {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "redis-server (for a Redis Cluster)", err)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		testenv.Unavailable(t, "redis-cli (for a Redis Cluster)", err)
	}
	c := &Cluster{cli: cli}
	n := masters * (1 + replicas)
	for _, port := range freePorts(t, n) {
		c.Nodes = append(c.Nodes, startNode(t, server, port, args))
	}
	create := append([]string{"--cluster", "create"}, c.Addrs()...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, create...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	for _, nd := range c.Nodes {
		cl := nd.client()
		id, err := cl.Do(ctx, "CLUSTER", "MYID").Text()
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		nd.ID = id
	}
	c.WaitStable(t)
	return c
}

func startNode(t testing.TB, server string, port int, args []string) *Node {
	t.Helper()
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	nd := &Node{Addr: fmt.Sprintf("127.0.0.1:%d", port), log: logf, done: make(chan struct{})}
	all := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
		"--cluster-node-timeout", "5000",
		"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no"}, args...)
	nd.cmd = exec.Command(server, all...)
	nd.cmd.Stdout, nd.cmd.Stderr = logf, logf
	nd.cmd.SysProcAttr = redisserver.ProcAttr()
	if err := nd.cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	go func() {
		_ = nd.cmd.Wait()
		close(nd.done)
	}()
	t.Cleanup(func() {
		_ = nd.cmd.Process.Kill()
		<-nd.done
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("redis-server on %s, last lines of its log:\n%s", nd.Addr, strings.Join(lines[max(0, len(lines)-15):], "\n"))
			}
		}
	})
	testenv.WaitFor(t, 10*time.Second, "redis-server on "+nd.Addr, func() bool {
		select {
		case <-nd.done: // a port taken since freePorts looked, say
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("redis-server on %s exited at start:\n%s", nd.Addr, b)
		default:
		}
		cl := nd.client()
		defer cl.Close()
		return cl.Ping(context.Background()).Err() == nil
	})
	return nd
}

// client returns a client on the node alone that retries nothing.
func (n *Node) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})
}

// Client returns a client on the node alone that retries nothing, closed
// when t ends.
func (n *Node) Client(t testing.TB) *redis.Client {
	t.Helper()
	cl := n.client()
	t.Cleanup(func() { cl.Close() })
	return cl
}

// do runs one command on the node, failing t on an error.
func (n *Node) do(t testing.TB, args ...any) any {
	t.Helper()
	cl := n.client()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := cl.Do(ctx, args...).Result()
	if err != nil {
		t.Fatalf("%s: %v: %v", n.Addr, args, err)
	}
	return v
}

// Alive reports whether the node's process runs.
func (n *Node) Alive() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Kill kills the node (SIGKILL: a crash) and waits for it to exit.
func (n *Node) Kill(t testing.TB) {
	t.Helper()
	_ = n.cmd.Process.Kill()
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("redis-server on %s did not exit within 30 s of SIGKILL", n.Addr)
	}
}

// Replies counts, by kind (MOVED, ASK, TRYAGAIN, ...: the error's first
// word), the error replies the nodes of a ClusterClient gave its scripts,
// and the sends of its scripts by their first key: a hook on every node's
// client, which sees each send.
type Replies struct {
	mu    sync.Mutex
	n     map[string]int
	sends map[any]int
}

// DialHook implements redis.Hook.
func (r *Replies) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (r *Replies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		r.note(cmd, err)
		return err
	}
}

// ProcessPipelineHook implements redis.Hook.
func (r *Replies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			r.note(cmd, cmd.Err())
		}
		return err
	}
}

func (r *Replies) note(cmd redis.Cmder, err error) {
	if !strings.HasPrefix(cmd.Name(), "eval") {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if args := cmd.Args(); len(args) > 3 {
		r.sends[args[3]]++
	}
	if err != nil {
		kind, _, _ := strings.Cut(err.Error(), " ")
		r.n[kind]++
	}
}

// Sends returns how often a script whose first key is key was sent.
func (r *Replies) Sends(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sends[key]
}

// Count returns how many replies of kind the scripts met.
func (r *Replies) Count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[kind]
}

// String lists the counts.
func (r *Replies) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.n)
}

// Client returns a ClusterClient on the cluster with go-redis's defaults
// but what opts set, closed when t ends, and the Replies its scripts met.
func (c *Cluster) Client(t testing.TB, opts ...func(*redis.ClusterOptions)) (*redis.ClusterClient, *Replies) {
	t.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range opts {
		f(o)
	}
	cl := redis.NewClusterClient(o)
	r := &Replies{n: map[string]int{}, sends: map[any]int{}}
	cl.OnNewNode(func(n *redis.Client) { n.AddHook(r) })
	t.Cleanup(func() { cl.Close() })
	if err := cl.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	return cl, r
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// live returns a node that runs.
func (c *Cluster) live(t testing.TB) *Node {
	t.Helper()
	for _, n := range c.Nodes {
		if n.Alive() {
			return n
		}
	}
	t.Fatal("rediscluster: no node runs")
	return nil
}

// byID returns the node of a cluster node id.
func (c *Cluster) byID(t testing.TB, id string) *Node {
	t.Helper()
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	t.Fatalf("rediscluster: no node %s", id)
	return nil
}

// Slot returns the hash slot of key, as a running node computes it.
func (c *Cluster) Slot(t testing.TB, key string) int {
	t.Helper()
	return int(c.live(t).do(t, "CLUSTER", "KEYSLOT", key).(int64))
}

// view is one node's CLUSTER NODES: each node's role, its master and its
// slots.
type view struct {
	master map[string]string // replica id -> master id
	flags  map[string]string
	owner  [16384]string
}

func (c *Cluster) view(t testing.TB, n *Node) view {
	t.Helper()
	v := view{master: map[string]string{}, flags: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(n.do(t, "CLUSTER", "NODES").(string)), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		v.flags[f[0]] = f[2]
		if f[3] != "-" {
			v.master[f[0]] = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot in migration
			}
			lo, hi, ok := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if ok {
				b, _ = strconv.Atoi(hi)
			}
			for s := a; s <= b; s++ {
				v.owner[s] = f[0]
			}
		}
	}
	return v
}

// Owner returns the master that serves slot, as a running node sees it.
func (c *Cluster) Owner(t testing.TB, slot int) *Node {
	t.Helper()
	return c.byID(t, c.view(t, c.live(t)).owner[slot])
}

// SlotsOf returns which slots n serves, as a running node sees it.
func (c *Cluster) SlotsOf(t testing.TB, n *Node) []bool {
	t.Helper()
	v := c.view(t, c.live(t))
	out := make([]bool, len(v.owner))
	for s, id := range v.owner {
		out[s] = id == n.ID
	}
	return out
}

// Masters returns the nodes that serve slots, as a running node sees it.
func (c *Cluster) Masters(t testing.TB) []*Node {
	t.Helper()
	v := c.view(t, c.live(t))
	var out []*Node
	for _, n := range c.Nodes {
		if slices.Contains(v.owner[:], n.ID) {
			out = append(out, n)
		}
	}
	return out
}

// ReplicaOf returns a replica of master, as a running node sees it.
func (c *Cluster) ReplicaOf(t testing.TB, master *Node) *Node {
	t.Helper()
	v := c.view(t, c.live(t))
	for _, n := range c.Nodes {
		if v.master[n.ID] == master.ID {
			return n
		}
	}
	t.Fatalf("rediscluster: %s has no replica", master.Addr)
	return nil
}

// Other returns a master other than n.
func (c *Cluster) Other(t testing.TB, n *Node) *Node {
	t.Helper()
	for _, m := range c.Masters(t) {
		if m != n {
			return m
		}
	}
	t.Fatal("rediscluster: a single master")
	return nil
}

// BeginMigration opens slot's move from one master to another: IMPORTING
// on to, MIGRATING on from. Until EndMigration, from serves the keys it
// still has and sends a call for keys it has none of to to (ASK).
func (c *Cluster) BeginMigration(t testing.TB, slot int, from, to *Node) {
	t.Helper()
	to.do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.ID)
	from.do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.ID)
}

// MigrateKeys moves keys of slot from one master to another (MIGRATE), all
// that from has in slot when keys is empty.
func (c *Cluster) MigrateKeys(t testing.TB, slot int, from, to *Node, keys ...string) {
	t.Helper()
	if len(keys) == 0 {
		for _, k := range from.do(t, "CLUSTER", "GETKEYSINSLOT", slot, 100000).([]any) {
			keys = append(keys, k.(string))
		}
	}
	if len(keys) == 0 {
		return
	}
	host, port, _ := strings.Cut(to.Addr, ":")
	args := []any{"MIGRATE", host, port, "", 0, 10000, "REPLACE", "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	from.do(t, args...)
}

// EndMigration gives slot to to, as redis-cli does: to first, then from,
// then every other master.
func (c *Cluster) EndMigration(t testing.TB, slot int, from, to *Node) {
	t.Helper()
	to.do(t, "CLUSTER", "SETSLOT", slot, "NODE", to.ID)
	from.do(t, "CLUSTER", "SETSLOT", slot, "NODE", to.ID)
	for _, m := range c.Masters(t) {
		if m != to && m != from {
			m.do(t, "CLUSTER", "SETSLOT", slot, "NODE", to.ID)
		}
	}
}

// MoveSlot moves slot, with its keys, from one master to another.
func (c *Cluster) MoveSlot(t testing.TB, slot int, from, to *Node) {
	t.Helper()
	c.BeginMigration(t, slot, from, to)
	c.MigrateKeys(t, slot, from, to)
	c.EndMigration(t, slot, from, to)
}

// Reshard moves n slots from one master to another with redis-cli
// --cluster reshard, and waits until every node agrees on the result.
func (c *Cluster) Reshard(t testing.TB, from, to *Node, n int) {
	t.Helper()
	out, err := exec.Command(c.cli, "--cluster", "reshard", to.Addr,
		"--cluster-from", from.ID, "--cluster-to", to.ID, "--cluster-slots", strconv.Itoa(n),
		"--cluster-yes").CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster reshard: %v\n%s", err, lastLines(out, 20))
	}
	c.WaitStable(t)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// WaitStable waits until every running node serves (cluster_state:ok),
// sees every slot served by the same master as the others do, and knows
// no node in failure, and every running replica is in sync with its
// master.
func (c *Cluster) WaitStable(t testing.TB) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, "a stable cluster", func() bool {
		var first *view
		for _, n := range c.Nodes {
			if !n.Alive() {
				continue
			}
			cl := n.client()
			info, err := cl.ClusterInfo(context.Background()).Result()
			repl, rerr := cl.Info(context.Background(), "replication").Result()
			cl.Close()
			if err != nil || rerr != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
				return false
			}
			v := c.view(t, n)
			for id, f := range v.flags {
				if c.byID(t, id).Alive() && (strings.Contains(f, "fail") || strings.Contains(f, "handshake")) {
					return false
				}
			}
			if first == nil {
				first = &v
			} else if v.owner != first.owner {
				return false
			}
		}
		return true
	})
}

// freePorts finds n loopback ports free for clients, with port+10000 free
// for the cluster bus, both below the kernel's ephemeral range, where no
// other test's outgoing connection can take one between this look and
// redis-server's bind (the ports testenv.FreePort leaves to such pairs).
func freePorts(t testing.TB, n int) []int {
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

// KeySlot returns the hash slot of key, as Redis Cluster computes it: the
// CRC16 (XMODEM) of its hash tag, the part between the first { and the
// next }, when that is not empty, else of the whole key, modulo 16384. A
// test finds ids of a given slot with it, without a round trip a try.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
