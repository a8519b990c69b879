package pgstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testbackend"
)

// TestGenericPlansUseTheKey plans every statement the store runs, and every
// statement inside its functions, as PostgreSQL plans them for a new
// deployment: on empty, analyzed tables, with generic plans (what a prepared
// statement keeps after five runs whatever the table later holds). No plan
// may read count_limit or count_limit_lease by a Seq Scan: such a plan,
// frozen while the table was empty, would get slower with every row. (The
// audit queries, NearestLimit and the like, read the whole view by design;
// TestSupportQueriesUseIndexes covers the DBA's lookups.)
// auto_explain hands each executed plan, nested ones too, to the client.
func TestGenericPlansUseTheKey(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		plans []string
	)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if _, plan, ok := strings.Cut(n.Message, "plan:\n"); ok {
			mu.Lock()
			plans = append(plans, plan)
			mu.Unlock()
		}
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain';
			SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;
			SET auto_explain.log_format = json; SET auto_explain.log_level = notice;
			SET plan_cache_mode = force_generic_plan`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE count_limit, count_limit_lease`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	plans = nil
	mu.Unlock()

	s := pgstore.New(pool)
	l := countlimit.New(s)
	fixed := countlimit.Rule{UseType: "plan.fixed", Limit: 3, Window: countlimit.Fixed(time.Hour), Block: time.Minute}
	sliding := countlimit.Rule{UseType: "plan.sliding", Limit: 3, Window: countlimit.Sliding(time.Minute)}
	slots := countlimit.Rule{UseType: "plan.slots", Limit: 2, Window: countlimit.Concurrent(time.Minute)}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	inTx := countlimit.New(pgstore.New(tx))
	rec := &recorder{}
	for _, id := range []string{"a", "b", "a"} {
		if _, err := countlimit.New(rec).Allow(ctx, fixed, id); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name string
		run  func() error
	}{
		// Twice each: the first call of a statement plans it, and so does
		// the first of each kind of row (absent, present).
		{"Allow (pool)", func() error { _, err := l.Allow(ctx, fixed, "a"); return err }},
		{"Allow (pool, row there)", func() error { _, err := l.Allow(ctx, fixed, "a"); return err }},
		{"AllowN denied", func() error { _, err := l.AllowN(ctx, fixed, "a", 9); return err }},
		{"Allow (tx)", func() error { _, err := inTx.Allow(ctx, fixed, "t"); return err }},
		{"Allow (tx, row there)", func() error { _, err := inTx.Allow(ctx, fixed, "t"); return err }},
		{"batch, distinct keys", func() error { return s.AllowBatchForTest(ctx, rec.reqs[:2]) }},
		{"batch, repeated keys", func() error { return s.AllowBatchForTest(ctx, rec.reqs) }},
		{"Peek", func() error { _, err := l.Peek(ctx, fixed, "a"); return err }},
		{"Refund", func() error { _, err := l.Refund(ctx, fixed, "a", 1); return err }},
		{"Allow sliding", func() error { _, err := l.Allow(ctx, sliding, "a"); return err }},
		{"AllowAll", func() error { _, err := l.AllowAll(ctx, "b", fixed, sliding); return err }},
		{"CheckLimit", func() error { _, err := l.CheckLimit(ctx, "plan.check", "a", 3, time.Hour, time.Time{}); return err }},
		{"Acquire, Extend, Release", func() error {
			ls, _, err := l.Acquire(ctx, slots, "a")
			if err != nil {
				return err
			}
			if _, _, err := l.Acquire(ctx, slots, "a"); err != nil {
				return err
			}
			if err := ls.Extend(ctx); err != nil {
				return err
			}
			return ls.Release(ctx)
		}},
		{"Peek of slots", func() error { _, err := l.Peek(ctx, slots, "a"); return err }},
		{"Reset", func() error { return l.Reset(ctx, fixed, "a") }},
		{"Purge", func() error { _, err := s.Purge(ctx, time.Now().Add(48*time.Hour), 100); return err }},
	}
	for _, st := range steps {
		mu.Lock()
		plans = plans[:0]
		mu.Unlock()
		if err := st.run(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		mu.Lock()
		got := append([]string(nil), plans...)
		mu.Unlock()
		if len(got) == 0 {
			t.Errorf("%s: no plan came back (auto_explain)", st.name)
		}
		for _, raw := range got {
			var plan struct {
				Text string   `json:"Query Text"`
				Plan planNode `json:"Plan"`
			}
			if err := json.Unmarshal([]byte(raw), &plan); err != nil {
				t.Fatalf("%s: a plan that is not JSON (%v): %s", st.name, err, raw)
			}
			var seq []string
			plan.Plan.walk(func(n *planNode) {
				if n.Type == "Seq Scan" && strings.HasPrefix(n.Relation, "count_limit") {
					seq = append(seq, n.Relation)
				}
			})
			if len(seq) > 0 {
				t.Errorf("%s: a generic plan on empty tables reads %v by Seq Scan:\n%s\n%s", st.name, seq, firstLine(plan.Text), raw)
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// firstLine is the first line of a statement that says what it is: its
// sqlc name, or its first words.
func firstLine(sql string) string {
	for _, line := range strings.Split(sql, "\n") {
		if line = strings.TrimSpace(line); line != "" {
			return fmt.Sprintf("%.120s", line)
		}
	}
	return ""
}
