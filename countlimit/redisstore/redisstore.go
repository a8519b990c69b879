// Package redisstore is the Redis countlimit.Store, on go-redis v9. It works
// with a single server, a Redis Cluster or a failover client: anything that
// is a redis.UniversalClient.
//
// Every operation is one Lua script, run with EVALSHA (and EVAL when the
// server answers NOSCRIPT, after a restart or SCRIPT FLUSH), so each check is
// atomic on the server.
//
// Keys are "countlimit:<use_type>:{<id>}", a hash holding the count, the
// window, the denial tally and the penalty; sliding windows add a sorted set
// "countlimit:<use_type>:{<id>}:log" of the counted events. The hash tag
// {<id>} puts every counter of one id in one Cluster slot, so a multi-rule
// check is one script on one node. In both parts the characters % : { } are
// escaped as %25 %3A %7B %7D, so two different (use_type, id) pairs never
// share a key.
//
// Every key carries a TTL, set relative to the Limiter's clock, that ends
// with its window, penalty or newest sliding event; updates never drop it.
// Lifetime counters are the exception: they have no end, so no TTL.
//
// A lost reply never counts twice. go-redis sends a command again when its
// connection breaks (3 retries by default), and the script may have run
// before the reply was lost: a blind repeat would count an event twice,
// refund twice, or reset away a count made in between. So every write
// (Allow, Refund, Reset; not Peek) names a key unique to the call,
// "countlimit:{<id>}:reply:<token>" (a random prefix per process and a
// counter), in the id's slot. The script keeps its reply there for 20 s
// (one SET PX) and answers a repeat with that reply instead of running
// again. This holds whatever the client's retry settings, on a single
// server, Sentinel or Cluster: the reply is written, and replicated, with
// the counts it describes. (Turning retries off instead is the client's
// setting, not the store's, and turns every broken connection into an
// error.) So that no repeat comes after its reply is gone, a Do gives up
// after 10 s whatever its context allows. A denial is not remembered: its
// repeat counts nothing either. The price is a GET and a SET in the script
// and a short-lived key of about 150 bytes per counted write: some 3 MB of
// Redis memory per 1,000 counted writes a second.
//
// A call that fails with countlimit.ErrUnavailable may or may not have
// counted; calling again is a new event.
//
// go-redis honours a context's deadline only when the client is made with
// ContextTimeoutEnabled: true; otherwise a silent server holds a check until
// the client's ReadTimeout. Either way a failure is countlimit.ErrUnavailable.
//
// Redis scripts compute in double precision: counts and limits above 2^53
// are compared approximately.
package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
)

var _ countlimit.Store = (*Store)(nil)

var (
	//go:embed apply.lua
	applySrc    string
	applyScript = redis.NewScript(applySrc)

	//go:embed reset.lua
	resetSrc    string
	resetScript = redis.NewScript(resetSrc)
)

const (
	// replyTTL is how long a write's reply is kept for a repeat of the call.
	replyTTL = 20 * time.Second
	// maxCall bounds a Do, and so the last repeat go-redis may send, well
	// inside replyTTL (the margin covers a reconnect's handshake).
	maxCall = 10 * time.Second
)

var (
	callPrefix = newCallPrefix()
	callSeq    atomic.Uint64
	replyMS    any = replyTTL.Milliseconds() // boxed once, not per call
)

// newCallPrefix returns 72 random bits: calls from two processes never
// share a reply key.
func newCallPrefix() string {
	var b [9]byte
	_, _ = rand.Read(b[:]) // never fails (it crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// replyKey returns a key unique to one call, in id's slot. No Key starts
// with "countlimit:{": a use type is never empty.
func replyKey(id string) string {
	return "countlimit:{" + escape(id) + "}:reply:" + callPrefix + strconv.FormatUint(callSeq.Add(1), 36)
}

// Store is a countlimit.Store on Redis. It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
}

// New returns a Store on client.
func New(client redis.UniversalClient) *Store { return &Store{client: client} }

// Key returns the Redis key of useType's counter for id.
func Key(useType countlimit.UseType, id string) string {
	return "countlimit:" + escape(string(useType)) + ":{" + escape(id) + "}"
}

// LogKey returns the key of the sliding log beside Key(useType, id).
func LogKey(useType countlimit.UseType, id string) string { return Key(useType, id) + ":log" }

var escaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

func escape(s string) string {
	if !strings.ContainsAny(s, "%:{}") {
		return s
	}
	return escaper.Replace(s)
}

// Do implements countlimit.Store: one script per request. It gives up
// after 10 s, whatever ctx allows (see the package doc).
func (s *Store) Do(ctx context.Context, reqs []*countlimit.Request) error {
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > maxCall {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxCall)
		defer cancel()
	}
	for _, r := range reqs {
		if err := s.do(ctx, r); err != nil {
			return countlimit.Unavailable(fmt.Errorf("redisstore: %w", err))
		}
	}
	return nil
}

func (s *Store) do(ctx context.Context, r *countlimit.Request) error {
	keys := make([]string, 0, 2*len(r.Checks)+1)
	for i := range r.Checks {
		k := Key(r.Checks[i].UseType, r.ID)
		keys = append(keys, k, k+":log")
	}
	if r.Op != countlimit.OpPeek {
		keys = append(keys, replyKey(r.ID))
	}
	if r.Op == countlimit.OpReset {
		return resetScript.Run(ctx, s.client, keys, replyMS).Err()
	}
	args := make([]any, 0, 4+5*len(r.Checks))
	args = append(args, r.Op.String(), r.Now.UnixMicro(), r.N, replyMS)
	for i := range r.Checks {
		c := &r.Checks[i]
		var length int64
		if !c.End.IsZero() {
			length = c.End.Sub(c.Begin).Microseconds()
		}
		args = append(args, c.Limit, c.Begin.UnixMicro(), length, c.Span.Microseconds(), c.Block.Microseconds())
	}
	out, err := applyScript.Run(ctx, s.client, keys, args...).Int64Slice()
	if err != nil {
		return err
	}
	if len(out) != 5*len(r.Checks)+1 {
		return fmt.Errorf("apply.lua returned %d values for %d checks", len(out), len(r.Checks))
	}
	allowed := out[len(out)-1] == 1
	for i := range r.Checks {
		v := out[5*i : 5*i+5]
		r.Checks[i].State = countlimit.State{
			Allowed:      allowed,
			Used:         v[0],
			Begin:        timeOf(v[1]),
			End:          timeOf(v[2]),
			BlockedUntil: timeOf(v[3]),
			FreeAt:       timeOf(v[4]),
		}
	}
	return nil
}

// none is apply.lua's NONE: no time.
const none = -1 << 53

func timeOf(us int64) time.Time {
	if us == none {
		return time.Time{}
	}
	return time.UnixMicro(us)
}
