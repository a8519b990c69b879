package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// releases are the tagged releases whose keys a Redis may still hold when
// a newer Store starts on it (a rolling upgrade, or a downgrade's undo),
// each with how it kept a key. v0.1.0 kept the layout the scripts still
// keep for every kind but Smooth (a counter hash of fields c, b, e, l, d,
// x, s and r, a sliding log and a lease set beside it: apply.lua's
// header), and no smooth instant; v0.2.0 keeps every key as head does
// (seedKey). The seeds write the fields that hold state; l (the limit
// last applied, which only steers fast.lua to its shortest path) and r
// (the last script's record, read only by a repeat of that script) are
// left out, as a key written by hand would have them. A release whose
// key layout changes adds its line with a seed of its own
// (docs/RELEASING.md).
var releases = []struct {
	tag  string
	seed func(ctx context.Context, client redis.Cmdable, ut, id string, k model.Key) error
}{
	{"v0.1.0", seedV010},
	{"v0.2.0", seedKey},
}

// TestUpgradeFromReleases holds a Store on a Redis full of live keys
// written as each release kept them (counts mid-window, penalties, sliding
// logs, leases, denial tallies, from the model's run) to the model: every
// key reads back as the model has it, and the Store then decides on those
// keys as the model does, smooth rules on keys of every kind included
// (modeltest.Upgrade). Redis has no schema to migrate: the upgrade is the
// new Store meeting the old keys.
func TestUpgradeFromReleases(t *testing.T) {
	client := testbackend.Redis(t)
	s := redisstore.New(client, redisstore.WithPaddedTTLs(time.Minute))
	for _, rel := range releases {
		t.Run(rel.tag, func(t *testing.T) {
			modeltest.Upgrade(t, modeltest.Path{
				Name:    "Store after the upgrade from " + rel.tag,
				Do:      modeltest.Each(s.Do),
				Expires: true,
				Read:    func(ctx context.Context, ut, id string) (model.Key, error) { return readKey(ctx, client, ut, id) },
			}, func(ctx context.Context, ut, id string, k model.Key) error {
				return rel.seed(ctx, client, ut, id, k)
			}, func(context.Context) error { return nil })
		})
	}
}

// seedV010 writes k as v0.1.0 kept it.
func seedV010(ctx context.Context, client redis.Cmdable, ut, id string, k model.Key) error {
	if k.TAT != 0 {
		return fmt.Errorf("v0.1.0 kept no smooth instant, and (%s, %s) has one", ut, id)
	}
	return seedKey(ctx, client, ut, id, k)
}
