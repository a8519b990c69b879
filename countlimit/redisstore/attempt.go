package redisstore

import (
	"reflect"
	"sync"

	"github.com/redis/go-redis/v9"
)

// attempt is a script's argument that tells it whether an earlier send of
// its command may have run: go-redis writes an argument that is an
// encoding.BinaryMarshaler by calling MarshalBinary each time it writes the
// command to a connection, once more for each retry and each redirect. A
// script sent again after a send that may have run may only answer from its
// records (see the package doc, Lost replies); one sent again after sends
// that the server refused before running anything (MOVED, ASK, TRYAGAIN: a
// Cluster slot that moves) applies the call, as the first send would have.
//
// It tells them apart by the command's error as each write finds it:
// go-redis records the outcome of a send on the command (Client.Process
// and every pipeline do) before it sends the command again, on a Cluster
// after every redirect and retry, where each node's client retries nothing
// (ClusterOptions.MaxRetries, -1 by default). A write that finds an error
// that refuses, and that the write before did not find (so it is the
// outcome of that write), knows that write ran nothing. Anything else may
// have run: a connection that broke after the write, a timeout, a reply
// that was read, or no new outcome at all (a client whose own retries,
// MaxRetries above 0, send again without recording one), and from then on
// every send says "may have run". A connection refused, or a pool that had
// none to give, writes nothing, and so is no send.
type attempt struct {
	mu     sync.Mutex
	cmd    redis.Cmder // the command that carries it
	writes int
	ran    bool  // an earlier write may have run
	seen   error // cmd's error as the last write found it
}

var (
	firstAttempt = []byte("0")
	laterAttempt = []byte("1")
)

// newAttempt returns the attempt of a command not yet made: carry sets
// its command.
func newAttempt() *attempt { return &attempt{} }

// carry makes cmd, the command whose arguments hold a, a's command, and
// returns cmd.
func (a *attempt) carry(cmd redis.Cmder) redis.Cmder {
	a.cmd = cmd
	return cmd
}

// MarshalBinary implements encoding.BinaryMarshaler: "1" when an earlier
// write of the command may have run, else "0".
func (a *attempt) MarshalBinary() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var err error
	if a.cmd != nil {
		err = a.cmd.Err()
	}
	if a.writes > 0 && !(refusal(err) && fresh(err, a.seen)) {
		a.ran = true
	}
	a.writes++
	a.seen = err
	if a.ran {
		return laterAttempt, nil
	}
	return firstAttempt, nil
}

// ranNothing reports whether no write of the command may have run, its
// last one included: the server refused every one (see MarshalBinary).
func (a *attempt) ranNothing() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.writes == 0 {
		return true
	}
	err := a.cmd.Err()
	return !a.ran && refusal(err) && fresh(err, a.seen)
}

// String keeps a command's printed form (logs, hooks) from counting as a write.
func (a *attempt) String() string { return "attempt" }

// successor returns the attempt of a command sent in place of a's, whose
// last write the server answered NOSCRIPT (see withSource): that write ran
// nothing, so the new command's first write may have been preceded by a
// run only where a's earlier writes may have run.
func (a *attempt) successor() *attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &attempt{ran: a.ran}
}

// refusal reports whether err is a server's answer that it ran nothing of
// the command: a Cluster's redirects (MOVED, ASK), a slot in migration
// (TRYAGAIN), a cluster that serves no slot (CLUSTERDOWN), a server that
// loads its data (LOADING), a replica cut off from its master (MASTERDOWN),
// a server that takes no writes (READONLY: a script's first write fails,
// so it wrote nothing), too few replicas to write (NOREPLICAS, likewise), a
// full server (max number of clients) and a script it does not have
// (NOSCRIPT). Every one of these is answered before the script runs, or at
// its first write.
func refusal(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	if _, ok := redis.IsAskError(err); ok {
		return true
	}
	return redis.IsTryAgainError(err) || redis.IsClusterDownError(err) || redis.IsLoadingError(err) ||
		redis.IsMasterDownError(err) || redis.IsReadOnlyError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// fresh reports whether err, a command's error as a write finds it, is
// another error than seen, the one the write before found: an outcome
// recorded since. go-redis makes a new error value for every reply it
// reads; an error of a type that cannot be compared counts as not fresh.
func fresh(err, seen error) bool {
	if err == nil || !reflect.TypeOf(err).Comparable() {
		return false
	}
	return err != seen
}
