package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// hashView reads a counter key as the hash it stands for: a smooth key
// kept as a string, "<t>:<c>:<r>" or "<t>:<c>" (t in hexadecimal), reads
// as {t, c, b = 0, e = t, r} (smoothkey.lua); any other key that is no
// hash fails with HGETALL's error (WRONGTYPE). The tests read through it
// what a hash's fields would tell, on either form.
var hashView = redis.NewScript(`
local h = redis.pcall('HGETALL', KEYS[1])
if not h.err then return h end
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return redis.error_reply(h.err) end
local t, c, r = string.match(v, '^(%x+):(%d+):?(%d*)$')
if t == nil then return redis.error_reply(h.err) end
t = string.format('%d', tonumber(t, 16))
if r == '' then return {'t', t, 'c', c, 'b', '0', 'e', t} end
return {'t', t, 'c', c, 'b', '0', 'e', t, 'r', r}
`)

// hashOf returns the fields of hashView's reply.
func hashOf(cmd *redis.Cmd) (map[string]string, error) {
	vals, err := cmd.StringSlice()
	if err != nil {
		return nil, err
	}
	if len(vals)%2 != 0 {
		return nil, fmt.Errorf("hashView returned %d values", len(vals))
	}
	h := make(map[string]string, len(vals)/2)
	for i := 0; i < len(vals); i += 2 {
		h[vals[i]] = vals[i+1]
	}
	return h, nil
}

