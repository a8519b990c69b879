// Package redisstore is the Redis driver.Store, on go-redis v9. It works
// with a single server, a Redis Cluster or a failover client: anything that
// is a redis.UniversalClient. Of Sentinel's clients, redis.NewFailoverClient
// and redis.NewFailoverClusterClient send every script to the master, the
// latter also where it routes reads to replicas; with ReplicaOnly, which
// sends everything to a replica, Allows fail (docs/library.md, "Sentinel").
//
// Every operation runs in one Lua script, run with EVALSHA (and EVAL when
// the server answers NOSCRIPT, after a restart or SCRIPT FLUSH), so each
// check is atomic on the server; a pipeline's fast-path calls may share one
// (see Pipelining). The common call, an Allow of one rule, runs fast.lua,
// which decides as apply.lua does (every other check's script) in straight
// code, with less of Redis's CPU.
//
// Keys are "countlimit:<use_type>:{<id>}", a hash holding the count, the
// window, the denial tally, the penalty and the record of the script that
// wrote it last (field r, see Lost replies); a Smooth window keeps its
// instant (TAT, field t) beside its units not yet drained as the count of
// the window [0, t), which a rule of another kind on the same use type
// carries over (apply.lua), and a key that holds nothing else is kept as
// a string "<t>:<c>:<r>" (t in hexadecimal) instead of the hash {t, c, b,
// e, r}, which every script reads as that hash and makes that hash before
// it writes anything else (smoothkey.lua: one GET and one SET a call,
// where the hash takes three commands); sliding windows add a sorted set
// "countlimit:<use_type>:{<id>}:log" of the counted events, and Concurrent
// windows a sorted set "countlimit:<use_type>:{<id>}:lease" of lease tokens
// by expiry (see leaseKey and lease.lua). The hash tag
// {<id>} puts every counter of one id in one Cluster slot, so a multi-rule
// check is one script on one node. In both parts the characters % : { } are
// escaped as %25 %3A %7B %7D, so two different (use_type, id) pairs never
// share a key.
//
// Every key carries a TTL, set relative to the Limiter's clock, that ends
// with its window, penalty or newest sliding event, or for a Smooth window
// when the id is drained (its instant) or its penalty ends, whichever is
// later; updates never drop it. Lifetime counters are the exception: they
// have no end, so no TTL.
//
// # Eviction
//
// Redis must run with maxmemory-policy noeviction. Under any other policy a
// Redis that reaches its maxmemory drops keys to make room, counters among
// them (the volatile-* policies too, since counters carry TTLs), and an id
// whose counter went starts over: it is allowed beyond its limit, and no
// call returns an error. With noeviction a full Redis refuses writes
// instead, and checks fail with countlimit.ErrUnavailable, which the
// Limiter's failure policy handles. CheckEviction asks the server, where it
// allows CONFIG GET; the countlimit service logs what it finds at start and
// answers /healthz with 503 while the policy evicts.
//
// # Persistence
//
// Counts live as long as Redis keeps them. A Redis with neither AOF nor
// RDB snapshots (appendonly no, save "") comes back from a restart empty:
// every count, penalty, sliding log and lease is gone, every id is allowed
// its full limit again, and no call returns an error. With RDB snapshots
// alone a restart loses what was written since the last snapshot (a clean
// shutdown, SHUTDOWN or SIGTERM, saves first; a crash or a kill -9 does
// not). With AOF and appendfsync everysec, Redis's default for AOF, a crash
// loses at most about the last second of writes. A failover to a
// replica loses the writes the replica had not received yet: replication
// is asynchronous, the master answers a script before its replicas have
// it, and the store does not wait for them (no WAIT); nor does the old
// master stop at the promotion, and what it counts until the clients learn
// of the new master is lost too. A master without persistence that a
// supervisor restarts comes back empty, and its replicas copy it.
//
// What is lost is mostly counting, so a loss admits more: ids are allowed
// beyond their limits, penalties end early, and leases are handed out
// while the holders of forgotten ones still run (their Extend fails with
// countlimit.ErrLeaseExpired). The exception is a lost Refund, Reset or
// Release, which comes back undone: its id has less room than it should
// until its window, penalty or lease ends. Snapshots and the AOF keep each
// key's expiry as an instant, so restored keys end with their windows.
// CheckPersistence reports a server that persists nothing; the countlimit
// service logs it at start and lists it under "warnings" in /healthz,
// which stays 200 unless the service runs with
// --require-redis-persistence.
//
// # Pipelining
//
// A Store gathers concurrent calls into pipelines, with no timers: a call
// that finds a free slot (4 by default, see WithMaxInFlight) is sent at
// once, with any calls that are waiting; calls that arrive while every slot
// is busy leave together in the next pipeline, up to 128 of them (see
// WithMaxBatch). A call that finds a free slot and no call waiting is sent
// from its own goroutine as a plain command, so calls that come one at a
// time cost what they did without pipelining. A pipeline is one write and
// one read on one connection (on a Cluster, one per node that holds a slot
// of its calls: go-redis sends each script to the node of its keys).
//
// On one server (a *redis.Client: a single Redis, or Sentinel's master)
// the pipeline's fast-path calls, Allows of one rule,
// go as one fast.lua script that applies them one after another, in the
// order they came, each exactly as a script of its own would: the script's
// fixed cost and its arguments' framing are paid once for them all, which
// is most of what Redis spends on a call when calls are many (see
// docs/benchmarks.md, "Redis at 16 and 64 callers"). A script carries at most 64 calls and
// 16 KiB of keys and arguments (Redis serves no one else while it runs); more make more scripts in
// the same pipeline. Every other call, and every call on a Cluster or a
// Ring, whose keys live on different nodes, is its own script. A server
// that refuses a combined script whose keys span slots (CROSSSLOT, MOVED:
// a Cluster node reached through a *redis.Client, or a proxy that checks
// slots) has its calls sent again alone, and the Store combines no more. A proxy that routes a script
// by its first key without a check (twemproxy, Envoy's Redis proxy) would
// put other ids' counters on the wrong shard: give WithScriptPerCall there.
// Each call gets its own outcome: a call that fails (a key of the wrong
// type, say) fails only its caller (in a combined script it is left
// undone, having written nothing, and sent again alone to get its error);
// a connection that breaks fails every call of that pipeline with
// countlimit.ErrUnavailable, once go-redis's retries are spent. If the
// server answers NOSCRIPT, the commands that got it are sent again at
// once, in one more pipeline, with EVAL, which loads the script again.
//
// A call whose context ends while it waits for a slot leaves the queue and
// is never sent. A pipeline's context carries the latest deadline of its
// callers (and at most 10 s, below), so with ContextTimeoutEnabled a stuck
// pipeline ends once none of its callers waits for it.
//
// # Lost replies
//
// A lost reply never counts twice. go-redis sends a command, or a whole
// pipeline, again when its connection breaks (3 retries by default), and a
// script may have run before the reply was lost: a blind repeat would count
// an event twice, refund twice, or reset away a count made in between.
//
// So every script carries its attempt, an argument go-redis writes anew
// each time it sends the command (an encoding.BinaryMarshaler: "1" when an
// earlier send of the command may have run, else "0"; a send that the
// server refused before running anything, MOVED, ASK, TRYAGAIN or
// NOSCRIPT among others, did not run, see attempt), and only a first
// attempt applies the call: a repeat writes nothing, so however a
// command's attempts meet in Redis, in whatever order and on whatever
// connections, a call counts, refunds or resets at most once. For the
// repeat to answer, every script that writes a counter leaves its token, a
// number of 31 bits drawn for it, in field r of each hash it writes
// (fast.lua's header says how; a denial leaves it too), overwriting the
// token of the script before. This costs no key and
// no command of its own: the field is written with the count. A repeat
// reads its hashes and:
//
//   - finds its token: the first attempt ran, and nothing has written that
//     hash since, so the hash is as the call left it, and the reply is read
//     back from it (fast.lua) or from the packed reply kept beside the
//     token (apply.lua).
//   - finds another: the first attempt never reached Redis, or ran and
//     another call wrote the hash since. The call fails with
//     countlimit.ErrUnavailable: it may have counted, once.
//
// A repeat is answered, then, while nothing else has written the hash
// (for AllowAll, the first hash it wrote): on an id of its own, a retry
// milliseconds later finds its record; on an id that many callers share,
// the retry of a call whose reply was lost mostly fails instead, and so
// does the retry of a call that never reached Redis (a connection killed
// with the call in it). Reset deletes the hashes, so it keeps its reply
// under a key of its own, "countlimit:{<id>}:reply:<token>" in the id's
// slot, for 20 s, and a pipeline gives up at most 10 s after it is sent, whatever
// its callers' contexts allow, so that no repeat of a Reset comes after its
// reply is gone. This holds whatever the client's retry settings, on a
// single server, Sentinel or Cluster: the record is written, and
// replicated, with the counts it describes. (Turning retries off instead is
// the client's setting, not the store's, and turns every broken connection
// into an error.) A repeat could take another process's token for its own
// where two processes' counters meet on the same hash (one chance in 2^31
// of a repeat's): it would then report the other call's outcome, and count
// nothing.
//
// go-redis records why a send failed before it sends again wherever it
// retries by itself (a ClusterClient, whose nodes' clients retry nothing by
// default); a *redis.Client retries a connection's errors in a loop of its
// own (MaxRetries) without, so each of its repeats counts as one that may
// have run, whatever refused the send before.
//
// Hashes written before records existed hold no field r and are read as
// before; a process of the version before (a reply key per write) and one
// of this version may share a Redis during a rolling upgrade, but the
// older one does not update r, so a repeat of the newer one's call that
// only the older one wrote over in between is answered with the hash as
// the older one left it: counted once, with a Used that may be too high.
//
// Lease operations keep no reply: the lease's token makes a repeat harmless.
// A repeated Acquire finds its token and answers allowed without taking a
// second slot, a repeated Extend sets the same expiry, and a repeated
// Release frees nothing more (lease.lua's header names the one case a
// repeat cannot tell apart: a short lease dropped before the repeat ran).
//
// A call that fails with countlimit.ErrUnavailable may or may not have
// counted; calling again is a new event.
//
// go-redis honours a context's deadline only when the client is made with
// ContextTimeoutEnabled: true; otherwise a silent server holds a pipeline,
// and a call sent alone, until the client's ReadTimeout (the callers of a
// pipeline stop waiting at their own deadlines). Either way a failure is
// countlimit.ErrUnavailable.
//
// # Cluster
//
// On a Redis Cluster (a *redis.ClusterClient) the hash tag {<id>} puts
// every key of an id in one slot, so each call is one script on one node.
// There a call names only the keys it needs: its counters, a sliding
// rule's log (a Refund and a Reset name every log), a Concurrent rule's
// lease set; a rule of another kind names its counter twice, which Redis
// takes for one key. A script that finds a log it was not given (its rule
// was sliding before) asks for it, having written nothing, and goes again
// with it, after the rest of its pipeline; so a call that a later one of
// its pipeline on the same id follows names every log, and a pipeline's
// calls still apply in the order they came. (Elsewhere every call names
// every log, as it costs nothing where no slot migrates.) In a pipeline, a
// script of several keys goes after an EXISTS of its first key, so that
// go-redis never sends a node's part of it again whole, scripts that ran
// included, for a TRYAGAIN at its head (see guarded).
//
// While a slot moves, its old master serves the keys it still has and
// sends a call for keys it has none of to the new one (ASK), which serves
// it; a call whose keys are some on each node, or are missing there, is
// refused (TRYAGAIN) until the slot has moved. A call that names one key
// (an Allow of a fixed, rolling, calendar, lifetime or smooth rule) is
// never refused. go-redis follows MOVED and ASK and retries TRYAGAIN, and
// none of these ran the script: the send after them is a first attempt
// (see Lost replies). A call that a slot still refuses when go-redis
// gives up goes again from its caller's goroutine, after pauses of 5 ms
// doubling up to 100 ms, until the slot has moved or the call's context
// ends (10 s after the first refusal without a deadline); the calls that
// shared its pipeline have their answers meanwhile.
//
// A ClusterClient reads the slot map every minute, and at once only when
// a node answers MOVED, ASK or READONLY, which a master that died never
// does: its slots' calls would fail until the next reading, long after a
// replica took them over. So after a call that failed without a reply (a
// connection refused or broken, a timeout) the Store has the client read
// the map anew (ReloadState), at most every 100 ms. docs/library.md
// ("Redis Cluster") gives the figures of a reshard and of a kill -9 of a
// master under traffic.
//
// Redis scripts compute in double precision, exact up to 2^53, which is
// where the Limiter bounds limits, costs and burst (expose.MaxLimit);
// a caller of Do of its own must keep to it too.
package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/gather"
)

