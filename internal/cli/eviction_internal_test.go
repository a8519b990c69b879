package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// TestEvictionWatch: an evicting policy fails every probe but is logged
// when found and when fixed; a policy that cannot be checked is logged
// once; a store that does not answer is left to the ping.
func TestEvictionWatch(t *testing.T) {
	lru := driver.Unavailable(fmt.Errorf("allkeys-lru: %w", redisstore.ErrEvictionPolicy))
	ttl := driver.Unavailable(fmt.Errorf("volatile-ttl: %w", redisstore.ErrEvictionPolicy))
	unknown := fmt.Errorf("%w: NOPERM", redisstore.ErrPolicyUnknown)
	down := driver.Unavailable(errors.New("connection refused"))
	steps := []struct {
		check error
		fails bool
		log   string // the line logged, if any
	}{
		{unknown, false, "WARN could not check"},
		{unknown, false, ""},
		{lru, true, "ERROR allkeys-lru"},
		{lru, true, ""},
		{down, false, ""},
		{lru, true, ""},
		{ttl, true, "ERROR volatile-ttl"},
		{nil, false, "INFO noeviction now"},
		{nil, false, ""},
		{unknown, false, ""},
		{lru, true, "ERROR allkeys-lru"},
	}
	var logs bytes.Buffer
	var next error
	w := &evictionWatch{check: func(context.Context) error { return next }, log: slog.New(slog.NewTextHandler(&logs, nil))}
	for i, st := range steps {
		logs.Reset()
		next = st.check
		err := w.settings(context.Background())
		if (err != nil) != st.fails || (st.fails && err != st.check) {
			t.Errorf("step %d: settings = %v, want failing %v", i, err, st.fails)
		}
		got := logs.String()
		if st.log == "" && got != "" {
			t.Errorf("step %d: logged %q, want nothing", i, got)
		}
		level, text, _ := strings.Cut(st.log, " ")
		if st.log != "" && (strings.Count(got, "\n") != 1 || !strings.Contains(got, "level="+level) || !strings.Contains(got, text)) {
			t.Errorf("step %d: logged %q, want one %s line with %q", i, got, level, text)
		}
	}
}
