package redisstore

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// What a Store does for a Redis Cluster whose slots move and whose masters
// fail (see Cluster in the package doc).

const (
	// migrationPause is the first wait before a call that a slot in
	// migration refused goes again; each further wait doubles, up to
	// maxMigrationPause. A slot's keys move in milliseconds, and the slot
	// is the new node's once the last of them has.
	migrationPause    = 5 * time.Millisecond
	maxMigrationPause = 100 * time.Millisecond
	// reloadEvery bounds how often a Store asks a Cluster client to read
	// the slot map anew after failed connections: an outage fails calls by
	// the thousand, and one read of the map after a promotion is enough.
	reloadEvery = 100 * time.Millisecond
)

// slotMoving is the error of a call that a Cluster slot in migration
// refused, having run nothing: sent anew, it finds the slot moved.
type slotMoving struct{ err error }

func (e *slotMoving) Error() string { return e.err.Error() }
func (e *slotMoving) Unwrap() error { return e.err }

// moving returns err, cmd's outcome, as a slotMoving when a Cluster's slot
// in migration refused cmd's last send (TRYAGAIN: the call's keys are some
// on the old node and some on the new, or not there at all; or a MOVED or
// ASK left when go-redis's redirects ran out) and no earlier send of it may
// have run (see attempt; a lease's op, which carries no attempt, is the
// same op again however often it runs, by its lease's token).
func (s *Store) moving(cmd redis.Cmder, err error) error {
	if err == nil || s.cluster == nil {
		return err
	}
	if _, ok := redis.IsMovedError(err); !ok && !redis.IsTryAgainError(err) {
		if _, ok := redis.IsAskError(err); !ok {
			return err
		}
	}
	args := cmd.Args()
	for i := len(args) - 1; i >= 0; i-- {
		if at, ok := args[i].(*attempt); ok && !at.ranNothing() {
			return err
		}
	}
	return &slotMoving{err}
}

// movingWait is how a call that a slot in migration refused waits before
// it is sent anew: pauses from migrationPause up, doubling, until its
// context ends, and at most maxCall after the first refusal when the
// context has no deadline. Its zero value has not waited yet.
type movingWait struct {
	pause time.Duration
	end   time.Time
}

// again reports whether a call that failed with err goes again, after the
// pause it has waited: only one that a slot in migration refused.
func (w *movingWait) again(ctx context.Context, err error) bool {
	var m *slotMoving
	if !errors.As(err, &m) {
		return false
	}
	now := time.Now()
	if w.pause == 0 {
		w.pause = migrationPause
		w.end = now.Add(maxCall)
		if d, ok := ctx.Deadline(); ok {
			w.end = d
		}
	} else {
		w.pause = min(2*w.pause, maxMigrationPause)
	}
	return now.Add(w.pause).Before(w.end) && sleep(ctx, w.pause)
}

// guarded queues cmds, scripts, on p, a ClusterClient's pipeline, each
// that names more than one key after an EXISTS of its first key. go-redis
// sends a node's part of a pipeline again whole, with the commands that
// ran, when its first command is refused with an error it retries
// (TRYAGAIN); a command that ASK or MOVED sent to another node then goes
// to both, and one that ran goes again as a repeat, which fails when the
// hash was written since. Only a script of several keys meets TRYAGAIN
// (see Cluster in the package doc), and the EXISTS, of one key and in the
// same slot, goes to the same node before it: no part of the pipeline
// starts with it.
func guarded(ctx context.Context, p redis.Pipeliner, cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if args := cmd.Args(); len(args) > 4 {
			if n, ok := args[2].(int); ok && n > 1 && slices.ContainsFunc(args[4:3+n], func(k any) bool { return k != args[3] }) {
				_ = p.Process(ctx, redis.NewIntCmd(ctx, "exists", args[3]))
			}
		}
		_ = p.Process(ctx, cmd)
	}
}

// sleep waits d, or until ctx ends; it reports whether ctx lasted.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// stateReloader is a client that reads a Cluster's slot map anew when
// asked (*redis.ClusterClient).
type stateReloader interface {
	ReloadState(ctx context.Context)
}

// reloadOnFailure asks a Cluster client to read its slot map anew when a
// command of cmds failed without a reply from Redis (a refused or broken
// connection, a timeout), at most once per reloadEvery. go-redis reads the
// map by itself every minute, and at once only when a node answers MOVED,
// ASK or READONLY, which a dead master never does: its slots' calls would
// go on failing for up to a minute after its replica took them over.
func (s *Store) reloadOnFailure(ctx context.Context, cmds []redis.Cmder) {
	if s.cluster == nil {
		return
	}
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && !isReply(err) {
			now := time.Now().UnixNano()
			last := s.reloaded.Load()
			if now-last >= int64(reloadEvery) && s.reloaded.CompareAndSwap(last, now) {
				s.cluster.ReloadState(ctx)
			}
			return
		}
	}
}

// isReply reports whether err is an error reply of a Redis server.
func isReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}
