package redisurl_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/internal/store/redisurl"
)

func TestOpen(t *testing.T) {
	t.Parallel()
	c, err := redisurl.Open("redis://127.0.0.1:1/3", func(o *redis.Options) { o.MaxRetries = 7 })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	o := c.Options()
	if !o.ContextTimeoutEnabled || o.DB != 3 || o.MaxRetries != 7 || o.Addr != "127.0.0.1:1" {
		t.Errorf("Open: ContextTimeoutEnabled %v, DB %d, MaxRetries %d, Addr %s; want true, 3, 7, 127.0.0.1:1",
			o.ContextTimeoutEnabled, o.DB, o.MaxRetries, o.Addr)
	}
	other := redisurl.OnDB(o, 5)
	defer other.Close()
	if other.Options().DB != 5 || o.DB != 3 {
		t.Errorf("OnDB(o, 5): DB %d, o.DB %d; want 5, 3", other.Options().DB, o.DB)
	}
	if _, err := redisurl.Open("mysql://x"); err == nil {
		t.Error(`Open("mysql://x") succeeded`)
	}
}

func TestWithDB(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/4"},
		{"redis://127.0.0.1:6379", "redis://127.0.0.1:6379/4"},
		{"rediss://:pw@host:6380/15?dial_timeout=1s", "rediss://:pw@host:6380/4?dial_timeout=1s"},
		{"unix:///run/redis.sock?db=2", "unix:///run/redis.sock?db=4"},
	} {
		got, err := redisurl.WithDB(tc.in, 4)
		if err != nil || got != tc.want {
			t.Errorf("WithDB(%q, 4) = %q, %v; want %q", tc.in, got, err, tc.want)
			continue
		}
		o, err := redisurl.Options(got)
		if err != nil || o.DB != 4 {
			t.Errorf("Options(%q): DB %v, %v; want 4", got, o, err)
		}
	}
}
