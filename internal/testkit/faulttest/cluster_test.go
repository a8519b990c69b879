//go:build fault

package faulttest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/testkit/testenv/rediscluster"
)

// The load on a Redis Cluster: 16 callers of five kinds, each on ids of
// its own, spread over every slot, and on keys all of its kind share.
const (
	clusterCallers  = 16
	clusterIDs      = 64                     // ids each caller owns and alone calls, in turn
	clusterHotEvery = 8                      // a caller calls its kind's shared key every so many calls
	smoothBurst     = 5                      // cSmooth's burst
	smoothInterval  = 10 * time.Millisecond  // cSmooth's emission interval: 100 a second
	ackWindow       = time.Second            // how long before a kill -9 an acknowledged count may be lost
	promotedWithin  = 5 * time.Second        // from a replica's promotion to the first call it answers
	clusterSettle   = 500 * time.Millisecond // load after the last change
	// slidingMax is the largest Limit of a sliding rule (it logs every
	// event): far more than an id of a run's is called.
	slidingMax = 10000
)

var (
	// Accounting rules: their limits are never reached, their windows never
	// end during a run, so every acknowledged call is one more stored.
	cFixed      = countlimit.Rule{UseType: "cluster.fixed", Limit: expose.MaxLimit, Window: countlimit.Lifetime()}
	cAllFixed   = countlimit.Rule{UseType: "cluster.all.fixed", Limit: expose.MaxLimit, Window: countlimit.Lifetime()}
	cAllSliding = countlimit.Rule{UseType: "cluster.all.sliding", Limit: slidingMax, Window: countlimit.Sliding(time.Hour)}
	cSliding    = countlimit.Rule{UseType: "cluster.sliding", Limit: slidingMax, Window: countlimit.Sliding(time.Hour)}
	// A rate: the key its callers share is never allowed more than burst
	// + elapsed / interval.
	cSmooth = countlimit.Rule{UseType: "cluster.smooth", Limit: int64(time.Second / smoothInterval), Window: countlimit.Smooth(time.Second, smoothBurst)}
	// One lease an id: its caller releases each before the next, so it is
	// never denied.
	cLease = countlimit.Rule{UseType: "cluster.lease", Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	// The keys a kind's callers share: exact limits.
	cHotFixed = countlimit.Rule{UseType: "cluster.hot.fixed", Limit: 300, Window: countlimit.Lifetime()}
	cHotLease = countlimit.Rule{UseType: "cluster.hot.lease", Limit: 3, Window: countlimit.Concurrent(time.Minute)}
)

var clusterKinds = []string{"fixed", "allowall", "sliding", "smooth", "lease"}

// clusterID is what a caller knows of one of its ids.
type clusterID struct {
	id      string
	acked   int64       // calls allowed (a Lease: acquired)
	unknown int64       // failed calls that may have counted
	acks    []time.Time // when each allowed call returned
	denied  int64
}

// clusterCaller is one caller's record of a run.
type clusterCaller struct {
	kind     string
	ids      []*clusterID
	calls    int
	errs     map[string]int
	notUnav  []string // errors that are not ErrUnavailable, the first few
	notUnavN int
	failures []failure // when calls failed, and whether their id was on a watched slot
}

type failure struct {
	at      time.Time
	watched bool
}

// clusterLoad runs the callers on a Limiter over a ClusterClient.
type clusterLoad struct {
	l         *countlimit.Limiter
	timeout   time.Duration
	callers   []*clusterCaller
	watched   []bool       // slots whose ids' first success after since is recorded (a failover's master's)
	since     atomic.Int64 // Unix ns; 0: not yet
	firstOK   atomic.Int64 // Unix ns of the first such success; 0: none yet
	stop      atomic.Bool
	wg        sync.WaitGroup
	total     atomic.Int64 // calls made, for a failover's figures
	leaseNow  atomic.Int64 // leases of cHotLease held, as the callers know
	leaseMax  atomic.Int64 // the most leaseNow has been
	hotFixed  atomic.Int64 // cHotFixed's acknowledged allowances
	hotSmooth atomic.Int64 // cSmooth's on the shared key
	started   time.Time
	ended     time.Time
}

func newClusterLoad(l *countlimit.Limiter, timeout time.Duration, watched []bool) *clusterLoad {
	ld := &clusterLoad{l: l, timeout: timeout, watched: watched}
	for w := range clusterCallers {
		c := &clusterCaller{kind: clusterKinds[w%len(clusterKinds)], errs: map[string]int{}}
		for k := range clusterIDs {
			c.ids = append(c.ids, &clusterID{id: fmt.Sprintf("c%02d-%d", w, k)})
		}
		ld.callers = append(ld.callers, c)
	}
	ld.started = time.Now()
	for _, c := range ld.callers {
		ld.wg.Go(func() { ld.work(c) })
	}
	return ld
}

// finish stops the callers and waits for them; once is enough, more are
// harmless.
func (ld *clusterLoad) finish() time.Duration {
	if !ld.stop.Swap(true) {
		ld.wg.Wait()
		ld.ended = time.Now()
	}
	return ld.ended.Sub(ld.started)
}

func (ld *clusterLoad) work(c *clusterCaller) {
	ctx := context.Background()
	for i := 0; !ld.stop.Load(); i++ {
		st := c.ids[i%len(c.ids)]
		watched := ld.watched != nil && ld.watched[rediscluster.KeySlot("{"+st.id+"}")]
		call, cancel := context.WithTimeout(ctx, ld.timeout)
		allowed, err := ld.call(call, c, st)
		cancel()
		c.calls++
		ld.total.Add(1)
		now := time.Now()
		switch {
		case err != nil:
			st.unknown++
			c.failed(err, now, watched)
		case allowed:
			st.acked++
			st.acks = append(st.acks, now)
		default:
			st.denied++
		}
		if err == nil && watched {
			if s := ld.since.Load(); s != 0 && now.UnixNano() > s {
				ld.firstOK.CompareAndSwap(0, now.UnixNano())
			}
		}
		if c.kind == "smooth" || i%clusterHotEvery == 0 && (c.kind == "fixed" || c.kind == "lease") {
			call, cancel := context.WithTimeout(ctx, ld.timeout)
			err := ld.hot(call, c)
			cancel()
			c.calls++
			if err != nil {
				c.failed(err, time.Now(), false)
			}
		}
		if err != nil {
			time.Sleep(errorPause)
		}
	}
}

func (c *clusterCaller) failed(err error, at time.Time, watched bool) {
	c.failures = append(c.failures, failure{at, watched})
	if !errors.Is(err, countlimit.ErrUnavailable) {
		c.notUnavN++
		if len(c.notUnav) < 3 {
			c.notUnav = append(c.notUnav, err.Error())
		}
	}
	msg := err.Error()
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	if _, ok := c.errs[msg]; ok || len(c.errs) < 8 {
		c.errs[msg]++
	}
}

// call makes c's kind of call on st, and reports whether it was allowed.
func (ld *clusterLoad) call(ctx context.Context, c *clusterCaller, st *clusterID) (bool, error) {
	switch c.kind {
	case "fixed":
		r, err := ld.l.Allow(ctx, cFixed, st.id)
		return r.Allowed, err
	case "allowall":
		rs, err := ld.l.AllowAll(ctx, st.id, cAllFixed, cAllSliding)
		return err == nil && rs[0].Allowed, err
	case "sliding":
		r, err := ld.l.Allow(ctx, cSliding, st.id)
		return r.Allowed, err
	case "smooth":
		r, err := ld.l.Allow(ctx, cSmooth, st.id)
		return r.Allowed, err
	default:
		lease, r, err := ld.l.Acquire(ctx, cLease, st.id)
		if err != nil || !r.Allowed {
			return false, err
		}
		return true, lease.Release(ctx)
	}
}

// hot calls the key c's kind shares: a Limit 300 lifetime count, a rate,
// or three leases, held for a moment each.
func (ld *clusterLoad) hot(ctx context.Context, c *clusterCaller) error {
	switch c.kind {
	case "fixed", "smooth":
		rule, n := cHotFixed, &ld.hotFixed
		if c.kind == "smooth" {
			rule, n = cSmooth, &ld.hotSmooth
		}
		r, err := ld.l.Allow(ctx, rule, "hot")
		if err == nil && r.Allowed {
			n.Add(1)
		}
		return err
	}
	lease, r, err := ld.l.Acquire(ctx, cHotLease, "hot")
	if err != nil || !r.Allowed {
		return err
	}
	n := ld.leaseNow.Add(1)
	for m := ld.leaseMax.Load(); n > m && !ld.leaseMax.CompareAndSwap(m, n); m = ld.leaseMax.Load() {
	}
	time.Sleep(time.Millisecond)
	ld.leaseNow.Add(-1)
	return lease.Release(ctx)
}

// clusterFigures is what a run did, for its checks and its log.
type clusterFigures struct {
	calls, failed, notUnav int
	errs                   map[string]int
	notUnavSome            []string
	lost, double           int64    // acknowledged counts not stored; stored beyond acknowledged + failed
	worst                  []string // examples of lost and double counts
	over                   []string // smooth ids allowed beyond their rate, and the like
	// Counts a kill -9 lost within ackWindow, and how long before the
	// kill the oldest of them was acknowledged.
	lostToKill int64
	lostWindow time.Duration
}

// check reads what is stored for every id and compares it with what the
// callers were told. A lost count is allowed only on an id of lossy (the
// slots of a master killed at killed), and only for calls acknowledged in
// the ackWindow before killed.
func (ld *clusterLoad) check(t *testing.T, cl *redis.ClusterClient, lossy []bool, killed time.Time) clusterFigures {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fg := clusterFigures{errs: map[string]int{}}
	for _, c := range ld.callers {
		fg.calls += c.calls
		fg.failed += len(c.failures)
		fg.notUnav += c.notUnavN
		fg.notUnavSome = append(fg.notUnavSome, c.notUnav...)
		for m, n := range c.errs {
			fg.errs[m] += n
		}
		for _, st := range c.ids {
			var stored []int64
			switch c.kind {
			case "fixed":
				stored = []int64{hget(ctx, t, cl, cFixed.UseType, st.id)}
			case "allowall":
				stored = []int64{hget(ctx, t, cl, cAllFixed.UseType, st.id), zcard(ctx, t, cl, cAllSliding.UseType, st.id)}
			case "sliding":
				stored = []int64{zcard(ctx, t, cl, cSliding.UseType, st.id)}
			case "lease":
				if st.denied > 0 && lossy == nil {
					fg.over = append(fg.over, fmt.Sprintf("%s: %d Acquires of a lease released before denied", st.id, st.denied))
				}
			}
			for _, n := range stored {
				fg.account(st, n, lossy != nil && lossy[rediscluster.KeySlot("{"+st.id+"}")], killed)
			}
		}
	}
	// Every call of the shared rate came between started and ended.
	if n, most := ld.hotSmooth.Load(), smoothBurst+int64(ld.ended.Sub(ld.started)/smoothInterval)+1; n > most {
		fg.over = append(fg.over, fmt.Sprintf("%d allowed at a rate that allows %d in %v", n, most, ld.ended.Sub(ld.started)))
	}
	if m := ld.leaseMax.Load(); m > cHotLease.Limit {
		fg.over = append(fg.over, fmt.Sprintf("%d leases of a limit of %d held at once", m, cHotLease.Limit))
	}
	if n := ld.hotFixed.Load(); n > cHotFixed.Limit {
		fg.over = append(fg.over, fmt.Sprintf("%d allowed on a limit of %d", n, cHotFixed.Limit))
	} else if s := hget(ctx, t, cl, cHotFixed.UseType, "hot"); s < n && lossy == nil {
		fg.lost += n - s
		fg.worst = append(fg.worst, fmt.Sprintf("hot: stored %d < acknowledged %d", s, n))
	}
	return fg
}

// account compares one stored count of st with what its caller was told.
func (fg *clusterFigures) account(st *clusterID, stored int64, lossy bool, killed time.Time) {
	if stored > st.acked+st.unknown {
		fg.double += stored - st.acked - st.unknown
		fg.worst = append(fg.worst, fmt.Sprintf("%s: stored %d > acknowledged %d + failed %d", st.id, stored, st.acked, st.unknown))
	}
	if stored >= st.acked {
		return
	}
	lost := st.acked - stored
	// The acknowledgements a kill -9 may have lost are the last before it.
	var before []time.Time
	for _, at := range st.acks {
		if at.Before(killed) {
			before = append(before, at)
		}
	}
	if !lossy || lost > int64(len(before)) {
		fg.lost += lost
		fg.worst = append(fg.worst, fmt.Sprintf("%s: stored %d < acknowledged %d", st.id, stored, st.acked))
		return
	}
	w := killed.Sub(before[len(before)-int(lost)])
	if w > ackWindow {
		fg.lost += lost
		fg.worst = append(fg.worst, fmt.Sprintf("%s: %d lost, acknowledged up to %v before the kill", st.id, lost, w))
		return
	}
	fg.lostToKill += lost
	fg.lostWindow = max(fg.lostWindow, w)
}

func hget(ctx context.Context, t *testing.T, cl *redis.ClusterClient, ut countlimit.UseType, id string) int64 {
	t.Helper()
	n, err := cl.HGet(ctx, "countlimit:"+string(ut)+":{"+id+"}", "c").Int64() // docs/library.md's key layout; the ids need no escaping
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("reading %s of %s: %v", ut, id, err)
	}
	return n
}