var _ driver.Store = (*Store)(nil)

// expiryGrace is how long every key the scripts expire outlives the end
// its times call for: a window's end, a drained smooth instant, a penalty,
// the latest lease. The scripts decide by the times a key holds, from the
// Limiter's clock, while Redis expires keys on its own: a call whose clock
// read is behind Redis's (a process's clock that lags, or a read that
// waited behind a stall, a GC pause or the connection pool) would
// otherwise find a key gone whose end it has not reached, and start it
// over: over-admission. A key kept past its end is one the scripts
// already read correctly (its times say it is over). A second covers
// NTP-level skew and stalls of a loaded process, at the cost of keeping a
// short window's keys that much longer (a 1-second window's for 2
// seconds at most). bucket4j keeps its Redis buckets past the refill
// likewise (keepAfterRefillDuration).
const expiryGrace = time.Second

const (
	// replyTTL is how long a Reset's reply is kept for a repeat of the call.
	replyTTL = 20 * time.Second
	// maxCall bounds a pipeline, and so the last repeat go-redis may send,
	// well inside replyTTL (the margin covers a reconnect's handshake).
	maxCall = 10 * time.Second
)

// Boxed once, not per call: arguments every command carries.
var (
	replyMS any = replyTTL.Milliseconds()
	noToken any = "0"
	opArg       = [...]any{driver.OpAllow: "allow", driver.OpPeek: "peek", driver.OpRefund: "refund", driver.OpReset: "reset"}
)

