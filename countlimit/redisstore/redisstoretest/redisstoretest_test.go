package redisstoretest_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/redisstore/redisstoretest"
	"github.com/countlimit/countlimit/internal/store/redisurl"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisdb"
)

// Clients in parallel get databases of their own, empty, flushed and
// released when their tests end.
func TestClient(t *testing.T) {
	ctx := context.Background()
	opts, err := redisurl.Options(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	admin := redisurl.OnDB(opts, 0)
	defer admin.Close()

	var dbs []int
	t.Run("use", func(t *testing.T) {
		a, b := redisstoretest.Client(t), redisstoretest.Client(t)
		for _, c := range []*redis.Client{a, b} {
			db := c.Options().DB
			if db == 0 || db == opts.DB {
				t.Fatalf("Client on database %d, which is never handed out", db)
			}
			if n := c.DBSize(ctx).Val(); n != 0 {
				t.Fatalf("database %d has %d keys, want none", db, n)
			}
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
			dbs = append(dbs, db)
		}
		if dbs[0] == dbs[1] {
			t.Fatalf("two Clients share database %d", dbs[0])
		}
		if n := admin.Exists(ctx, "redisstoretest:lease:"+strconv.Itoa(dbs[0])).Val(); n != 1 {
			t.Errorf("no lease for database %d in database 0", dbs[0])
		}
	})
	for _, db := range dbs {
		if n := admin.Exists(ctx, "redisstoretest:lease:"+strconv.Itoa(db)).Val(); n != 0 {
			t.Errorf("database %d is still leased after its test", db)
		}
		c := redisurl.OnDB(opts, db)
		if n := c.DBSize(ctx).Val(); n != 0 {
			t.Errorf("database %d kept %d keys after its test", db, n)
		}
		c.Close()
	}
}

// URL names a leased database.
func TestURL(t *testing.T) {
	opts, err := redisurl.Options(redisstoretest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if opts.DB == 0 {
		t.Fatalf("URL names database 0, which is never handed out")
	}
	c := redisurl.OnDB(opts, opts.DB)
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// When every database is leased, Client waits for one to be released.
// Other test processes may hold leases of their own (internal/testkit/testbackend
// takes one per process), so the holder leases every database that is
// free, and the waiter must get one that was leased when it began to wait.
func TestClientWaitsForAFreeDatabase(t *testing.T) {
	ctx := context.Background()
	opts, err := redisurl.Options(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	admin := redisurl.OnDB(opts, 0)
	defer admin.Close()
	n, err := strconv.Atoi(admin.ConfigGet(ctx, "databases").Val()["databases"])
	if err != nil {
		t.Fatalf("CONFIG GET databases: %v", err)
	}
	leasable := func() []int { // all but 0 and the URL's
		var dbs []int
		for db := 1; db < n; db++ {
			if db != opts.DB {
				dbs = append(dbs, db)
			}
		}
		return dbs
	}
	// free counts the databases a Client could be handed now: not leased,
	// and empty or a test's (a database with others' keys is never handed
	// out).
	free := func() int {
		k := 0
		for _, db := range leasable() {
			if takeable(ctx, admin, opts, db) {
				k++
			}
		}
		return k
	}

	held := map[int]bool{}
	got := make(chan int, 1)
	var waiter sync.WaitGroup
	t.Run("holder", func(h *testing.T) {
		for free() > 0 {
			held[redisstoretest.Client(h).Options().DB] = true
		}
		waiter.Go(func() {
			t.Run("waiter", func(w *testing.T) { got <- redisstoretest.Client(w).Options().DB })
		})
		time.Sleep(200 * time.Millisecond) // the waiter waits
	})
	waiter.Wait()
	if db := <-got; !slices.Contains(leasable(), db) {
		t.Errorf("got database %d, which is never handed out", db)
	} else if !held[db] {
		t.Logf("got database %d, which another test process gave back first", db)
	}
	if len(held) == 0 {
		t.Error("the holder leased no database")
	}
}

// TestOthersKeysAreLeftAlone: a database that holds a key no test wrote
// (a developer's own, in their local Redis) is never handed out, so never
// flushed; the key is there after the tests, however many databases they
// take.
func TestOthersKeysAreLeftAlone(t *testing.T) {
	ctx := context.Background()
	server := testenv.RedisURL(t)
	opts, err := redisurl.Options(server)
	if err != nil {
		t.Fatal(err)
	}
	admin := redisurl.OnDB(opts, 0)
	defer admin.Close()

	// A database of someone else's: leased while the key is written, so no
	// test takes it meanwhile, then let go without a flush or a claim.
	l, err := redisdb.Acquire(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := redisurl.Options(l.URL())
	if err != nil {
		t.Fatal(err)
	}
	own := redisurl.OnDB(opts, theirs.DB)
	if err := admin.Del(ctx, redisdb.ClaimPrefix+strconv.Itoa(theirs.DB)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := own.Set(ctx, "someone:else", "keep me", 0).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the test's defers: own must still be open
		own.Del(context.Background(), "someone:else")
		own.Close()
	})
	if err := admin.Del(ctx, redisdb.LeasePrefix+strconv.Itoa(theirs.DB)).Err(); err != nil {
		t.Fatal(err)
	}

	t.Run("every database the tests can take", func(h *testing.T) {
		for range 64 {
			c := redisstoretest.Client(h)
			if c.Options().DB == theirs.DB {
				h.Fatalf("database %d, which holds a key no test wrote, was handed out", theirs.DB)
			}
			if freeLeft(ctx, admin, opts, theirs.DB) == 0 {
				break
			}
		}
	})
	if v, err := own.Get(ctx, "someone:else").Result(); err != nil || v != "keep me" {
		t.Errorf("the key in database %d after the tests: %q, %v; want it kept", theirs.DB, v, err)
	}
	_ = l // its lease was let go above; Release would flush their database
}

// freeLeft counts the databases a Client could be handed now, but skip.
func freeLeft(ctx context.Context, admin *redis.Client, opts *redis.Options, skip int) int {
	n, err := strconv.Atoi(admin.ConfigGet(ctx, "databases").Val()["databases"])
	if err != nil {
		return 0
	}
	k := 0
	for db := 1; db < n; db++ {
		if db != opts.DB && db != skip && takeable(ctx, admin, opts, db) {
			k++
		}
	}
	return k
}

// takeable reports whether a Client could be handed database db now: no
// test holds it, and it is empty or a test's (one with others' keys is
// never handed out).
func takeable(ctx context.Context, admin *redis.Client, opts *redis.Options, db int) bool {
	if admin.Exists(ctx, redisdb.LeasePrefix+strconv.Itoa(db)).Val() != 0 {
		return false
	}
	c := redisurl.OnDB(opts, db)
	defer c.Close()
	return admin.Exists(ctx, redisdb.ClaimPrefix+strconv.Itoa(db)).Val() == 1 || c.DBSize(ctx).Val() == 0
}
