package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// PolicyCheckInterval is how long CheckEviction and CheckPersistence keep
// the server's answer.
const PolicyCheckInterval = time.Minute

// ErrEvictionPolicy is in the error of CheckEviction, with
// countlimit.ErrUnavailable, when a server's maxmemory-policy is not
// noeviction.
var ErrEvictionPolicy = errors.New("redisstore: maxmemory-policy evicts keys")

// ErrNoPersistence is what CheckPersistence returns when a server keeps its
// data in memory only: neither AOF (appendonly yes) nor RDB snapshots (a
// save schedule) are on. It is not countlimit.ErrUnavailable: the store
// works, and forgets every count when that server restarts. Its text names
// no address or user, so that a health endpoint may show it.
var ErrNoPersistence = errors.New(`redisstore: Redis persists nothing (appendonly no, save ""): ` +
	"a restart forgets every count, penalty, sliding log and lease, and every id is allowed anew; " +
	"turn on AOF (appendonly yes) or RDB snapshots (save) if counts must outlive a restart")

// ErrPolicyUnknown is in the error of CheckEviction and CheckPersistence
// when a server answers but will not say the setting asked for: an ACL
// user without +config, a managed service or a proxy that hides or renames
// CONFIG. The store works; make sure of the setting where the service is
// set up.
var ErrPolicyUnknown = errors.New("redisstore: could not read the server's configuration")

// evictionError is the error for a server whose policy evicts. Its text
// names the policy and no address or user, so that a health endpoint may
// show it.
type evictionError struct{ policy string }

func (e *evictionError) Error() string {
	return fmt.Sprintf("redisstore: maxmemory-policy is %q, so a Redis that runs out of memory evicts keys: "+
		"counters vanish and their ids are allowed beyond their limits, with no error; run Redis with maxmemory-policy noeviction", e.policy)
}

func (e *evictionError) Is(target error) bool { return target == ErrEvictionPolicy }

// policyAnswer is a check's kept answer and when it was asked.
type policyAnswer struct {
	err error
	at  time.Time
}

// CheckEviction reports whether the server keeps every key until it
// expires, as countlimit's counts need: only maxmemory-policy noeviction
// does. Under any other policy a Redis that reaches its maxmemory drops
// keys to make room, and a counter that goes starts over, so its id is
// allowed beyond its limit; the volatile-* policies drop counters too, as
// every counter but a lifetime one has a TTL. With noeviction a full Redis
// refuses writes instead, and checks fail with countlimit.ErrUnavailable.
//
// It asks the server with CONFIG GET maxmemory-policy (on a Cluster every
// master, on a Ring every shard) and returns:
//
//   - nil for noeviction;
//   - for any other policy, an error wrapping ErrEvictionPolicy and
//     countlimit.ErrUnavailable whose text names maxmemory-policy and the
//     policy, and no address or user;
//   - when the server refuses CONFIG GET or does not say, an error wrapping
//     ErrPolicyUnknown and the server's reply;
//   - when the server does not answer, or is loading, an error wrapping
//     countlimit.ErrUnavailable.
//
// An answer, a refusal included, is kept for PolicyCheckInterval, and calls
// until then return it without asking, so a health probe may call
// CheckEviction as often as it likes; a server that did not answer is asked
// again at the next call. Checks never call it: the policy is reported, not
// enforced. It is safe for concurrent use.
func (s *Store) CheckEviction(ctx context.Context) error {
	return s.checkKept(ctx, &s.policy, policyOf, ErrEvictionPolicy, "maxmemory-policy")
}

// CheckPersistence reports whether the server keeps its data across a
// restart. A Redis with neither AOF nor RDB snapshots comes back from a
// restart empty: every count, penalty, sliding log and lease is gone, and
// every id is allowed again as if it had never been seen, with no error.
// Many caches run so on purpose; whether rate limits may is the
// operator's choice, so this is a warning to show, not a failure. What
// snapshots, AOF and a failover to a replica can lose is in the package
// doc, under Persistence.
//
// It asks the server with CONFIG GET appendonly and, when AOF is off,
// CONFIG GET save (on a Cluster every master, on a Ring every shard) and
// returns:
//
//   - nil when appendonly is yes or save holds a schedule;
//   - ErrNoPersistence when appendonly is no and save is empty (on a
//     Cluster or a Ring, on any of its servers); it is not
//     countlimit.ErrUnavailable;
//   - when the server refuses CONFIG GET or does not say, an error wrapping
//     ErrPolicyUnknown and the server's reply;
//   - when the server does not answer, or is loading, an error wrapping
//     countlimit.ErrUnavailable.
//
// It sees the servers the client talks to, not their replicas: a master
// without persistence whose replicas persist is reported, since a restart
// of that master empties it, and its replicas follow it. Answers are kept
// as CheckEviction keeps them, for PolicyCheckInterval, each check its
// own. Checks never call it. It is safe for concurrent use.
func (s *Store) CheckPersistence(ctx context.Context) error {
	return s.checkKept(ctx, &s.persistence, persistenceOf, ErrNoPersistence, "appendonly")
}