func zcard(ctx context.Context, t *testing.T, cl *redis.ClusterClient, ut countlimit.UseType, id string) int64 {
	t.Helper()
	n, err := cl.ZCard(ctx, "countlimit:"+string(ut)+":{"+id+"}:log").Result()
	if err != nil {
		t.Fatalf("reading the log of %s of %s: %v", ut, id, err)
	}
	return n
}

// clusterClient is a ClusterClient as an application makes one: go-redis's
// defaults, with context deadlines honoured as redisstore's doc asks.
func clusterClient(t *testing.T, c *rediscluster.Cluster) (*redis.ClusterClient, *rediscluster.Replies) {
	return c.Client(t, func(o *redis.ClusterOptions) { o.ContextTimeoutEnabled = true })
}

// TestRedisClusterReshard puts 16 callers (fixed, AllowAll, sliding,
// smooth, leases) on a six-node cluster (three masters, three replicas)
// and moves 3 000 slots from one master to another and back with redis-cli
// --cluster reshard: no call fails, no id is allowed beyond its limit, and
// every acknowledged count is stored.
func TestRedisClusterReshard(t *testing.T) {
	redis.SetLogger(quietLogger{})
	c := rediscluster.Start(t, 3, 1)
	cl, replies := clusterClient(t, c)
	ld := newClusterLoad(countlimit.New(redisstore.New(cl)), 5*time.Second, nil)
	defer ld.finish()
	masters := c.Masters(t)
	a, b := masters[0], masters[1]
	time.Sleep(time.Second)
	var took []time.Duration
	for _, move := range [][2]*rediscluster.Node{{a, b}, {b, a}} {
		start := time.Now()
		c.Reshard(t, move[0], move[1], 3000)
		took = append(took, time.Since(start))
	}
	time.Sleep(clusterSettle)
	run := ld.finish()
	fresh, _ := c.Client(t)
	fg := ld.check(t, fresh, nil, time.Time{})
	t.Logf("%d calls in %v (%.0f a second), %d failed; reshards of 3 000 slots took %v and %v; the scripts met %v",
		fg.calls, run.Round(time.Millisecond), float64(fg.calls)/run.Seconds(), fg.failed,
		took[0].Round(time.Millisecond), took[1].Round(time.Millisecond), replies)
	if fg.failed > 0 {
		t.Errorf("%d calls failed, want none: %v", fg.failed, fg.errs)
	}
	if fg.lost > 0 || fg.double > 0 {
		t.Errorf("%d acknowledged counts lost and %d counted beyond acknowledged + failed calls, want none: %v", fg.lost, fg.double, first(fg.worst, 5))
	}
	if len(fg.over) > 0 {
		t.Errorf("beyond a limit: %v", first(fg.over, 5))
	}
}

