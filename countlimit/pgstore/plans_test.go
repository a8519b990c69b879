package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestPlansReadOnlyTheirKeys holds every statement the store runs, every
// statement inside its functions (the fast path, the batches and
// countlimit_claim_keys, countlimit_apply with and without smooth checks,
// leases, Reset, the purge, the DBA's writers, countlimit_adjust_count on
// a smooth row included) and the foreign-key statements they fire, to one
// invariant: a call reads count_limit and count_limit_lease only by the
// keys it touches, whatever the tables' statistics say (issue 33).
//
// Each statement is planned as PostgreSQL keeps it for a pooled connection
// (plan_cache_mode = force_generic_plan; a function's plan lives as long as
// its session) under four states of the statistics, each in a schema and
// sessions of its own:
//
//	never analyzed                 planned on empty tables, run again after they grew to 100 000 rows
//	analyzed empty                 the same, after an ANALYZE of the empty tables
//	analyzed empty, then grown     planned and run on 100 000 rows the statistics do not know of
//	analyzed full, then emptied    planned and run after every row was deleted (not vacuumed): 100 000 dead ones
//
// Two things are asked of every plan auto_explain hands back (nested and
// foreign-key statements included), in every round:
//
//   - its shape: every scan of either table is an index scan whose index
//     condition names the key (count_limit's unique_id, the leading column of
//     its primary key; count_limit_lease's use_type and unique_id), or a TID
//     scan of rows the call locked; the purge alone reads expired leases
//     by their expiry index, with an index condition on the expiry column,
//     stopped by its LIMIT (no sort or hash between them), and count_limit
//     by a TID range scan of at most purgeRange pages (countlimit_purge_rows's
//     sweep). A Seq Scan, an index scan with no condition (read for its
//     order), a bitmap of every expired row, a TID range with an open end,
//     or an index of something else (the blocked ids, the expiries) is the
//     whole table read again on every call;
//   - its cost, once the tables hold 100 000 rows and 50 000 leases (live or
//     dead): the blocks its scans of the two tables read are bounded by the
//     keys the step touches (blocksPerKey each, plus blocksSlack), where one
//     read of the whole table is some hundreds; a statement of the
//     purge's sweep, the purgeRange pages it reads as well.
//
// The audit queries (NearestLimit, MostDenied, countlimit_most_denied) read
// the whole view by design and are not held to it; TestSupportQueriesUseIndexes
// covers a DBA's lookups of one id and of the blocked ids.
func TestPlansReadOnlyTheirKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("fills tables with 100 000 rows, four times")
	}
	for _, st := range []struct {
		name string
		// before runs on the migrated, empty tables before any statement
		// is planned; between, after the first round and before the second.
		before, between []string
	}{
		{"never analyzed", nil, []string{planFill}},
		{"analyzed empty", []string{planAnalyze}, []string{planFill}},
		{"analyzed empty, then grown", []string{planAnalyze, planFill}, nil},
		{"analyzed full, then emptied", []string{planFill, planAnalyze, planEmpty}, nil},
	} {
		t.Run(st.name, func(t *testing.T) { checkPlans(t, st.before, st.between, slices.Contains(st.before, planEmpty)) })
	}
}

const (
	// planFill writes 100 000 rows of use type fill: half of them with a
	// window that ended an hour ago (purgeable), one in seven blocked, one
	// in ten holding five leases, half of which have expired.
	planFill = `
		INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, blocked_until, lease_until)
		SELECT 'fill', 'fill-' || lpad(i::text, 6, '0'), 1, now() - interval '2 hours',
			CASE WHEN i % 2 = 0 THEN now() - interval '1 hour' ELSE now() + interval '1 day' END, 10,
			CASE WHEN i % 7 = 0 THEN now() + interval '1 hour' END,
			CASE WHEN i % 10 = 1 THEN now() + interval '1 day' END
		FROM generate_series(1, 100000) AS i;
		INSERT INTO count_limit_lease (use_type, unique_id, lease_token, expires_at, taken_at)
		SELECT 'fill', 'fill-' || lpad(i::text, 6, '0'), 'tok-' || n,
			CASE WHEN n % 2 = 0 THEN now() - interval '1 hour' ELSE now() + interval '1 hour' END, now() - interval '2 hours'
		FROM generate_series(1, 100000) AS i, generate_series(1, 5) AS n
		WHERE i % 10 = 1`
	planAnalyze = `ANALYZE count_limit, count_limit_lease`
	// planEmpty deletes the filler, and its leases with it, leaving the
	// dead rows in place: nothing vacuums these tables.
	planEmpty = `DELETE FROM count_limit WHERE use_type = 'fill'`

	// A by-key probe of either primary key at 100 000 rows reads a block or
	// two of each index level and one of the heap; a statement may probe a
	// key more than once (a batch locks its rows, then looks for those
	// another transaction holds). One read of the whole table is hundreds
	// of blocks.
	blocksPerKey = 16
	blocksSlack  = 32
	// purgeBatch is the batch size the purge is called with.
	purgeBatch = 5
	// purgeRange is how many pages of count_limit a statement of the
	// purge's sweep reads at most (countlimit_purge_rows).
	purgeRange = 1024
)