var (
	callPrefix = newCallPrefix()
	callSeq    atomic.Uint64
	// tokenSeq numbers the scripts that write counters (see token). It
	// starts at a random place, so that two processes seldom use the same
	// numbers at the same time.
	tokenSeq = newTokenSeq()
)

// newCallPrefix returns 72 random bits: calls from two processes never
// share a reply key.
func newCallPrefix() string {
	var b [9]byte
	_, _ = rand.Read(b[:]) // never fails (it crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func newTokenSeq() *atomic.Uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	var seq atomic.Uint32
	seq.Store(binary.LittleEndian.Uint32(b[:]))
	return &seq
}

// token returns the next script's token: a number of 31 bits, which the
// hashes it writes keep in their field r (see fast.lua), where Redis
// stores it in 5 bytes (and its negative, a denial's, too). It is never 0,
// which turns the records off. A repeat is recognised by its token in a
// hash that nothing else wrote since, so a token only has to differ from
// the few that wrote the same hash around the same time: the chance that a
// retry meets its own number written by someone else is 2^-31.
func token() any {
	for {
		if t := tokenSeq.Add(1) & (1<<31 - 1); t != 0 {
			return strconv.FormatUint(uint64(t), 10)
		}
	}
}

// errLost is a repeat's answer when its first attempt's outcome cannot be
// told: it may have counted, and is not counted again.
var errLost = errors.New("the reply to an earlier attempt was lost and its outcome cannot be told: it may have counted")