// TestRedisClusterFailover kills a master (kill -9) of a six-node cluster
// under the load of TestRedisClusterReshard: calls on its slots are
// answered by its promoted replica within promotedWithin of the promotion,
// every call that fails meanwhile fails with ErrUnavailable, and the only
// acknowledged counts lost are on the dead master's ids, acknowledged in
// the ackWindow before the kill (what its replica had not received yet).
func TestRedisClusterFailover(t *testing.T) {
	redis.SetLogger(quietLogger{})
	c := rediscluster.Start(t, 3, 1, "--cluster-node-timeout", "2000")
	cl, replies := clusterClient(t, c)
	victim := c.Masters(t)[0]
	heir := c.ReplicaOf(t, victim)
	lost := c.SlotsOf(t, victim)
	ld := newClusterLoad(countlimit.New(redisstore.New(cl)), time.Second, lost)
	defer ld.finish()
	time.Sleep(time.Second)

	heirClient := heir.Client(t)
	killed, callsBefore := time.Now(), ld.total.Load()
	victim.Kill(t)
	var promoted time.Time
	for deadline := killed.Add(60 * time.Second); promoted.IsZero(); time.Sleep(5 * time.Millisecond) {
		role, err := heirClient.Do(context.Background(), "ROLE").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			promoted = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica was not promoted within 60 s of the kill")
		}
	}
	// The first call on the dead master's slots that succeeds after the
	// promotion (seen within 5 ms of it) is the new master's answer.
	ld.since.Store(promoted.UnixNano())
	for deadline := promoted.Add(2 * promotedWithin); ld.firstOK.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	callsUntil := ld.total.Load() // within 10 ms of the first answer
	time.Sleep(clusterSettle)
	run := ld.finish()

	fresh, _ := c.Client(t)
	fg := ld.check(t, fresh, lost, killed)
	var answered time.Time
	if ns := ld.firstOK.Load(); ns != 0 {
		answered = time.Unix(0, ns)
	}
	t.Logf("%d calls in %v, %d failed (%d not ErrUnavailable): %v", fg.calls, run.Round(time.Millisecond), fg.failed, fg.notUnav, topErrors(fg.errs, 4))
	if len(fg.over) > 0 {
		t.Logf("beyond a limit (what a failover's loss admits): %v", first(fg.over, 5))
	}
	if !answered.IsZero() {
		between, onVictim := ld.failuresBetween(killed, answered)
		t.Logf("kill -9 at 0; replica promoted at %v; first call on the dead master's slots answered at %v (%v after the promotion); "+
			"%d of %d calls failed in between (%d on its slots), %.0f a second; %d acknowledged counts lost, acknowledged at most %v before the kill; the scripts met %v",
			promoted.Sub(killed).Round(time.Millisecond), answered.Sub(killed).Round(time.Millisecond), answered.Sub(promoted).Round(time.Millisecond),
			between, callsUntil-callsBefore, onVictim, float64(between)/answered.Sub(killed).Seconds(), fg.lostToKill, fg.lostWindow.Round(time.Millisecond), replies)
	}
	switch {
	case answered.IsZero():
		t.Errorf("no call on the dead master's slots succeeded within %v of its replica's promotion", 2*promotedWithin)
	case answered.Sub(promoted) > promotedWithin:
		t.Errorf("the first call answered on the dead master's slots came %v after its replica's promotion, want ≤ %v", answered.Sub(promoted).Round(time.Millisecond), promotedWithin)
	}
	if fg.notUnav > 0 {
		t.Errorf("%d failed calls are not ErrUnavailable, e.g. %q", fg.notUnav, first(fg.notUnavSome, 3))
	}
	if fg.lost > 0 || fg.double > 0 {
		t.Errorf("%d acknowledged counts lost beyond the %v before the kill on the dead master's ids, and %d counted beyond acknowledged + failed calls: %v",
			fg.lost, ackWindow, fg.double, first(fg.worst, 5))
	}
}

// failuresBetween counts the calls that failed from from to to, once the
// callers have stopped, and of them those on watched slots.
func (ld *clusterLoad) failuresBetween(from, to time.Time) (all, watched int) {
	for _, c := range ld.callers {
		for _, f := range c.failures {
			if !f.at.Before(from) && !f.at.After(to) {
				all++
				if f.watched {
					watched++
				}
			}
		}
	}
	return all, watched
}
