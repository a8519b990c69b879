package redisproxy_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/internal/store/redisurl"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisproxy"
)

func TestMain(m *testing.M) { testbackend.Main(m) }

func open(t *testing.T, url string, protocol int) *redis.Client {
	t.Helper()
	c, err := redisurl.Open(url, func(o *redis.Options) { o.Protocol = protocol })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestProxy: through the proxy, on RESP2 and RESP3, CONFIG GET says what
// the test asked for and everything else, pipelines and scripts included,
// reaches the leased database as it would directly.
func TestProxy(t *testing.T) {
	ctx := context.Background()
	url := testbackend.RedisURL(t)
	direct := open(t, url, 3)
	for _, protocol := range []int{2, 3} {
		p := redisproxy.Start(t, url, redisproxy.ConfigGet(map[string]string{"maxmemory-policy": "allkeys-lru"}))
		c := open(t, p.URL(), protocol)
		got, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil || got["maxmemory-policy"] != "allkeys-lru" {
			t.Fatalf("RESP%d: CONFIG GET maxmemory-policy = %v, %v; want allkeys-lru", protocol, got, err)
		}
		if got, err := c.ConfigGet(ctx, "maxmemory").Result(); err != nil || len(got) != 0 {
			t.Errorf("RESP%d: CONFIG GET of a parameter the proxy does not know = %v, %v; want none", protocol, got, err)
		}
		key := "redisproxy-test"
		cmds, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, "v", 0)
			p.HSet(ctx, key+":h", "a", 1, "b", 2)
			p.HGetAll(ctx, key+":h")
			p.Eval(ctx, "return {1, 'two', {3}}", nil)
			p.Get(ctx, key+":missing")
			return nil
		})
		if err != nil && err != redis.Nil {
			t.Fatalf("RESP%d: pipeline: %v", protocol, err)
		}
		if h := cmds[2].(*redis.MapStringStringCmd).Val(); h["a"] != "1" || h["b"] != "2" {
			t.Errorf("RESP%d: HGETALL through the proxy = %v", protocol, h)
		}
		if v, err := direct.Get(ctx, key).Result(); err != nil || v != "v" {
			t.Errorf("RESP%d: the proxied SET did not reach the leased database: %q, %v", protocol, v, err)
		}
		if n := p.Count("config get"); n != 2 {
			t.Errorf("RESP%d: Count(config get) = %d, want 2", protocol, n)
		}
		direct.Del(ctx, key, key+":h")
	}

	p := redisproxy.Start(t, url, redisproxy.RefuseConfig("ERR unknown command 'CONFIG'"))
	c := open(t, p.URL(), 3)
	if err := c.ConfigGet(ctx, "maxmemory-policy").Err(); err == nil || err.Error() != "ERR unknown command 'CONFIG'" {
		t.Errorf("CONFIG GET through a refusing proxy: %v", err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING through a refusing proxy: %v", err)
	}
}