// Store is a driver.Store on Redis. It is safe for concurrent use.
type Store struct {
	client  redis.UniversalClient
	scripts *scripts        // builtScripts but in a test's Store
	gather  *gather.Batcher // nil: no pipelining
	// A pipeline's fast-path calls go in one script: on one server, until
	// it answers that the keys of one script must share a slot.
	combine atomic.Bool
	// policy and persistence are CheckEviction's and CheckPersistence's
	// last answers, kept for PolicyCheckInterval of now (time.Now; tests
	// set another).
	policy, persistence atomic.Pointer[policyAnswer]
	now                 func() time.Time
	// A combined script's bounds (64 calls, 16 KiB; tests set others).
	scriptCalls, scriptBytes int
	// The deadlines of calls sent without one (see send).
	bounds bounds
	// A Cluster client (nil for any other), which reads its slot map anew
	// when asked; reloaded is when it was asked last (Unix ns; see
	// reloadOnFailure).
	cluster  stateReloader
	reloaded atomic.Int64
}

// Option configures a Store.
type Option func(*config)

type config struct {
	maxBatch, maxInFlight    int
	scriptPerCall            bool
	scriptCalls, scriptBytes int
	build                    *build // a test's scripts (export_test.go); nil: builtScripts
}

// WithMaxBatch sets how many calls one pipeline may carry (default 128).
// 1 turns pipelining off: every call is then its own command, sent on the
// caller's goroutine.
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// WithMaxInFlight sets how many pipelines may be in flight at once, each on
// its own connection (default 4). Calls wait for a free slot, so too few
// slots make callers queue behind a round trip when few of them are
// running; more slots send smaller pipelines, which costs the server and
// the client a write and a read per pipeline (docs/benchmarks.md, "Redis at
// 16 and 64 callers", compares 1, 2, 4 and 8). Keep the client's PoolSize above it: the
// Store's other commands (CheckEviction, a store clock's TIME) and every
// call under WithMaxBatch(1) take connections of their own.
func WithMaxInFlight(n int) Option { return func(c *config) { c.maxInFlight = n } }

