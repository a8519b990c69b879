package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// The baseline for PostgreSQL: what a careful engineer writes by hand for a
// fixed-window counter, one upsert on a 4-column table that counts only
// while under the limit. Allow does more (penalties, denial tallies, exact
// RetryAfter, every window kind, audit columns), and must still keep up.
const (
	baselineTable = `CREATE TABLE %s (
		key          text PRIMARY KEY,
		count        bigint NOT NULL,
		window_begin timestamptz NOT NULL,
		window_end   timestamptz NOT NULL)`
	baselineUpsert = `INSERT INTO %s AS c (key, count, window_begin, window_end) VALUES ($1, 1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET
			count        = CASE WHEN c.window_end <= $4 THEN 1 ELSE c.count + 1 END,
			window_begin = CASE WHEN c.window_end <= $4 THEN excluded.window_begin ELSE c.window_begin END,
			window_end   = CASE WHEN c.window_end <= $4 THEN excluded.window_end ELSE c.window_end END
		WHERE c.count < $5 OR c.window_end <= $4
		RETURNING count`
)

// baselineCell is one line of the comparison.
type baselineCell struct {
	callers int
	hot     bool
}

// benchBaseline runs the hand-written upsert and Allow alternately (ABBA), in
// this process, at each number of callers, over many ids and on one hot id, each
// on a pool of as many connections as callers, and prints both and their
// ratio.
func benchBaseline(ctx context.Context, url string, callers []int, d time.Duration, ids int, out *benchOutput) error {
	if !isPostgres(url) {
		return usageErrorf("bench --baseline: the baseline is PostgreSQL's hand-written upsert; --store must be postgres://..., got %q", redactURL(url))
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	table := pgx.Identifier{"countlimit_bench_baseline_" + suffix}.Sanitize()
	useType := countlimit.UseType("bench." + suffix)

	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		return badStoreURL(url, err)
	}
	defer admin.Close()
	if err := pgstore.New(admin).Ping(ctx); err != nil {
		return fmt.Errorf("--store %s: %w", redactURL(url), err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(baselineTable, table)); err != nil {
		return fmt.Errorf("bench: creating the baseline table: %w", err)
	}
	defer func() {
		// Clean up even when ctx was cancelled (Ctrl-C).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP TABLE "+table)
		_, _ = admin.Exec(ctx, "DELETE FROM count_limit WHERE use_type = $1", string(useType))
	}()
	var sync string
	if err := admin.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sync); err != nil {
		return err
	}

	names := benchIDs(ids)
	hot := []string{"hot"}
	rule := countlimit.Rule{UseType: useType, Limit: countlimit.MaxLimit, Window: countlimit.Fixed(time.Minute)}
	out.report = benchReport{Mode: "bench --baseline", Store: redactURL(url), SynchronousCommit: sync, RunSeconds: d.Seconds(), Started: time.Now().UTC(),
		Rules: []benchRule{{Name: "bench", Window: rule.Window.String(), Limit: rule.Limit}}}

	fmt.Fprintf(out.human, "countlimit bench --baseline: %s, synchronous_commit=%s, %v per cell, Allow of a fixed 1m window\n",
		redactURL(url), sync, d)
	fmt.Fprintf(out.human, "baseline: one INSERT ... ON CONFLICT DO UPDATE ... WHERE count < limit RETURNING on a 4-column table\n\n")
	// Every id is counted once first, untimed, so that both sides are
	// measured on rows that exist, as in a service that has run a while.
	warm := countlimit.New(pgstore.New(admin))
	upsert := fmt.Sprintf(baselineUpsert, table)
	for _, id := range append(names, hot...) {
		now := time.Now()
		if _, err := admin.Exec(ctx, upsert, id, now, now.Add(time.Minute), now, rule.Limit); err != nil {
			return fmt.Errorf("bench: warming up: %w", err)
		}
		if _, err := warm.Allow(ctx, rule, id); err != nil {
			return fmt.Errorf("bench: warming up: %w", err)
		}
	}
	const row = "%7s %6s %10s %10s %7s %11s %11s %11s %11s\n"
	fmt.Fprintf(out.human, row, "callers", "ids", "upsert/s", "Allow/s", "ratio", "upsert p50", "Allow p50", "upsert p99", "Allow p99")
	var cells []baselineCell
	for _, c := range callers {
		cells = append(cells, baselineCell{c, false}, baselineCell{c, true})
	}
	for _, cell := range cells {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return err
		}
		cfg.MaxConns = int32(cell.callers)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		keys := names
		if cell.hot {
			keys = hot
		}
		l := countlimit.New(pgstore.New(pool))
		upsertCall := func(ctx context.Context, id string) (bool, error) {
			now := time.Now()
			begin := now.Truncate(time.Minute)
			var n int64
			err := pool.QueryRow(ctx, upsert, id, begin, begin.Add(time.Minute), now, rule.Limit).Scan(&n)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return err == nil, err
		}
		allowCall := func(ctx context.Context, id string) (bool, error) {
			res, err := l.Allow(ctx, rule, id)
			return res.Allowed, err
		}
		// Rounds of upsert, Allow, Allow, upsert, each piece 1 to 2 s
		// (half of --duration when that is shorter): the disk's flush
		// latency drifts by tens of percent within seconds here; this
		// order cancels a steady drift instead of handing it to whichever
		// side ran second, and several rounds share an unsteady one. Pieces
		// of a second or more keep the calls cut short at each turn few.
		rounds := max(1, int(d/(2*time.Second)))
		piece := d / time.Duration(2*rounds)
		base, ours := &measurement{}, &measurement{}
		for range rounds {
			base.add(measure(ctx, cell.callers, piece, keys, upsertCall))
			ours.add(measure(ctx, cell.callers, piece, keys, allowCall))
			ours.add(measure(ctx, cell.callers, piece, keys, allowCall))
			base.add(measure(ctx, cell.callers, piece, keys, upsertCall))
		}
		pool.Close()
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, m := range []*measurement{base, ours} {
			if m.errs > 0 {
				return fmt.Errorf("bench: %s failed, the first: %w", plural(m.errs, "call", "calls"), m.firstErr)
			}
		}
		out.report.Runs = append(out.report.Runs, newBenchRun(base, cell.callers, len(keys), "upsert"), newBenchRun(ours, cell.callers, len(keys), "allow"))
		fmt.Fprintf(out.human, row, strconv.Itoa(cell.callers), strconv.Itoa(len(keys)), fmt.Sprintf("%.0f", base.rate()), fmt.Sprintf("%.0f", ours.rate()),
			fmt.Sprintf("%.2f×", ours.rate()/base.rate()), latency(base.pct(.5).Seconds()), latency(ours.pct(.5).Seconds()),
			latency(base.pct(.99).Seconds()), latency(ours.pct(.99).Seconds()))
	}
	return nil
}

// parseCallers parses a list of numbers of callers like "1,4,16,64", given
// to flag (--callers or --concurrency) of cmd.
func parseCallers(cmd, flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10000 {
			return nil, usageErrorf("%s: %s wants numbers from 1 to 10000 separated by commas, got %q", cmd, flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}
