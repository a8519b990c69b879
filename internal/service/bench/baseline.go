package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"
	"github.com/countlimit/countlimit/internal/service/clikit"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
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

// The tables a --baseline cell starts from (--rows).
const (
	// rowsExisting: every id was counted once on both sides, untimed, as in
	// a service that has run a while.
	rowsExisting = "existing"
	// rowsNew: both tables from TRUNCATE, autovacuum off for them, every
	// call on an id never seen: a new deployment's first minutes, at its
	// worst (no ANALYZE comes to change a plan).
	rowsNew = "new"
	// rowsRandom: each cell's tables from TRUNCATE and ANALYZE (statistics
	// that say "empty"), every call on an id drawn at random from --ids, so
	// that a cell starts with inserts and turns into updates, as a new
	// deployment's first minutes do; the whole series twice in a row on
	// the same database, since a database that has run it before is where
	// plans made while the table looked empty showed (issue 33).
	rowsRandom = "random"
	// randomRuns is how many times --rows random runs its series.
	randomRuns = 2
	// maxTableRows bounds --table-rows: ids carry eight digits.
	maxTableRows = 100_000_000
)

// parseRows parses --rows: a list of existing, new and random.
func parseRows(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		switch f = strings.TrimSpace(f); f {
		case rowsExisting, rowsNew, rowsRandom:
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		default:
			return nil, clikit.UsageErrorf("bench --baseline: --rows wants a list of existing, new and random (e.g. existing,new), got %q", s)
		}
	}
	return out, nil
}

// tableID is the id of the i-th row a --table-rows fill writes, on both
// sides: eight digits, so that ids sort as they are numbered and the fill
// writes each index in key order.
func tableID(i int) string { return fmt.Sprintf("bench-%08d", i) }

// fillTables fills count_limit and the baseline table with n rows each, as
// one Allow and one upsert of tableID(i) for i < n (and of "hot") would
// leave them in the current minute, then VACUUM ANALYZEs both: a table of
// n rows in a few statements instead of 2n calls. It returns the bytes on
// disk (table, TOAST and indexes) of each.
func fillTables(ctx context.Context, pool *pgxpool.Pool, table string, n int, limit int64) (ours, base int64, err error) {
	begin := time.Now().Truncate(time.Minute)
	if _, err := pool.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, window_kind)
		SELECT 'bench', id, 1, $2, $3, $4, 'fixed'
		FROM (SELECT 'bench-' || lpad(i::text, 8, '0') FROM generate_series(0, $1 - 1) AS i UNION ALL SELECT 'hot') AS ids (id)`,
		n, begin, begin.Add(time.Minute), limit); err != nil {
		return 0, 0, fmt.Errorf("bench: --table-rows: filling count_limit: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, count, window_begin, window_end)
		SELECT id, 1, $2, $3
		FROM (SELECT 'bench-' || lpad(i::text, 8, '0') FROM generate_series(0, $1 - 1) AS i UNION ALL SELECT 'hot') AS ids (id)`,
		n, begin, begin.Add(time.Minute)); err != nil {
		return 0, 0, fmt.Errorf("bench: --table-rows: filling the baseline table: %w", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE count_limit, "+table); err != nil {
		return 0, 0, fmt.Errorf("bench: --table-rows: %w", err)
	}
	err = pool.QueryRow(ctx, `SELECT pg_total_relation_size('count_limit'), pg_total_relation_size($1::regclass)`, table).Scan(&ours, &base)
	return ours, base, err
}