// WithScriptPerCall makes every call of a pipeline a script of its own,
// as on a Redis Cluster or a Ring, instead of one fast.lua script for a
// pipeline's fast-path calls (see the package doc). Give it for a
// *redis.Client whose "server" routes each command by its first key to one
// of several servers without checking the others: a proxy (twemproxy,
// Envoy's Redis proxy) in front of a shard set. The countlimit command
// gives it for a URL with script_per_call=true.
func WithScriptPerCall() Option { return func(c *config) { c.scriptPerCall = true } }

// New returns a Store on client. It pipelines concurrent calls; options
// tune that.
func New(client redis.UniversalClient, opts ...Option) *Store {
	cfg := config{maxBatch: 128, maxInFlight: 4, scriptCalls: 64, scriptBytes: 16 << 10}
	for _, o := range opts {
		o(&cfg)
	}
	_, single := client.(*redis.Client) // one server, or Sentinel's master
	s := &Store{client: client, scripts: builtScripts, now: time.Now, scriptCalls: cfg.scriptCalls, scriptBytes: cfg.scriptBytes}
	if cfg.build != nil {
		s.scripts = newScripts(*cfg.build)
	}
	s.combine.Store(single && !cfg.scriptPerCall)
	s.cluster, _ = client.(stateReloader)
	if cfg.maxBatch > 1 {
		s.gather = gather.New(s.send, cfg.maxBatch, cfg.maxInFlight)
		// go-redis ends a call at its context's deadline (with
		// ContextTimeoutEnabled, which the package doc asks for).
		s.gather.SendAlone()
	}
	return s
}

