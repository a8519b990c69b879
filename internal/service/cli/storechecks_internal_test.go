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

type watchStep struct {
	check error
	fails bool
	log   string // the line logged, if any: its level, a space, some of its text
}

// runWatch runs w through steps, checking what each reports and logs.
func runWatch(t *testing.T, steps []watchStep, newWatch func(check func(context.Context) error, log *slog.Logger) *watch) {
	t.Helper()
	var logs bytes.Buffer
	var next error
	w := newWatch(func(context.Context) error { return next }, slog.New(slog.NewTextHandler(&logs, nil)))
	for i, st := range steps {
		logs.Reset()
		next = st.check
		err := w.report(context.Background())
		if (err != nil) != st.fails || (st.fails && err != st.check) {
			t.Errorf("step %d: report = %v, want failing %v", i, err, st.fails)
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

// TestEvictionWatch: an evicting policy fails every probe but is logged
// when found and when fixed; a policy that cannot be checked is logged
// once; a store that does not answer is left to the ping.
func TestEvictionWatch(t *testing.T) {
	lru := driver.Unavailable(fmt.Errorf("allkeys-lru: %w", redisstore.ErrEvictionPolicy))
	ttl := driver.Unavailable(fmt.Errorf("volatile-ttl: %w", redisstore.ErrEvictionPolicy))
	unknown := fmt.Errorf("%w: NOPERM", redisstore.ErrPolicyUnknown)
	down := driver.Unavailable(errors.New("connection refused"))
	runWatch(t, []watchStep{
		{unknown, false, "WARN could not check Redis's maxmemory-policy"},
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
	}, evictionWatch)
}

// TestPersistenceWatch: a server that persists nothing is reported at
// every probe and logged when found and when fixed, a warning unless
// persistence is required; one that cannot be checked is logged once, and
// is no finding, required or not.
func TestPersistenceWatch(t *testing.T) {
	none := redisstore.ErrNoPersistence
	unknown := fmt.Errorf("%w: NOPERM", redisstore.ErrPolicyUnknown)
	down := driver.Unavailable(errors.New("connection refused"))
	for _, required := range []bool{false, true} {
		t.Run(fmt.Sprintf("required %v", required), func(t *testing.T) {
			found := "WARN persists nothing"
			if required {
				found = "ERROR --require-redis-persistence"
			}
			runWatch(t, []watchStep{
				{none, true, found},
				{none, true, ""},
				{down, false, ""},
				{none, true, ""},
				{nil, false, "INFO persists its data now"},
				{nil, false, ""},
				{unknown, false, "WARN could not check Redis's persistence"},
				{unknown, false, ""},
				{none, true, found},
			}, func(check func(context.Context) error, log *slog.Logger) *watch {
				return persistenceWatch(check, log, required)
			})
		})
	}
}
