// Package redisdb leases logical databases (SELECT n) of one Redis server
// to tests, empty when handed over and flushed when given back, so that
// tests and test processes sharing the server never see each other's keys:
// the core of redisstoretest and internal/testbackend.
//
// The databases handed out are 1 to N-1 (N is the server's "databases"
// setting, 16 by default), except the one the server's URL names, which is
// left to whoever else uses the server. A lease is a key
// "redisstoretest:lease:<n>" in database 0, kept alive while its holder
// runs and expiring a minute after its process dies; Acquire waits (up to a
// minute) while all are leased. The server must be a single Redis, not a
// Cluster, which has only database 0.
package redisdb

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/internal/redisurl"
)

const (
	leaseTTL  = time.Minute
	leaseWait = time.Minute
)

// LeasePrefix begins the key of every lease, in database 0.
const LeasePrefix = "redisstoretest:lease:"

func leaseKey(db int) string { return LeasePrefix + strconv.Itoa(db) }

// Both act only while the lease is still the caller's (its token).
var (
	//go:embed renew.lua
	renewLua   string
	renewLease = redis.NewScript(renewLua)
	//go:embed release.lua
	releaseLua   string
	releaseLease = redis.NewScript(releaseLua)
)

// Lease is a logical database leased to its holder until Release.
type Lease struct {
	url   string         // the server's URL, naming the leased database
	opts  *redis.Options // on the leased database
	admin *redis.Client  // on database 0, where the lease is
	db    *redis.Client  // on the leased database, to flush it
	token string

	stop, stopped chan struct{}
}

// Acquire leases a database of the server at serverURL, flushes it (whoever
// held it last may have died before flushing it), and keeps the lease
// alive until Release. ctx bounds the wait for a free database too.
func Acquire(ctx context.Context, serverURL string) (*Lease, error) {
	opts, err := redisurl.Options(serverURL)
	if err != nil {
		return nil, fmt.Errorf("parse the Redis URL: %w", err)
	}
	l := &Lease{opts: opts, admin: redisurl.OnDB(opts, 0), stop: make(chan struct{}), stopped: make(chan struct{})}
	db, token, err := acquire(ctx, l.admin, opts.DB)
	if err != nil {
		l.admin.Close()
		return nil, fmt.Errorf("lease a database of the Redis at %s: %w", opts.Addr, err)
	}
	l.url, err = redisurl.WithDB(serverURL, db)
	if err != nil { // ParseURL took it: cannot happen
		l.admin.Close()
		return nil, fmt.Errorf("parse the Redis URL: %w", err)
	}
	l.opts.DB, l.token = db, token
	l.db = redisurl.OnDB(l.opts, db)
	go l.renew()
	if err := l.db.FlushDB(ctx).Err(); err != nil {
		_ = l.Release(ctx)
		return nil, fmt.Errorf("flush database %d of the Redis at %s: %w", db, opts.Addr, err)
	}
	return l, nil
}

// URL returns the server's URL naming the leased database, for code that
// opens its own client.
func (l *Lease) URL() string { return l.url }

// Client returns a new client on the leased database, with the server
// URL's settings otherwise (and ContextTimeoutEnabled, see redisurl). The
// caller closes it.
func (l *Lease) Client() *redis.Client { return redisurl.OnDB(l.opts, l.opts.DB) }

// Release flushes the database and gives it back. It returns the flush's
// error; the lease is given back either way.
func (l *Lease) Release(ctx context.Context) error {
	close(l.stop)
	<-l.stopped
	err := l.db.FlushDB(ctx).Err()
	if err != nil {
		err = fmt.Errorf("flush database %d of the Redis at %s: %w", l.opts.DB, l.opts.Addr, err)
	}
	_ = releaseLease.Run(ctx, l.admin, []string{leaseKey(l.opts.DB)}, l.token).Err()
	l.db.Close()
	l.admin.Close()
	return err
}

// renew keeps the lease alive until Release.
func (l *Lease) renew() {
	defer close(l.stopped)
	tick := time.NewTicker(leaseTTL / 4)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = renewLease.Run(ctx, l.admin, []string{leaseKey(l.opts.DB)}, l.token, leaseTTL.Milliseconds()).Err()
			cancel()
		}
	}
}

// acquire leases a database other than 0 and skip, waiting while all are
// leased.
func acquire(ctx context.Context, admin *redis.Client, skip int) (db int, token string, err error) {
	n := 16
	if cfg, err := admin.ConfigGet(ctx, "databases").Result(); err == nil {
		if v, err := strconv.Atoi(cfg["databases"]); err == nil {
			n = v
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	token = hex.EncodeToString(b[:])
	deadline := time.Now().Add(leaseWait)
	for {
		candidates := 0
		for db := 1; db < n; db++ {
			if db == skip {
				continue
			}
			candidates++
			ok, err := admin.SetNX(ctx, leaseKey(db), token, leaseTTL).Result()
			if err != nil {
				return 0, "", err
			}
			if ok {
				return db, token, nil
			}
		}
		if candidates == 0 {
			return 0, "", fmt.Errorf("no logical database to lease: the server has %d, and 0 and %d are not handed out", n, skip)
		}
		if time.Now().After(deadline) {
			return 0, "", fmt.Errorf("all %d logical databases were leased to other tests for %v (keys %s* in database 0)", candidates, leaseWait, LeasePrefix)
		}
		select {
		case <-ctx.Done():
			return 0, "", errors.Join(errors.New("waiting for a free logical database"), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