// Do implements driver.Store: r joins a pipeline (see the package doc). A
// call that a Cluster slot in migration refused, having run nothing, is
// sent anew after a pause (see movingWait), from its caller's goroutine:
// the calls that shared its pipeline have their answers meanwhile.
func (s *Store) Do(ctx context.Context, r *driver.Request) error {
	var wait movingWait
	for {
		var err error
		if s.gather != nil {
			err = wrap(s.gather.Do(ctx, r))
		} else {
			err = s.pipeline(ctx, []*driver.Request{r})
		}
		if err == nil || !wait.again(ctx, err) {
			return err
		}
	}
}

// pipeline sends reqs together in one pipeline of their own, on the
// caller's goroutine, in their order (what a Store with WithMaxBatch(1)
// does with one, and tests with several).
func (s *Store) pipeline(ctx context.Context, reqs []*driver.Request) error {
	if len(reqs) == 0 {
		return nil
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > maxCall {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxCall)
		defer cancel()
	}
	calls := make([]gather.Call, len(reqs))
	ptrs := make([]*gather.Call, len(reqs))
	for i, r := range reqs {
		calls[i].Req = *r // shares r.Checks: the states land there
		ptrs[i] = &calls[i]
	}
	s.run(ctx, ptrs, false)
	for i := range calls {
		if err := calls[i].Err; err != nil {
			return wrap(err)
		}
	}
	return nil
}

func wrap(err error) error {
	if err == nil {
		return nil
	}
	return driver.Unavailable(fmt.Errorf("redisstore: %w", err))
}