// benchBaseline runs the hand-written upsert and Allow alternately (ABBA), in
// this process, at each number of callers, each on a pool of as many
// connections as callers, and prints both and their ratio: on rows that
// exist (over many ids and on one hot id; with tableRows > 0 over tables
// filled with that many rows), on new ids and on random ids (rows). It works
// in a schema of its own, made and dropped here, so it neither reads nor
// writes the database's own count_limit, and may TRUNCATE its tables.
func benchBaseline(ctx context.Context, url string, checks []baselineCheck, callers []int, d time.Duration, ids, tableRows int, rows []string, out *benchOutput) error {
	if !clikit.IsPostgres(url) {
		return clikit.UsageErrorf("bench --baseline: the baseline is PostgreSQL's hand-written upsert; --store must be postgres://..., got %q", clikit.RedactURL(url))
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	schema := "countlimit_bench_" + suffix
	table := pgx.Identifier{schema, "baseline"}.Sanitize()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return clikit.BadStoreURL(url, err)
	}
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return clikit.BadStoreURL(url, err)
	}
	defer admin.Close()
	if err := admin.Ping(ctx); err != nil {
		return fmt.Errorf("--store %s: %w", clikit.RedactURL(url), driver.Unavailable(err))
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("bench: creating the schema of the run: %w", err)
	}
	defer func() {
		// Clean up even when ctx was cancelled (Ctrl-C).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintf(out.warn, "countlimit: bench: schema %s was left behind (drop it by hand): %v\n", schema, err)
		}
	}()
	// Every pool of the run works in the schema alone.
	inSchema := func(maxConns int32) (*pgxpool.Pool, error) {
		c := cfg.Copy()
		c.ConnConfig.RuntimeParams["search_path"] = schema
		if maxConns > 0 {
			c.MaxConns = maxConns
		}
		return pgxpool.NewWithConfig(ctx, c)
	}
	setup, err := inSchema(0)
	if err != nil {
		return err
	}
	defer setup.Close()
	if err := pgstore.Migrate(ctx, setup); err != nil {
		return fmt.Errorf("bench: migrating the schema of the run: %w", err)
	}
	if _, err := setup.Exec(ctx, fmt.Sprintf(baselineTable, table)); err != nil {
		return fmt.Errorf("bench: creating the baseline table: %w", err)
	}
	var sync string
	if err := setup.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sync); err != nil {
		return err
	}

	names := benchIDs(ids)
	out.report = benchReport{Mode: "bench --baseline", Store: clikit.RedactURL(url), SynchronousCommit: sync, RunSeconds: d.Seconds(), Started: time.Now().UTC()}
	for _, ck := range checks {
		out.report.Checks = append(out.report.Checks, ck.name)
		for _, r := range ck.rules {
			out.report.Rules = append(out.report.Rules, benchRule{Check: ck.name, Name: string(r.UseType), Window: r.Window.String(), Limit: r.Limit})
		}
	}

	fmt.Fprintf(out.human, "countlimit bench --baseline: %s, synchronous_commit=%s, %v per cell, in schema %s (dropped at the end)\n",
		clikit.RedactURL(url), sync, d, schema)
	fmt.Fprintf(out.human, "baseline: one INSERT ... ON CONFLICT DO UPDATE ... WHERE count < limit RETURNING on a 4-column table\n")
	upsert := fmt.Sprintf(baselineUpsert, table)
	limit := int64(expose.MaxLimit)
	const row = "%7s %9s %10s %11s %7s %11s %13s %11s %13s\n"
	// A series is one pass over the cells of a --rows mode: random runs
	// its series twice.
	type series struct {
		mode string
		run  int // 1 or 2 for random, else 0
	}
	var all []series
	for _, mode := range rows {
		if mode != rowsRandom {
			all = append(all, series{mode, 0})
			continue
		}
		for run := 1; run <= randomRuns; run++ {
			all = append(all, series{mode, run})
		}
	}
	for _, ck := range checks {
		fmt.Fprintf(out.human, "\n--check %s: %s, a limit no call reaches\n", ck.name, ck.what)
		head := fmt.Sprintf(row, "callers", "ids", "upsert/s", ck.label+"/s", "ratio", "upsert p50", ck.label+" p50", "upsert p99", ck.label+" p99")
		for _, sr := range all {
			mode := sr.mode
			if _, err := setup.Exec(ctx, "TRUNCATE count_limit, count_limit_lease, "+table); err != nil {
				return fmt.Errorf("bench: emptying the tables of the run: %w", err)
			}
			// Autovacuum as a service has it, but for new ids (below).
			for _, t := range []string{"count_limit", table} {
				if _, err := setup.Exec(ctx, "ALTER TABLE "+t+" RESET (autovacuum_enabled)"); err != nil {
					return err
				}
			}
			var cells []baselineCell
			switch {
			case mode == rowsExisting && tableRows > 0:
				fmt.Fprintf(out.human, "\nrows that exist: both tables filled with %d rows (generate_series), VACUUM ANALYZE, CHECKPOINT, every call on an id drawn at random from them\n", tableRows)
				ours, base, err := fillTables(ctx, setup, table, tableRows, ck.rules[0].Limit)
				if err != nil {
					return err
				}
				// The fill left both tables' pages dirty in shared_buffers (3 GB
				// at 10 million rows): written back during the cells, they would
				// slow whichever side meets the checkpoint, on the big table only.
				if _, err := setup.Exec(ctx, "CHECKPOINT"); err != nil {
					fmt.Fprintf(out.warn, "countlimit: bench: no CHECKPOINT after the fill (%v): the first cells may meet its pages' write-back\n", err)
				}
				n := float64(tableRows + 1)
				fmt.Fprintf(out.human, "on disk (table + indexes): count_limit %.0f bytes a row, the upsert's table %.0f (%.2f×)\n",
					float64(ours)/n, float64(base)/n, float64(ours)/float64(base))
				out.report.TableRows, out.report.CountLimitBytes, out.report.BaselineBytes = tableRows, ours, base
				fmt.Fprint(out.human, head)
			case mode == rowsExisting:
				fmt.Fprintf(out.human, "\nrows that exist: every id counted once on both sides first, untimed\n")
				// As in a service that has run a while.
				warm := ck.on(countlimit.New(pgstore.New(setup)))
				for _, id := range append(slices.Clone(names), "hot") {
					now := time.Now()
					if _, err := setup.Exec(ctx, upsert, id, now, now.Add(time.Minute), now, limit); err != nil {
						return fmt.Errorf("bench: warming up: %w", err)
					}
					if _, err := warm(ctx, id); err != nil {
						return fmt.Errorf("bench: warming up: %w", err)
					}
				}
				if _, err := setup.Exec(ctx, "ANALYZE count_limit, "+table); err != nil {
					return err
				}
				fmt.Fprint(out.human, head)
			case mode == rowsNew:
				fmt.Fprintf(out.human, "\nnew ids: every call a first touch; each cell's tables start from TRUNCATE, autovacuum off\n")
				for _, t := range []string{"count_limit", table} {
					if _, err := setup.Exec(ctx, "ALTER TABLE "+t+" SET (autovacuum_enabled = false)"); err != nil {
						return err
					}
				}
			default:
				fmt.Fprintf(out.human, "\nrandom ids, run %d of %d: each cell's tables from TRUNCATE and ANALYZE, every call on one of %d ids drawn at random\n",
					sr.run, randomRuns, len(names))
			}
			// Over rows that exist, a cell on many ids and one on a hot id for
			// each number of callers; otherwise a cell each, whose Allow rate
			// is shown by fifths too.
			for _, c := range callers {
				if mode == rowsExisting {
					cells = append(cells, baselineCell{c, false}, baselineCell{c, true})
				} else {
					cells = append(cells, baselineCell{c, false})
				}
			}
			if mode != rowsExisting {
				fmt.Fprintf(out.human, "%s%27s\n", strings.TrimSuffix(head, "\n"), ck.label+"/s, 1st → 5th fifth")
			}
			for _, cell := range cells {
				if mode != rowsExisting {
					if _, err := setup.Exec(ctx, "TRUNCATE count_limit, count_limit_lease, "+table); err != nil {
						return err
					}
				}
				if mode == rowsRandom {
					// Statistics that say "empty", as a new deployment's first
					// ANALYZE leaves them.
					if _, err := setup.Exec(ctx, "ANALYZE count_limit, count_limit_lease, "+table); err != nil {
						return err
					}
				}
				pool, err := inSchema(int32(cell.callers))
				if err != nil {
					return err
				}
				l := countlimit.New(pgstore.New(pool))
				upsertCall := func(ctx context.Context, id string) (bool, error) {
					now := time.Now()
					begin := now.Truncate(time.Minute)
					var n int64
					err := pool.QueryRow(ctx, upsert, id, begin, begin.Add(time.Minute), now, limit).Scan(&n)
					if errors.Is(err, pgx.ErrNoRows) {
						return false, nil
					}
					return err == nil, err
				}
				allowCall := ck.on(l)
				// pick gives each piece its ids: the cell's in turn, ids no
				// piece has used, or ids drawn at random.
				pieces := 0
				pick := func() func(w, i int) string {
					pieces++
					switch {
					case mode == rowsNew:
						prefix := "n" + strconv.Itoa(pieces) + "."
						return func(_, i int) string { return prefix + strconv.Itoa(i) }
					case cell.hot:
						return inTurn([]string{"hot"})
					case mode == rowsRandom:
						return func(_, _ int) string { return names[mrand.IntN(len(names))] }
					case tableRows > 0:
						return func(_, _ int) string { return tableID(mrand.IntN(tableRows)) }
					}
					return inTurn(names)
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
					base.add(measure(ctx, cell.callers, piece, pick(), upsertCall))
					ours.add(measure(ctx, cell.callers, piece, pick(), allowCall))
					ours.add(measure(ctx, cell.callers, piece, pick(), allowCall))
					base.add(measure(ctx, cell.callers, piece, pick(), upsertCall))
				}
				pool.Close()
				if err := ctx.Err(); err != nil {
					return err
				}
				base.stalled(out.warn, "the upsert", cell.callers)
				ours.stalled(out.warn, ck.label, cell.callers)
				for _, m := range []*measurement{base, ours} {
					if m.errs > 0 {
						return fmt.Errorf("bench: %s failed, the first: %w", clikit.Plural(m.errs, "call", "calls"), m.firstErr)
					}
				}
				nids, idsCol := len(names), strconv.Itoa(len(names))
				switch {
				case mode == rowsNew:
					nids, idsCol = 0, "new"
				case cell.hot:
					nids, idsCol = 1, "1"
				case mode == rowsExisting && tableRows > 0:
					nids, idsCol = tableRows, strconv.Itoa(tableRows)
				}
				br, or := newBenchRun(base, cell.callers, nids, "upsert"), newBenchRun(ours, cell.callers, nids, ck.call)
				br.Check, or.Check = ck.name, ck.name
				br.Rows, or.Rows = mode, mode
				br.Run, or.Run = sr.run, sr.run
				line := fmt.Sprintf(row, strconv.Itoa(cell.callers), idsCol, fmt.Sprintf("%.0f", base.rate()), fmt.Sprintf("%.0f", ours.rate()),
					ratio(ours.rate(), base.rate()), latency(base.pct(.5).Seconds()), latency(ours.pct(.5).Seconds()),
					latency(base.pct(.99).Seconds()), latency(ours.pct(.99).Seconds()))
				if mode != rowsExisting {
					first, last := ours.fifths()
					or.FirstFifthPerSecond, or.LastFifthPerSecond = first, last
					line = strings.TrimSuffix(line, "\n") + fmt.Sprintf("%27s\n", fmt.Sprintf("%.0f → %.0f", first, last))
				}
				out.report.Runs = append(out.report.Runs, br, or)
				fmt.Fprint(out.human, line)
			}
		}
	}
	return nil
}

// ratio prints a/b as the table's ratio column: "n/a" where b is 0, a
// cell whose baseline saw no call end (a stalled disk on a short cell),
// which has no ratio and is said on stderr.
func ratio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// parseCallers parses a list of numbers of callers like "1,4,16,64", given
// to flag (--callers or --concurrency) of cmd.
func parseCallers(cmd, flag, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10000 {
			return nil, clikit.UsageErrorf("%s: %s wants numbers from 1 to 10000 separated by commas, got %q", cmd, flag, s)
		}
		out = append(out, n)
	}
	return out, nil
}
