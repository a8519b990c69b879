package cli

import (
	"strings"
	"testing"
)

// TestRedisStoreOptions: script_per_call comes out of a Redis URL (go-redis
// would refuse it) and asks for a script a call; the rest of the URL stays.
func TestRedisStoreOptions(t *testing.T) {
	for _, tc := range []struct {
		url, rest string
		opts      int
	}{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", 0},
		{"redis://127.0.0.1:6379/0?script_per_call=true&dial_timeout=2s", "redis://127.0.0.1:6379/0?dial_timeout=2s", 1},
		{"redis://127.0.0.1:6379/0?script_per_call=1", "redis://127.0.0.1:6379/0", 1},
		{"redis://127.0.0.1:6379/0?script_per_call=false", "redis://127.0.0.1:6379/0", 0},
		{"unix:///run/redis.sock?db=2&script_per_call=true", "unix:///run/redis.sock?db=2", 1},
	} {
		rest, opts, err := redisStoreOptions(tc.url)
		if err != nil || rest != tc.rest || len(opts) != tc.opts {
			t.Errorf("redisStoreOptions(%q) = %q, %d options, %v; want %q, %d options", tc.url, rest, len(opts), err, tc.rest, tc.opts)
		}
	}
	if _, _, err := redisStoreOptions("redis://127.0.0.1:6379/0?script_per_call=maybe"); err == nil || !strings.Contains(err.Error(), "script_per_call") {
		t.Errorf("script_per_call=maybe: %v, want an error naming script_per_call", err)
	}
}