// send is the Batcher's Send: one pipeline, bounded by its callers' latest
// deadline and by maxCall.
func (s *Store) send(ctx context.Context, calls []*gather.Call) {
	now := time.Now()
	end := now.Add(maxCall)
	var latest time.Time
	for _, c := range calls {
		d, ok := c.Deadline()
		if !ok || d.After(end) {
			latest = end
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	switch d, ok := ctx.Deadline(); {
	case ok && !d.After(latest):
		// A call sent alone comes with its caller's context, which needs
		// no other deadline when it has one in time.
	case latest.Equal(end) && ctx.Done() == nil:
		// One that its caller can neither cancel nor time out (a worker's
		// context.Background): a deadline shared with others.
		ctx = s.bounds.within(ctx, now)
	default:
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	s.run(ctx, calls, s.combine.Load())
}

// run sends calls in one round trip and gives each call its outcome. Each
// call is a script of its own but, with combine, fast-path calls go
// together in fast.lua scripts (see combined).
func (s *Store) run(ctx context.Context, calls []*gather.Call, combine bool) {
	var one [1]redis.Cmder
	cmds := one[:] // the commands sent
	// With combined scripts: calls[i]'s command is cmds[of[i]], its place
	// in it at[i], and cmds[j] carries size[j] calls. of nil: calls[i]'s
	// command is cmds[i], of one call.
	var of, at, size []int32
	if len(calls) > 1 {
		cmds = make([]redis.Cmder, 0, len(calls))
		if combine {
			cmds, of, at, size = s.scripts.combined(ctx, cmds, calls, s.scriptCalls, s.scriptBytes)
		}
	}
	if of == nil {
		cmds = cmds[:0]
		followed := s.followed(calls)
		for i, c := range calls {
			cmds = append(cmds, s.scripts.command(ctx, &c.Req, s.cluster == nil || (followed != nil && followed[i])))
		}
	}
	s.execLoading(ctx, cmds)
	var refused []bool // by command
	for j := range size {
		if size[j] > 1 && s.refused(cmds[j]) {
			if refused == nil {
				refused = make([]bool, len(cmds))
			}
			refused[j] = true
		}
	}

	var alone []*gather.Call // calls to send again, each a script of its own
	for i, c := range calls {
		j, pos, k := i, 0, 1
		if of != nil {
			j, pos, k = int(of[i]), int(at[i]), int(size[of[i]])
			if refused != nil && refused[j] {
				alone = append(alone, c)
				continue
			}
		}
		var done bool
		if done, c.Err = finish(&c.Req, cmds[j], pos, k); !done {
			alone = append(alone, c)
		}
		c.Err = s.moving(cmds[j], c.Err)
	}
	if alone == nil {
		return
	}
	// A call that fails alone fails as it did in the combined script, with
	// its error (see fast.lua). Every call goes with its logs, which a call
	// that asked for them needs, and which cost a call that failed in a
	// combined script (on one server) nothing.
	cmds = cmds[:0]
	for _, c := range alone {
		cmds = append(cmds, s.scripts.command(ctx, &c.Req, true))
	}
	s.execLoading(ctx, cmds)
	for i, c := range alone {
		c.Err = s.moving(cmds[i], finishAlone(&c.Req, cmds[i]))
	}
}

// followed reports, on a Cluster, which of calls a later one of them on
// the same id follows (nil when none is, and off a Cluster). Such a call
// names every log (see appendKeys): one given none may have to go again
// after its pipeline, and so after a later call on its keys, while a
// pipeline's calls apply in the order they came.
func (s *Store) followed(calls []*gather.Call) []bool {
	if s.cluster == nil || len(calls) < 2 {
		return nil
	}
	var out []bool
	mark := func(i int) {
		if out == nil {
			out = make([]bool, len(calls))
		}
		out[i] = true
	}
	if len(calls) <= 16 {
		for i, c := range calls {
			for _, d := range calls[i+1:] {
				if d.Req.ID == c.Req.ID {
					mark(i)
					break
				}
			}
		}
		return out
	}
	last := make(map[string]int, len(calls))
	for i, c := range calls {
		last[c.Req.ID] = i
	}
	for i, c := range calls {
		if last[c.Req.ID] > i {
			mark(i)
		}
	}
	return out
}

// errLogAgain is the error of a call that asked for its sliding logs when
// it had them: a script that does not know its keys.
var errLogAgain = errors.New("the script asked for the sliding logs it was given")

// refused reports whether the server refused cmd, a combined fast.lua
// script, as a whole with an error of its own: the script then applied
// nothing (each of its calls fails inside it on its own, and it writes
// nothing outside them), and its calls can go again alone. A server that wants a script's keys in one
// slot (a Cluster node, or a proxy that checks) turns combining off for
// good.
func (s *Store) refused(cmd redis.Cmder) bool {
	err := cmd.Err()
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) {
		return false // a reply, or a connection's error: nothing to send again
	}
	for _, p := range [...]string{"CROSSSLOT", "MOVED ", "ASK "} {
		if redis.HasErrorPrefix(err, p) {
			s.combine.Store(false)
		}
	}
	return true
}

// execLoading sends cmds in one round trip (see exec) and sends those the
// server answered NOSCRIPT again, in one more, with EVAL of the script's
// source; cmds[i] is then that EVAL. A connection that failed has a
// Cluster's slot map read anew (see reloadOnFailure).
func (s *Store) execLoading(ctx context.Context, cmds []redis.Cmder) {
	defer s.reloadOnFailure(ctx, cmds)
	s.exec(ctx, cmds)
	var again []redis.Cmder
	for i, cmd := range cmds {
		// (HasErrorPrefix allocates even for a nil error: ask only on one.)
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if again == nil {
				again = make([]redis.Cmder, 0, len(cmds)-i)
			}
			cmds[i] = s.scripts.withSource(ctx, cmd)
			again = append(again, cmds[i])
		}
	}
	if again != nil {
		// EVAL loads the script on the node of the call's keys as it runs.
		s.exec(ctx, again)
	}
}

// exec sends cmds in one round trip: a plain command when there is one,
// else a pipeline. Each command keeps its own outcome.
func (s *Store) exec(ctx context.Context, cmds []redis.Cmder) {
	if len(cmds) == 1 {
		_ = s.client.Process(ctx, cmds[0])
		return
	}
	p := s.client.Pipeline()
	if s.cluster != nil {
		guarded(ctx, p, cmds)
	} else {
		_ = p.BatchProcess(ctx, cmds...)
	}
	_, _ = p.Exec(ctx)
}
