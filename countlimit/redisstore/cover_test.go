package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/internal/testkit/coverreport"
	"github.com/countlimit/countlimit/internal/testkit/coverreport/luacover"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// coverBuild returns the option of a Store whose scripts tally how often
// each of their branches ran in the hash key (luacover's test build), and
// a function that reads the tally back: by file, each branch's count. The
// build names a key outside a script's KEYS, which a Cluster refuses: it
// runs on one server only (the model test's).
func coverBuild(t testing.TB, key string) (redisstore.Option, func(context.Context, redis.Cmdable) map[string]map[string]int64) {
	t.Helper()
	builds := map[string]luacover.Build{}
	for name, src := range redisstore.ScriptFiles {
		b, err := luacover.Instrument(name, src, key)
		if err != nil {
			t.Fatal(err)
		}
		builds[name] = b
	}
	opt := redisstore.WithScriptFiles(func(name, src string) string {
		if src != redisstore.ScriptFiles[name] {
			panic("coverBuild: " + name + " is not the file it instrumented")
		}
		return builds[name].Source
	})
	read := func(ctx context.Context, c redis.Cmdable) map[string]map[string]int64 {
		t.Helper()
		h, err := c.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", key, err)
		}
		out := map[string]map[string]int64{}
		for name, b := range builds {
			out[name] = map[string]int64{}
			for i, branch := range b.Branches {
				n, _ := strconv.ParseInt(h[luacover.Field(name, i)], 10, 64)
				out[name][branch] = n
			}
		}
		return out
	}
	return opt, read
}

// writeLuaTally writes tally (coverBuild's) into the directory
// modeltest.EnvCover names, for internal/testkit/coverreport: a line
// "file<TAB>branch<TAB>count" a branch, in each file's order.
func writeLuaTally(t testing.TB, dir string, tally map[string]map[string]int64) {
	t.Helper()
	var b strings.Builder
	files := make([]string, 0, len(tally))
	for f := range tally {
		files = append(files, f)
	}
	slices.Sort(files)
	for _, f := range files {
		built, err := luacover.Instrument(f, redisstore.ScriptFiles[f], "k")
		if err != nil {
			t.Fatal(err)
		}
		for _, branch := range built.Branches {
			fmt.Fprintf(&b, "%s\t%s\t%d\n", f, branch, tally[f][branch])
		}
	}
	if err := os.WriteFile(filepath.Join(dir, coverreport.LuaFile(os.Getpid())), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCoverBuild runs the contract cases on a Store of the test build of
// the scripts (coverBuild): it decides as the scripts do, and tallies
// branches of every script the cases send (smoothkey.lua is the model
// test's: the cases keep no smooth key as a string).
func TestCoverBuild(t *testing.T) {
	c := testbackend.Redis(t)
	key := "countlimit-cover:" + t.Name()
	opt, read := coverBuild(t, key)
	t.Cleanup(func() {
		// After the cases, which run in parallel.
		defer c.Del(context.Background(), key)
		tally := read(context.Background(), c)
		for _, f := range []string{"apply.lua", "fast.lua", "lease.lua", "reset.lua"} {
			var n int64
			for _, k := range tally[f] {
				n += k
			}
			if n == 0 {
				t.Errorf("%s: no branch tallied", f)
			}
		}
	})
	runContract(t, c, opt)
}