// checkKept returns kept's answer while it is younger than
// PolicyCheckInterval, else asks each server with of (see askEach) and
// keeps what they answered. bad is the finding of of, and what names the
// setting for an error that reaches no server.
func (s *Store) checkKept(ctx context.Context, kept *atomic.Pointer[policyAnswer], of func(context.Context, redis.Cmdable) error, bad error, what string) error {
	now := s.now()
	if a := kept.Load(); a != nil {
		if age := now.Sub(a.at); age >= 0 && age < PolicyCheckInterval {
			return a.err
		}
	}
	err := s.askEach(ctx, of, bad, what)
	if !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, bad) {
		kept.Store(&policyAnswer{err: err, at: now})
	}
	return err
}

// askEach asks each server that holds counters with of. Of their answers,
// bad wins over a server that did not answer, which wins over one that
// would not say.
func (s *Store) askEach(ctx context.Context, of func(context.Context, redis.Cmdable) error, bad error, what string) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	ask := func(ctx context.Context, c redis.Cmdable) error {
		err := of(ctx, c)
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		return nil
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return ask(ctx, n) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return ask(ctx, n) })
	default:
		err = ask(ctx, c)
	}
	if err != nil {
		errs = append(errs, driver.Unavailable(fmt.Errorf("redisstore: CONFIG GET %s: %w", what, err)))
	}
	for _, is := range []func(error) bool{
		func(err error) bool { return errors.Is(err, bad) },
		func(err error) bool { return errors.Is(err, countlimit.ErrUnavailable) },
		func(err error) bool { return err != nil },
	} {
		for _, err := range errs {
			if is(err) {
				return err
			}
		}
	}
	return nil
}

// transient are the replies of a server that cannot answer yet, which
// count as no answer rather than a refusal.
var transient = [...]string{"LOADING ", "MASTERDOWN ", "BUSY ", "TRYAGAIN ", "CLUSTERDOWN "}

// policyOf asks one server for its policy.
func policyOf(ctx context.Context, c redis.Cmdable) error {
	p, err := configGet(ctx, c, "maxmemory-policy")
	switch {
	case err != nil:
		return err
	case p != "noeviction":
		return driver.Unavailable(&evictionError{policy: p})
	}
	return nil
}

// persistenceOf asks one server whether it writes an AOF or takes RDB
// snapshots.
func persistenceOf(ctx context.Context, c redis.Cmdable) error {
	aof, err := configGet(ctx, c, "appendonly")
	switch {
	case err != nil:
		return err
	case aof == "yes":
		return nil
	case aof != "no":
		return fmt.Errorf("%w: CONFIG GET appendonly answered %q", ErrPolicyUnknown, aof)
	}
	save, err := configGet(ctx, c, "save")
	switch {
	case err != nil:
		return err
	case strings.TrimSpace(save) != "":
		return nil
	}
	return ErrNoPersistence
}

// configGet asks one server for the setting name: a refusal is
// ErrPolicyUnknown, no answer countlimit.ErrUnavailable.
func configGet(ctx context.Context, c redis.Cmdable, name string) (string, error) {
	m, err := c.ConfigGet(ctx, name).Result()
	var rerr redis.Error
	switch {
	case err == nil:
	case errors.As(err, &rerr) && !hasPrefix(rerr.Error(), transient[:]):
		return "", fmt.Errorf("%w: CONFIG GET %s: %w", ErrPolicyUnknown, name, err)
	default:
		return "", driver.Unavailable(fmt.Errorf("redisstore: CONFIG GET %s: %w", name, err))
	}
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("%w: CONFIG GET %s answered nothing", ErrPolicyUnknown, name)
	}
	return v, nil
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
