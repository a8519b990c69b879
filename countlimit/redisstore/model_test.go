package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestModel holds every Redis path to the reference model
// (internal/testkit/modeltest): a lone call (fast.lua for an Allow of one rule,
// apply.lua, reset.lua or lease.lua for the others), a pipeline whose
// Allows of one rule share combined fast.lua scripts, a pipeline of a
// script per call, and apply.lua for every call it can take. The
// scripts keep each key a minute past its end (WithPaddedTTLs): the
// harness's clock is not Redis's. Every path expires keys: a key with
// nothing live, a denial of a new key's tally say, is gone with its TTL.
//
// With modeltest.EnvCover set, the scripts are their test build, which
// tallies each branch (coverBuild), and the tally is written into that
// directory for internal/testkit/coverreport.
func TestModel(t *testing.T) {
	client := testbackend.Redis(t)
	opts := []redisstore.Option{redisstore.WithPaddedTTLs(time.Minute)}
	if dir := os.Getenv(modeltest.EnvCover); dir != "" {
		const key = "countlimit-cover:lua" // in the process's own database
		client.Del(context.Background(), key)
		opt, read := coverBuild(t, key)
		opts = append(opts, opt)
		t.Cleanup(func() { writeLuaTally(t, dir, read(context.Background(), client)) })
	}
	s := redisstore.New(client, opts...)
	read := func(ctx context.Context, ut, id string) (model.Key, error) {
		return readKey(ctx, client, ut, id)
	}
	lone := modeltest.Each(s.Do)
	modeltest.Run(t, []modeltest.Path{
		{Name: "lone", Do: lone, Read: read, Expires: true},
		{Name: "pipeline, combined", Do: s.CombinedForTest, Read: read, Expires: true, Skip: mixedOnOneID, Fallback: lone},
		{Name: "pipeline, a script each", Do: s.PipelineForTest, Read: read, Expires: true, Skip: mixedOnOneID, Fallback: lone},
		{Name: "apply.lua", Do: modeltest.Each(s.ApplyForTest), Read: read, Expires: true,
			Skip: func(reqs []*driver.Request) bool {
				for _, r := range reqs {
					if r.OnLeases() {
						return true
					}
				}
				return false
			},
			Fallback: lone},
	})
}

// mixedOnOneID reports whether a batch has two calls on one id of which
// one is not an allow of one rule of a window: a pipeline may decide
// those out of the batch's order (a combined fast.lua script goes where
// its first call is; a call sent again goes after the pipeline), which the
// contract allows for concurrent calls and the model, deciding in order,
// does not follow.
func mixedOnOneID(reqs []*driver.Request) bool {
	plain := func(r *driver.Request) bool {
		return r.Op == driver.OpAllow && len(r.Checks) == 1 && r.Checks[0].Span == 0 && !r.Checks[0].Smooth() && r.Checks[0].TTL == 0
	}
	for i, a := range reqs {
		for _, b := range reqs[i+1:] {
			if a.ID == b.ID && !(plain(a) && plain(b)) {
				return true
			}
		}
	}
	return false
}

// TestContract runs storetest's contract cases on a Store: seeded keys,
// one request, and the keys compared with model.Apply's state at the
// request's now. The cases' clock is fixed and Redis's runs on, so the
// scripts keep each key a minute past its end here too: a denial of a new
// key leaves a hash whose window ends at now, which Redis would drop a
// millisecond later, before the case reads it on a loaded machine. Real
// expiry is TestKeysExpire's.
func TestContract(t *testing.T) { runContract(t, testbackend.Redis(t)) }

// runContract runs the contract cases on a Store of client and opts,
// whose scripts pad their TTLs.
func runContract(t *testing.T, client *redis.Client, opts ...redisstore.Option) {
	s := redisstore.New(client, append(opts, redisstore.WithPaddedTTLs(time.Minute))...)
	modeltest.RunContract(t, s, modeltest.Inspector{
		Read: func(ctx context.Context, ut, id string) (model.Key, error) { return readKey(ctx, client, ut, id) },
		Seed: func(ctx context.Context, ut, id string, k model.Key) error { return seedKey(ctx, client, ut, id, k) },
	})
}