// TestSmoothStringIsItsHash holds a smooth key kept as a string
// (smoothkey.lua) to the hash it stands for, on every path that meets it:
// for each step, one id's key is left as fast.lua keeps it after an
// Allow (a string), another's is made the hash {t, c, b, e, r} by hand
// with the same TTL, and the same call on both must give the same Result
// and leave the same fields, read as a hash, and TTL. The steps are the
// calls of every script on such a key: a Peek (apply.lua, which writes
// nothing and leaves the string), a Peek of another kind (which joins the
// window [0, t) and its count), a Refund, Allows that fit (the string
// again) or do not (a denial, a penalty: made a hash), AllowAll beside
// another rule, another kind of window on the same use type, a lease's
// denial (lease.lua) and a Reset.
func TestSmoothStringIsItsHash(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	l := countlimit.New(redisstore.New(c), countlimit.WithClock(func() time.Time { return now }))
	ut := countlimit.UseType("smoothkey." + strconv.FormatInt(time.Now().UnixNano(), 36))
	smooth := countlimit.Rule{UseType: ut, Limit: 2, Window: countlimit.Smooth(time.Minute, 3)}
	blocking := smooth
	blocking.Block = time.Hour
	other := countlimit.Rule{UseType: ut + ".other", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	fixed := countlimit.Rule{UseType: ut, Limit: 1, Window: countlimit.Fixed(time.Hour)}
	slots := countlimit.Rule{UseType: ut, Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	t.Cleanup(func() {
		for _, id := range []string{"str", "hash"} {
			c.Del(context.Background(), redisstore.Key(ut, id), redisstore.LogKey(ut, id), redisstore.LeaseKey(ut, id),
				redisstore.Key(other.UseType, id))
		}
	})
	type outcome struct {
		res  []countlimit.Result
		err  error
		key  map[string]string
		ttl  time.Duration
		kind string
	}
	steps := []struct {
		name string
		want string // the key's type after the call, on the string's side
		call func(id string) ([]countlimit.Result, error)
	}{
		{"Peek", "string", func(id string) ([]countlimit.Result, error) {
			r, err := l.Peek(ctx, smooth, id)
			return []countlimit.Result{r}, err
		}},
		{"Peek of a fixed window on the same use type, which joins the string's", "string", func(id string) ([]countlimit.Result, error) {
			r, err := l.Peek(ctx, fixed, id)
			return []countlimit.Result{r}, err
		}},
		{"Allow that fits", "string", func(id string) ([]countlimit.Result, error) {
			r, err := l.Allow(ctx, smooth, id)
			return []countlimit.Result{r}, err
		}},
		{"Refund", "hash", func(id string) ([]countlimit.Result, error) {
			r, err := l.Refund(ctx, smooth, id, 1)
			return []countlimit.Result{r}, err
		}},
		{"AllowN beyond the room: a denial", "hash", func(id string) ([]countlimit.Result, error) {
			r, err := l.AllowN(ctx, smooth, id, 3)
			return []countlimit.Result{r}, err
		}},
		{"a denial that sets a penalty", "hash", func(id string) ([]countlimit.Result, error) {
			r, err := l.AllowN(ctx, blocking, id, 3)
			return []countlimit.Result{r}, err
		}},
		{"AllowAll beside another rule", "hash", func(id string) ([]countlimit.Result, error) {
			return l.AllowAll(ctx, id, smooth, other)
		}},
		{"a fixed window on the same use type", "hash", func(id string) ([]countlimit.Result, error) {
			r, err := l.Allow(ctx, fixed, id)
			return []countlimit.Result{r}, err
		}},
		{"a lease denied", "hash", func(id string) ([]countlimit.Result, error) {
			if _, _, err := l.Acquire(ctx, slots, id); err != nil {
				return nil, err
			}
			_, r, err := l.Acquire(ctx, slots, id)
			return []countlimit.Result{r}, err
		}},
		{"Reset", "none", func(id string) ([]countlimit.Result, error) {
			return nil, l.Reset(ctx, smooth, id)
		}},
	}
	read := func(id string) outcome {
		k := redisstore.Key(ut, id)
		h, err := hashOf(hashView.Run(ctx, c, []string{k}))
		if err != nil {
			t.Fatalf("reading %s: %v", k, err)
		}
		delete(h, "r") // each key's own tokens
		return outcome{key: h, ttl: c.PTTL(ctx, k).Val(), kind: c.Type(ctx, k).Val()}
	}
	for _, st := range steps {
		for _, id := range []string{"str", "hash"} {
			for _, k := range []string{redisstore.Key(ut, id), redisstore.LeaseKey(ut, id), redisstore.Key(other.UseType, id)} {
				if err := c.Del(ctx, k).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if r, err := l.Allow(ctx, smooth, id); err != nil || !r.Allowed {
				t.Fatalf("%s: the first Allow of %s: %+v, %v", st.name, id, r, err)
			}
		}
		k := redisstore.Key(ut, "hash")
		v, err := c.Get(ctx, k).Result()
		if err != nil {
			t.Fatalf("%s: after an Allow of a new key, GET %s: %v; want the string fast.lua keeps", st.name, k, err)
		}
		parts := strings.Split(v, ":")
		if len(parts) != 3 {
			t.Fatalf("%s: after an Allow of a new key, %s holds %q; want <t>:<c>:<r>", st.name, k, v)
		}
		at, err := strconv.ParseInt(parts[0], 16, 64)
		if err != nil {
			t.Fatalf("%s: %s holds %q, whose instant is no hexadecimal number: %v", st.name, k, v, err)
		}
		ttl := c.PTTL(ctx, k).Val()
		if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, k)
			p.HSet(ctx, k, "t", at, "c", parts[1], "b", 0, "e", at, "r", parts[2])
			p.PExpire(ctx, k, ttl)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var got [2]outcome
		for i, id := range []string{"str", "hash"} {
			before := read(id)
			res, err := st.call(id)
			got[i] = read(id)
			got[i].res, got[i].err = res, err
			if i == 0 && before.kind != "string" {
				t.Fatalf("%s: the key before the call is a %s, want a string", st.name, before.kind)
			}
		}
		if got[0].kind != st.want {
			t.Errorf("%s: the string's key after the call is a %s, want a %s", st.name, got[0].kind, st.want)
		}
		a, b := fmt.Sprint(got[0].res, got[0].err, got[0].key), fmt.Sprint(got[1].res, got[1].err, got[1].key)
		if d := got[0].ttl - got[1].ttl; a != b || (got[0].ttl < 0) != (got[1].ttl < 0) || d < -time.Second || d > time.Second {
			t.Errorf("%s:\nthe string: %s, TTL %v\nthe hash:   %s, TTL %v", st.name, a, got[0].ttl, b, got[1].ttl)
		}
	}
}
