// Package redisdb leases logical databases (SELECT n) of one Redis server
// to tests, empty when handed over and emptied when given back, so that
// tests and test processes sharing the server never see each other's keys:
// the core of redisstoretest and internal/testkit/testbackend.
//
// It deletes only what tests wrote. A database is handed out only if it is
// empty, or if a test claimed it before (and died before giving it back);
// a database that holds keys no test wrote is left alone, whoever's they
// are. The databases are 1 to N-1 (N is the server's "databases" setting,
// 16 by default), except the one the server's URL names, which is left to
// whoever else uses the server. In database 0 it keeps two keys per
// database in use: the lease "redisstoretest:lease:<n>", kept alive while
// its holder runs and expiring a minute after its process dies, and the
// claim "redisstoretest:claimed:<n>", which says that database n was empty
// when a test took it, so what it holds is tests' (both are deleted when
// the database is given back). Acquire waits (up to a minute) while every
// database is leased or holds others' keys. The server must be a single
// Redis, not a Cluster, which has only database 0.
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

	"github.com/countlimit/countlimit/internal/store/redisurl"
)

const (
	leaseTTL  = time.Minute
	leaseWait = time.Minute
)

// LeasePrefix begins the key of every lease, in database 0.
const LeasePrefix = "redisstoretest:lease:"

// ClaimPrefix begins the key, in database 0, that marks a database as
// claimed by a test: empty when claimed, so every key in it is a test's.
const ClaimPrefix = "redisstoretest:claimed:"

func leaseKey(db int) string { return LeasePrefix + strconv.Itoa(db) }

func claimKey(db int) string { return ClaimPrefix + strconv.Itoa(db) }

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

// Acquire leases a database of the server at serverURL that is empty, or
// that a test claimed before (whose holder died before giving it back: it
// is emptied), and keeps the lease alive until Release. ctx bounds the
// wait for a free database too.
func Acquire(ctx context.Context, serverURL string) (*Lease, error) {
	opts, err := redisurl.Options(serverURL)
	if err != nil {
		return nil, fmt.Errorf("parse the Redis URL: %w", err)
	}
	l := &Lease{opts: opts, admin: redisurl.OnDB(opts, 0), stop: make(chan struct{}), stopped: make(chan struct{})}
	db, token, err := acquire(ctx, l.admin, opts)
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
	return l, nil
}

// URL returns the server's URL naming the leased database, for code that
// opens its own client.
func (l *Lease) URL() string { return l.url }

// Client returns a new client on the leased database, with the server
// URL's settings otherwise (and ContextTimeoutEnabled, see redisurl). The
// caller closes it.
func (l *Lease) Client() *redis.Client { return redisurl.OnDB(l.opts, l.opts.DB) }

// Release empties the database (it was empty when claimed: every key in
// it is a test's), deletes its claim and gives it back. It returns the
// flush's error; the lease is given back either way, and the claim is
// kept when the flush failed, so that the next test to take the database
// empties it.
func (l *Lease) Release(ctx context.Context) error {
	close(l.stop)
	<-l.stopped
	err := l.db.FlushDB(ctx).Err()
	if err != nil {
		err = fmt.Errorf("flush database %d of the Redis at %s: %w", l.opts.DB, l.opts.Addr, err)
	} else {
		_ = l.admin.Del(ctx, claimKey(l.opts.DB)).Err()
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

// acquire leases a database other than 0 and the URL's that is empty or
// claimed by a test, waiting while there is none.
func acquire(ctx context.Context, admin *redis.Client, opts *redis.Options) (db int, token string, err error) {
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
		candidates, others := 0, 0
		for db := 1; db < n; db++ {
			if db == opts.DB {
				continue
			}
			candidates++
			ok, err := admin.SetNX(ctx, leaseKey(db), token, leaseTTL).Result()
			if err != nil {
				return 0, "", err
			}
			if !ok {
				continue
			}
			mine, err := claim(ctx, admin, opts, db)
			if err == nil && mine {
				return db, token, nil
			}
			_ = releaseLease.Run(ctx, admin, []string{leaseKey(db)}, token).Err()
			if err != nil {
				return 0, "", err
			}
			others++
		}
		if candidates == 0 {
			return 0, "", fmt.Errorf("no logical database to lease: the server has %d, and 0 and %d are not handed out", n, opts.DB)
		}
		if time.Now().After(deadline) {
			return 0, "", fmt.Errorf("of %d logical databases, %d hold keys no test wrote (left alone) and the others were leased to other tests for %v (keys %s* in database 0); point COUNTLIMIT_TEST_REDIS_URL at a Redis for tests",
				candidates, others, leaseWait, LeasePrefix)
		}
		select {
		case <-ctx.Done():
			return 0, "", errors.Join(errors.New("waiting for a free logical database"), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// claim makes leased database db a test's: if a test claimed it before,
// whatever it holds is tests' and is flushed; if it is empty, it is
// claimed; if it holds keys and no test claimed it, they are someone
// else's and claim reports false, touching nothing.
func claim(ctx context.Context, admin *redis.Client, opts *redis.Options, db int) (bool, error) {
	c := redisurl.OnDB(opts, db)
	defer c.Close()
	claimed, err := admin.Exists(ctx, claimKey(db)).Result()
	if err != nil {
		return false, err
	}
	if claimed == 1 {
		return true, c.FlushDB(ctx).Err()
	}
	size, err := c.DBSize(ctx).Result()
	if err != nil || size > 0 {
		return false, err
	}
	return true, admin.Set(ctx, claimKey(db), "1", 0).Err()
}