// readKey reads what Redis keeps of (ut, id), in the model's terms: the
// counter hash (c count, b and e the window, d the denial tally, x the
// penalty's end, t a smooth check's instant; apply.lua's header), the
// sliding log and the leases.
func readKey(ctx context.Context, client redis.Cmdable, ut, id string) (model.Key, error) {
	var k model.Key
	key := redisstore.Key(countlimit.UseType(ut), id)
	h, err := hashOf(hashView.Run(ctx, client, []string{key}))
	if err != nil {
		return k, err
	}
	field := func(name string) (int64, bool, error) {
		v, ok := h[name]
		if !ok {
			return 0, false, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, true, fmt.Errorf("field %s of (%s, %s): %w", name, ut, id, err)
		}
		return n, true, nil
	}
	var b, e, c bool
	if k.Count, c, err = field("c"); err != nil {
		return k, err
	}
	if k.Begin, b, err = field("b"); err != nil {
		return k, err
	}
	if k.End, e, err = field("e"); err != nil {
		return k, err
	}
	if b && !e {
		k.End = model.Forever
	}
	if !b && c {
		return k, fmt.Errorf("(%s, %s) has a count but no window: %v", ut, id, h)
	}
	if k.Denied, _, err = field("d"); err != nil {
		return k, err
	}
	if k.Blocked, _, err = field("x"); err != nil {
		return k, err
	}
	if k.TAT, _, err = field("t"); err != nil {
		return k, err
	}
	log, err := client.ZRangeWithScores(ctx, redisstore.LogKey(countlimit.UseType(ut), id), 0, -1).Result()
	if err != nil {
		return k, err
	}
	for _, z := range log {
		k.Log = append(k.Log, int64(z.Score))
	}
	leases, err := client.ZRangeWithScores(ctx, redisstore.LeaseKey(countlimit.UseType(ut), id), 0, -1).Result()
	if err != nil {
		return k, err
	}
	for _, z := range leases {
		if k.Leases == nil {
			k.Leases = map[string]int64{}
		}
		k.Leases[z.Member.(string)] = int64(z.Score)
	}
	return k, nil
}

// seedKey makes Redis keep k for (ut, id), as the scripts would have
// written it, for an hour.
func seedKey(ctx context.Context, client redis.Cmdable, ut, id string, k model.Key) error {
	h := redisstore.Key(countlimit.UseType(ut), id)
	z := redisstore.LogKey(countlimit.UseType(ut), id)
	l := redisstore.LeaseKey(countlimit.UseType(ut), id)
	if err := client.Del(ctx, h, z, l).Err(); err != nil {
		return err
	}
	if keystate.Empty(&k) {
		return nil
	}
	var set []any
	if k.Begin < k.End || k.Count > 0 || len(k.Log) > 0 {
		set = append(set, "c", k.Count, "b", k.Begin)
		if k.End != model.Forever {
			set = append(set, "e", k.End)
		}
	} else if k.Begin != 0 || k.End != 0 {
		set = append(set, "c", 0, "b", k.Begin, "e", k.End) // an empty window, as a denial leaves
	}
	if k.Denied > 0 {
		set = append(set, "d", k.Denied)
	}
	if k.Blocked > 0 {
		set = append(set, "x", k.Blocked)
	}
	if k.TAT > 0 {
		set = append(set, "t", k.TAT)
	}
	if len(k.Log) > 0 {
		set = append(set, "s", len(k.Log))
	}
	p := client.TxPipeline()
	if len(set) > 0 {
		p.HSet(ctx, h, set...)
		p.Expire(ctx, h, time.Hour)
	}
	for i, e := range k.Log {
		p.ZAdd(ctx, z, redis.Z{Score: float64(e), Member: fmt.Sprintf("%d:%d", e, i+1)})
		p.Expire(ctx, z, time.Hour)
	}
	for t, e := range k.Leases {
		p.ZAdd(ctx, l, redis.Z{Score: float64(e), Member: t})
		p.Expire(ctx, l, time.Hour)
	}
	_, err := p.Exec(ctx)
	return err
}