// planStep is one call of the store or one DBA function, with the number
// of keys it touches.
type planStep struct {
	name string
	keys int
	run  func() error
}

// checkPlans runs every step twice, holding each plan to the key (its
// shape) and, in the second round, what it read to the keys it touched.
// With dead set (the filler deleted), the purge's batches of leases, which
// read expired leases in expiry order across ids, are held to their shape
// alone: they step over the deleted leases' index entries until no
// snapshot on the server can see them (other tests' open transactions keep
// them), which no plan avoids and a vacuum ends. The sweep's statements
// are held to their range of pages, dead rows or not.
func checkPlans(t *testing.T, before, between []string, dead bool) {
	ctx := context.Background()
	url := testbackend.FreshSchemaURL(t)
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := pgstore.Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	// Only this test changes these tables' statistics.
	mustExec(t, admin, `ALTER TABLE count_limit SET (autovacuum_enabled = off);
		ALTER TABLE count_limit_lease SET (autovacuum_enabled = off)`)
	for _, sql := range before {
		mustExec(t, admin, sql)
	}

	// Two connections, each kept for the whole test so that the plans of
	// the first round are the plans of the second: one for the caller's
	// transaction, one for everything else (calls go one at a time).
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.MinConns = 2
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
	// auto_explain hands each executed plan, nested ones too, to the
	// client, with what each node read.
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain';
			SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;
			SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on; SET auto_explain.log_timing = off;
			SET auto_explain.log_format = json; SET auto_explain.log_level = notice;
			SET plan_cache_mode = force_generic_plan;
			SET statement_timeout = '30s'`) // a plan that reads a table for each row of another takes minutes here

		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	s := pgstore.New(pool)
	l := countlimit.New(s)
	fixed := countlimit.Rule{UseType: "plan.fixed", Limit: 3, Window: countlimit.Fixed(time.Hour), Block: time.Minute}
	sliding := countlimit.Rule{UseType: "plan.sliding", Limit: 3, Window: countlimit.Sliding(time.Minute)}
	slots := countlimit.Rule{UseType: "plan.slots", Limit: 2, Window: countlimit.Concurrent(time.Minute)}
	smooth := countlimit.Rule{UseType: "plan.smooth", Limit: 3, Window: countlimit.Smooth(time.Minute, 2), Block: time.Minute}
	// One use type, two kinds: a fixed window over a smooth instant and back.
	kindFixed := countlimit.Rule{UseType: "plan.kind", Limit: 3, Window: countlimit.Fixed(time.Hour)}
	kindSmooth := countlimit.Rule{UseType: "plan.kind", Limit: 3, Window: countlimit.Smooth(time.Minute, 3)}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	inTx := countlimit.New(pgstore.New(tx))
	// The requests of batches, as a Limiter makes them.
	record := func(ids ...string) []*driver.Request {
		rec := &recorder{}
		for _, id := range ids {
			if _, err := countlimit.New(rec).Allow(ctx, fixed, id); err != nil {
				t.Fatal(err)
			}
		}
		return rec.reqs
	}
	// heldBatch sends a batch one of whose keys (id "held") another
	// transaction has inserted and not committed: the batch gives that key
	// up (countlimit_claim_keys) and applies the others.
	heldBatch := func(ids ...string) error {
		holder, err := admin.Begin(ctx)
		if err != nil {
			return err
		}
		defer holder.Rollback(ctx)
		if _, err := holder.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, begin_time, end_time)
			VALUES ($1, 'held', now(), now())`, string(fixed.UseType)); err != nil {
			return err
		}
		err = s.AllowBatchForTest(ctx, record(ids...))
		if !errors.Is(err, pgstore.ErrBusy) || strings.Count(err.Error(), "\n") > 0 {
			return fmt.Errorf("a batch with a held key: %v, want the held key's call busy and no other error", err)
		}
		return nil
	}
	dba := func(sql string) func() error {
		return func() error { _, err := pool.Exec(ctx, sql); return err }
	}
	steps := []planStep{
		{"Allow (pool)", 1, func() error { _, err := l.Allow(ctx, fixed, "a"); return err }},
		{"Allow (pool), again", 1, func() error { _, err := l.Allow(ctx, fixed, "a"); return err }},
		{"AllowN denied", 1, func() error { _, err := l.AllowN(ctx, fixed, "a", 9); return err }},
		{"Allow (tx)", 1, func() error { _, err := inTx.Allow(ctx, fixed, "t"); return err }},
		{"Allow (tx), again", 1, func() error { _, err := inTx.Allow(ctx, fixed, "t"); return err }},
		{"batch, distinct keys", 2, func() error { return s.AllowBatchForTest(ctx, record("a", "b")) }},
		{"batch, repeated keys", 2, func() error { return s.AllowBatchForTest(ctx, record("a", "b", "a")) }},
		{"batch, repeated keys, new rows", 2, func() error { return s.AllowBatchForTest(ctx, record("e", "f", "e")) }},
		// Every row there, free, with room for every call: the running
		// sum of countlimit_allow_batch_pooled decides it alone (in the
		// second round the rows are full and the fold decides).
		{"batch, repeated keys, rows with room", 2, func() error { return s.AllowBatchForTest(ctx, record("f", "e", "f")) }},
		{"batch, distinct keys, one held", 3, func() error { return heldBatch("c", "held", "d") }},
		{"batch, repeated keys, one held", 3, func() error { return heldBatch("c", "held", "c") }},
		{"Peek", 1, func() error { _, err := l.Peek(ctx, fixed, "a"); return err }},
		{"Refund", 1, func() error { _, err := l.Refund(ctx, fixed, "a", 1); return err }},
		{"Allow sliding", 1, func() error { _, err := l.Allow(ctx, sliding, "a"); return err }},
		{"AllowAll", 2, func() error { _, err := l.AllowAll(ctx, "b", fixed, sliding); return err }},
		{"Allow smooth", 1, func() error { _, err := l.Allow(ctx, smooth, "a"); return err }},
		{"AllowN smooth, denied", 1, func() error { _, err := l.AllowN(ctx, smooth, "a", 2); return err }},
		{"Peek smooth", 1, func() error { _, err := l.Peek(ctx, smooth, "a"); return err }},
		{"Refund smooth", 1, func() error { _, err := l.Refund(ctx, smooth, "a", 1); return err }},
		{"Allow smooth (tx)", 1, func() error { _, err := inTx.Allow(ctx, smooth, "t"); return err }},
		{"AllowAll, smooth and fixed", 2, func() error { _, err := l.AllowAll(ctx, "b", fixed, smooth); return err }},
		{"Allow smooth, then fixed, on one use type", 1, func() error {
			if _, err := l.Allow(ctx, kindSmooth, "a"); err != nil {
				return err
			}
			_, err := l.Allow(ctx, kindFixed, "a")
			return err
		}},
		{"CheckLimit", 1, func() error {
			_, err := l.CheckLimit(ctx, "plan.check", "a", 3, time.Hour, time.Time{})
			return err
		}},
		{"Acquire, Extend, Release", 1, func() error {
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
		{"Peek of slots", 1, func() error { _, err := l.Peek(ctx, slots, "a"); return err }},
		{"Reset", 1, func() error { return l.Reset(ctx, fixed, "b") }},
		// A batch of leases and the sweep's statements until a batch of
		// rows: the two functions pgstore's Purge calls, one statement each
		// (its loop over the whole table would step over its own deleted
		// leases again and again, as said above).
		{"countlimit_purge", 2 * purgeBatch, dba(fmt.Sprintf(`SELECT countlimit_purge(now(), %d)`, purgeBatch))},
		{"countlimit_adjust_count", 1, dba(`SELECT countlimit_adjust_count('a', 'plan.fixed', -1)`)},
		{"countlimit_adjust_count, smooth", 1, dba(`SELECT countlimit_adjust_count('a', 'plan.smooth', 1)`)},
		{"countlimit_lift_penalty, one use type", 1, dba(`SELECT countlimit_lift_penalty('a', 'plan.fixed')`)},
		{"countlimit_lift_penalty, every use type", 6, dba(`SELECT countlimit_lift_penalty('a')`)},
		{"countlimit_reset_id, one use type", 1, dba(`SELECT countlimit_reset_id('c', 'plan.fixed')`)},
		{"countlimit_reset_id, every use type", 6, dba(`SELECT countlimit_reset_id('a')`)},
	}
	for round := 1; round <= 2; round++ {
		if round == 2 {
			for _, sql := range between {
				mustExec(t, admin, sql)
			}
		}
		for _, st := range steps {
			mu.Lock()
			plans = plans[:0]
			mu.Unlock()
			if err := st.run(); err != nil {
				t.Fatalf("round %d, %s: %v", round, st.name, err)
			}
			mu.Lock()
			got := append([]string(nil), plans...)
			mu.Unlock()
			if len(got) == 0 {
				t.Errorf("round %d, %s: no plan came back (auto_explain)", round, st.name)
			}
			for _, raw := range got {
				var plan struct {
					Text string   `json:"Query Text"`
					Plan planNode `json:"Plan"`
				}
				if err := json.Unmarshal([]byte(raw), &plan); err != nil {
					t.Fatalf("round %d, %s: a plan that is not JSON (%v): %s", round, st.name, err, raw)
				}
				for _, bad := range plan.Plan.notByKey(nil) {
					t.Errorf("round %d, %s: %s\nin: %s\n%s", round, st.name, bad, firstLine(plan.Text), raw)
				}
				// The second round runs on 100 000 rows (or their dead
				// versions) in every state.
				bound := int64(blocksPerKey*st.keys + blocksSlack)
				if plan.Plan.sweeps() {
					bound += purgeRange
				}
				if read := plan.Plan.blocksRead(); round == 2 && read > bound && !(dead && plan.Plan.uses("count_limit_lease_expires_at_idx")) {
					t.Errorf("round %d, %s: the statement read %d blocks of count_limit and count_limit_lease for %d keys, want at most %d:\n%s\n%s",
						round, st.name, read, st.keys, bound, firstLine(plan.Text), raw)
				}
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", firstLine(sql), err)
	}
}

// planNode is a node of a plan as EXPLAIN (FORMAT JSON) and auto_explain
// give it, with what it read when it was run with ANALYZE and BUFFERS.
type planNode struct {
	Type     string     `json:"Node Type"`
	Parent   string     `json:"Parent Relationship"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Cond     string     `json:"Index Cond"`
	TIDCond  string     `json:"TID Cond"`
	Subplan  string     `json:"Subplan Name"`
	Hit      int64      `json:"Shared Hit Blocks"`
	Read     int64      `json:"Shared Read Blocks"`
	Plans    []planNode `json:"Plans"`
}

func (n *planNode) walk(f func(*planNode)) {
	f(n)
	for i := range n.Plans {
		n.Plans[i].walk(f)
	}
}

// keyIndexes are the primary keys, each with the pattern its index
// condition must match: equality on the key's leading columns.
var keyIndexes = map[string][]*regexp.Regexp{
	"count_limit_pkey":       {regexp.MustCompile(`\bunique_id = `)},
	"count_limit_lease_pkey": {regexp.MustCompile(`\buse_type = `), regexp.MustCompile(`\bunique_id = `)},
}

// expiryIndexes are the purge's indexes, each with the pattern its index
// condition must match.
var expiryIndexes = map[string]*regexp.Regexp{
	"count_limit_lease_expires_at_idx": regexp.MustCompile(`\bexpires_at <= `),
}

// tidRange is the TID condition of the purge's sweep: a lower bound and an
// upper one.
var tidRange = regexp.MustCompile(`^\(\(ctid >= .+\) AND \(ctid < .+\)\)$`)

// uses reports whether a plan reads by the index named.
func (n *planNode) uses(index string) bool {
	found := false
	n.walk(func(m *planNode) { found = found || m.Index == index })
	return found
}

// sweeps reports whether a plan is a statement of the purge's sweep: it
// has a TID range scan of count_limit.
func (n *planNode) sweeps() bool {
	found := false
	n.walk(func(m *planNode) { found = found || m.Type == "Tid Range Scan" && m.Relation == "count_limit" })
	return found
}

// notByKey lists the nodes under n (whose ancestors are path) that read
// count_limit or count_limit_lease other than by key.
func (n *planNode) notByKey(path []*planNode) []string {
	var bad []string
	ours := strings.HasPrefix(n.Relation, "count_limit")
	switch {
	case n.Type == "ModifyTable", n.Type == "Bitmap Heap Scan" && ours:
		// A write reads through its own scans; a bitmap heap scan reads
		// what its index scans below it found.
	case n.Type == "Tid Scan" && ours:
		// Rows the statement has locked, by their address.
	case n.Type == "Tid Range Scan" && n.Relation == "count_limit":
		// The purge's sweep: a range of pages, closed at both ends.
		if !tidRange.MatchString(n.TIDCond) {
			bad = append(bad, fmt.Sprintf("%s of %s with TID condition %q: not a range closed at both ends", n.Type, n.Relation, n.TIDCond))
		}
	case n.Index != "" && (ours || n.Type == "Bitmap Index Scan"):
		if want, ok := keyIndexes[n.Index]; ok {
			for _, re := range want {
				if !re.MatchString(n.Cond) {
					bad = append(bad, fmt.Sprintf("%s using %s with index condition %q: not the key", n.Type, n.Index, n.Cond))
					break
				}
			}
		} else if want, ok := expiryIndexes[n.Index]; ok {
			if !want.MatchString(n.Cond) || !underLimit(n, path) {
				bad = append(bad, fmt.Sprintf("%s using %s with index condition %q: expired rows not read in order under their batch's LIMIT", n.Type, n.Index, n.Cond))
			}
		} else if strings.HasPrefix(n.Index, "count_limit") {
			bad = append(bad, fmt.Sprintf("%s using %s (condition %q): an index that is not the key", n.Type, n.Index, n.Cond))
		}
	case ours:
		bad = append(bad, fmt.Sprintf("%s of %s", n.Type, n.Relation))
	}
	path = append(path, n)
	for i := range n.Plans {
		bad = append(bad, n.Plans[i].notByKey(path)...)
	}
	return bad
}

// underLimit reports whether the scan n (whose ancestors are path) is
// stopped by a Limit: the nearest Limit above it, with nothing between
// that reads all its input first (a nested loop reads its outer side as
// it goes).
func underLimit(n *planNode, path []*planNode) bool {
	if n.Type != "Index Scan" && n.Type != "Index Only Scan" {
		return false
	}
	child := n
	for i := len(path) - 1; i >= 0; i-- {
		switch path[i].Type {
		case "Limit":
			return true
		case "LockRows", "Subquery Scan", "Result":
		case "Nested Loop":
			if child.Parent != "Outer" {
				return false
			}
		default:
			return false
		}
		child = path[i]
	}
	return false
}

// blocksRead is how many blocks the scans of count_limit and
// count_limit_lease under n read (found in shared buffers or not), each
// counted once: EXPLAIN gives a node's buffers with those of the nodes it
// ran, its children and an InitPlan its condition reads ($N), which runs
// when the scan first evaluates it (the rows a CTE locked, deleted by their
// address), so those are taken off the scan's own.
func (n *planNode) blocksRead() int64 {
	var sum int64
	var visit func(m *planNode, siblings []planNode)
	visit = func(m *planNode, siblings []planNode) {
		switch m.Type {
		case "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Tid Scan", "Tid Range Scan", "Sample Scan":
			if strings.HasPrefix(m.Relation, "count_limit") {
				own := m.Hit + m.Read
				for _, c := range m.Plans {
					own -= c.Hit + c.Read
				}
				params := paramRef.FindAllString(m.Cond+" "+m.TIDCond, -1)
				for _, sib := range siblings {
					if p := initPlanParam.FindStringSubmatch(sib.Subplan); p != nil && slices.Contains(params, p[1]) {
						own -= sib.Hit + sib.Read
					}
				}
				sum += own
			}
		}
		for i := range m.Plans {
			visit(&m.Plans[i], m.Plans)
		}
	}
	visit(n, nil)
	return sum
}

// initPlanParam finds the parameter an InitPlan returns in its name, and
// paramRef the parameters a condition reads.
var (
	initPlanParam = regexp.MustCompile(`^InitPlan \d+ \(returns (\$\d+)\)$`)
	paramRef      = regexp.MustCompile(`\$\d+`)
)

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
