package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// PolicyCheckInterval is how long CheckEviction keeps the server's answer.
const PolicyCheckInterval = time.Minute

// ErrEvictionPolicy is in the error of CheckEviction, with
// countlimit.ErrUnavailable, when a server's maxmemory-policy is not
// noeviction.
var ErrEvictionPolicy = errors.New("redisstore: maxmemory-policy evicts keys")

// ErrPolicyUnknown is in the error of CheckEviction when a server answers
// but will not say its maxmemory-policy: an ACL user without +config, a
// managed service or a proxy that hides or renames CONFIG. The store works;
// make sure of the policy where the service is set up.
var ErrPolicyUnknown = errors.New("redisstore: could not check maxmemory-policy")

// evictionError is the error for a server whose policy evicts. Its text
// names the policy and no address or user, so that a health endpoint may
// show it.
type evictionError struct{ policy string }

func (e *evictionError) Error() string {
	return fmt.Sprintf("redisstore: maxmemory-policy is %q, so a Redis that runs out of memory evicts keys: "+
		"counters vanish and their ids are allowed beyond their limits, with no error; run Redis with maxmemory-policy noeviction", e.policy)
}

func (e *evictionError) Is(target error) bool { return target == ErrEvictionPolicy }

// policyAnswer is CheckEviction's kept answer and when it was asked.
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
	now := s.now()
	if a := s.policy.Load(); a != nil {
		if age := now.Sub(a.at); age >= 0 && age < PolicyCheckInterval {
			return a.err
		}
	}
	err := s.askPolicy(ctx)
	if !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, ErrEvictionPolicy) {
		s.policy.Store(&policyAnswer{err: err, at: now})
	}
	return err
}

// askPolicy asks each server that holds counters for its policy. Of their
// answers, an evicting policy wins over a server that did not answer, which
// wins over one that would not say.
func (s *Store) askPolicy(ctx context.Context) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	ask := func(ctx context.Context, c redis.Cmdable) error {
		err := policyOf(ctx, c)
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
		errs = append(errs, driver.Unavailable(fmt.Errorf("redisstore: CONFIG GET maxmemory-policy: %w", err)))
	}
	for _, is := range []func(error) bool{
		func(err error) bool { return errors.Is(err, ErrEvictionPolicy) },
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
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	var rerr redis.Error
	switch {
	case err == nil:
	case errors.As(err, &rerr) && !hasPrefix(rerr.Error(), transient[:]):
		return fmt.Errorf("%w: %w", ErrPolicyUnknown, err)
	default:
		return driver.Unavailable(fmt.Errorf("redisstore: CONFIG GET maxmemory-policy: %w", err))
	}
	p, ok := m["maxmemory-policy"]
	switch {
	case !ok:
		return fmt.Errorf("%w: CONFIG GET maxmemory-policy answered no policy", ErrPolicyUnknown)
	case p != "noeviction":
		return driver.Unavailable(&evictionError{policy: p})
	}
	return nil
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
