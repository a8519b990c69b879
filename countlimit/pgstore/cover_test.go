package pgstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/coverreport"
	"github.com/countlimit/countlimit/internal/testkit/model"
	"github.com/countlimit/countlimit/internal/testkit/modeltest"
)

// The statements that decide a call of the fast path, as the coverage
// report names them (internal/testkit/coverreport), and countlimit_apply. The
// pool sends a lone call as countlimit_allow_one_pooled, whose first
// statement decides a row that exists and is free, and whose second,
// countlimit_allow_one skipping locks, every other; a batch of distinct
// keys as countlimit_allow_distinct_pooled (a first statement for rows
// that all exist and are free, then countlimit_allow_distinct); a batch
// that repeats a key as countlimit_allow_batch_pooled (a first statement
// for rows that all exist, are free and have room for every call, then
// countlimit_allow_batch's fold). A Store on a connection or a
// transaction sends countlimit_allow_one waiting for locks.
const (
	stmtPooled       = "countlimit_allow_one_pooled, first statement"
	stmtSkips        = "countlimit_allow_one, skipping locks"
	stmtWaits        = "countlimit_allow_one, waiting for locks"
	stmtDistinctFree = "countlimit_allow_distinct_pooled, first statement"
	stmtDistinct     = "countlimit_allow_distinct"
	stmtBatchFits    = "countlimit_allow_batch_pooled, first statement"
	stmtBatch        = "countlimit_allow_batch"
	stmtApply        = "countlimit_apply"
)

// The cases of a batch, and of a row another transaction holds, beside
// modeltest.Arms.
const (
	armBusy       = "a row another transaction holds: busy"
	armBusyNew    = "a new key another transaction is inserting: busy"
	armLater      = "a later call of its key in the batch"
	armLaterBlock = "a later call in a penalty an earlier call of the batch set"
	armOneKey     = "the calls of one key"
	armKeys       = "the calls of several keys"
)

// fastCases are every case of the fast path's statements and
// countlimit_apply (modeltest.Path.AllCases): each statement's arms of
// the decision (modeltest.Arms), but those it never takes by its own
// WHERE: a first statement takes no new key (the second statement does),
// and countlimit_allow_batch_pooled's only calls that all fit in windows
// that are current and free.
var fastCases = func() []string {
	var out []string
	add := func(stmt string, arms ...[]string) {
		for _, as := range arms {
			for _, a := range as {
				out = append(out, stmt+": "+a)
			}
		}
	}
	existing := slices.DeleteFunc(slices.Clone(modeltest.WindowArms), func(a string) bool { return a == modeltest.ArmNew })
	busy := []string{armBusy, armBusyNew}
	add(stmtPooled, existing)
	add(stmtSkips, modeltest.WindowArms, busy)
	add(stmtWaits, modeltest.WindowArms)
	add(stmtDistinctFree, existing)
	add(stmtDistinct, modeltest.WindowArms, busy)
	add(stmtBatchFits, []string{modeltest.ArmLifetime, modeltest.ArmCurrent, modeltest.ArmLog, modeltest.ArmSmooth,
		modeltest.ArmBlockEndsNow, modeltest.ArmBlockOver, modeltest.ArmAllowedIn, modeltest.ArmAllowedFull, modeltest.ArmEndsNowAllowed,
		armOneKey, armKeys})
	add(stmtBatch, modeltest.WindowArms, busy, []string{armLater, armLaterBlock})
	add(stmtApply, modeltest.AllArms)
	return out
}()

// sends are how a path sends a step's fast calls: each alone (as the
// statement stmt, or as the pool sends one), or together as one group
// commit.
type sends int

const (
	eachPooled sends = iota // the pool's lone statement, a call at a time
	eachWaits               // countlimit_allow_one waiting, a call at a time
	eachSkips               // countlimit_allow_one skipping locks, a call at a time
	together                // one group commit
)

// casesOf returns a Path.Cases for a path that sends fast calls as how
// says and every other call to countlimit_apply (or a lease's or a
// reset's function, which have no cases here). held, when not nil, gives
// the calls of the step just taken whose row another transaction held for
// their first send, and whether that row existed; they were sent again,
// alone or together as how says, once it was let go.
func casesOf(how sends, held func() (calls []bool, existed bool)) func([]*driver.Request, [][]model.Key) []string {
	return func(reqs []*driver.Request, before [][]model.Key) []string {
		var out []string
		add := func(stmt string, arms ...string) {
			for _, a := range arms {
				out = append(out, stmt+": "+a)
			}
		}
		var fastOnes []int
		for i, r := range reqs {
			if fast(r) {
				fastOnes = append(fastOnes, i)
				continue
			}
			if r.Op == driver.OpReset || r.OnLeases() {
				continue
			}
			for c := range r.Checks {
				add(stmtApply, modeltest.Arms(before[i][c], r, &r.Checks[c])...)
			}
		}
		if len(fastOnes) == 0 {
			return out
		}
		var isHeld []bool
		existed := false
		if held != nil {
			isHeld, existed = held()
		}
		lone := func(i int) {
			r, k := reqs[i], before[i][0]
			switch {
			case how == eachWaits:
				add(stmtWaits, modeltest.Arms(k, r, &r.Checks[0])...)
			case how == eachSkips || keystate.Empty(&k):
				add(stmtSkips, modeltest.Arms(k, r, &r.Checks[0])...)
			default:
				add(stmtPooled, modeltest.Arms(k, r, &r.Checks[0])...)
			}
		}
		if how != together {
			for _, i := range fastOnes {
				lone(i)
			}
			return out
		}
		// A group commit: the calls not held, then, sent again, the held
		// ones.
		send := func(calls []int, busy bool) {
			if len(calls) == 0 {
				return
			}
			if len(calls) == 1 && !busy {
				lone(calls[0])
				return
			}
			if len(calls) == 1 {
				// countlimit_allow_one_pooled's first statement skips the
				// held row; its second finds it busy.
				if existed {
					add(stmtSkips, armBusy)
				} else {
					add(stmtSkips, armBusyNew)
				}
				return
			}
			distinct, exist, fit := true, !busy, !busy
			seen := map[string]int{}
			for _, i := range calls {
				r, k := reqs[i], before[i][0]
				key := r.Checks[0].UseType + "\x00" + r.ID
				seen[key]++
				if seen[key] > 1 {
					distinct = false
					continue
				}
				exist = exist && !keystate.Empty(&k)
			}
			for _, i := range calls {
				arms := modeltest.Arms(before[i][0], reqs[i], &reqs[i].Checks[0])
				fit = fit && slices.Contains(arms, modeltest.ArmAllowedIn)
			}
			stmt := stmtBatch
			switch {
			case distinct && exist:
				stmt = stmtDistinctFree
			case distinct:
				stmt = stmtDistinct
			case exist && fit:
				stmt = stmtBatchFits
				if len(seen) == 1 {
					add(stmt, armOneKey)
				} else {
					add(stmt, armKeys)
				}
			}
			first := map[string]int{}
			for _, i := range calls {
				r, k := reqs[i], before[i][0]
				key := r.Checks[0].UseType + "\x00" + r.ID
				if isHeld != nil && isHeld[i] && busy {
					if existed {
						add(stmt, armBusy)
					} else {
						add(stmt, armBusyNew)
					}
					continue
				}
				add(stmt, modeltest.Arms(k, r, &r.Checks[0])...)
				if j, ok := first[key]; ok && stmt == stmtBatch {
					add(stmt, armLater)
					if now := r.Now.UnixMicro(); k.Blocked > now && before[j][0].Blocked <= now {
						add(stmt, armLaterBlock)
					}
				} else if !ok {
					first[key] = i
				}
			}
		}
		var free, again []int
		for _, i := range fastOnes {
			if isHeld != nil && isHeld[i] {
				again = append(again, i)
			} else {
				free = append(free, i)
			}
		}
		if len(again) > 0 {
			// The first send: every call, the held ones busy.
			send(fastOnes, true)
			send(again, false)
			return out
		}
		send(free, false)
		return out
	}
}

// fast mirrors pgstore's choice of the fast path: an allow of one rule
// whose window is neither sliding nor smooth.
func fast(r *driver.Request) bool {
	return r.Op == driver.OpAllow && len(r.Checks) == 1 && r.Checks[0].Span == 0 && !r.Checks[0].Smooth() && r.Checks[0].TTL == 0
}

// heldSends returns a Path.Do that sends a step of fast calls as one
// group commit while another transaction holds the row of its last
// call's key (locked when it exists, inserted and not committed when it
// is new; the generator puts the key whose instant the clock landed on
// first in a batch of keys of their own), then, once that transaction has rolled back, the calls it
// found busy, again as one group commit; and a function that tells
// casesOf which calls were held. Every call of the held key must be
// busy, and only those: each is then decided after the others, which,
// on keys of their own, is the order the model decides them in.
func heldSends(pool *pgxpool.Pool, s *pgstore.Store) (func(context.Context, []*driver.Request) error, func() ([]bool, bool)) {
	var lastHeld []bool
	var lastExisted bool
	do := func(ctx context.Context, reqs []*driver.Request) error {
		lastHeld, lastExisted = nil, false
		last := reqs[len(reqs)-1]
		ut, id := last.Checks[0].UseType, last.ID
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		tag, err := tx.Exec(ctx, `SELECT FROM count_limit WHERE use_type = $1 AND unique_id = $2 FOR NO KEY UPDATE`, ut, id)
		if err != nil {
			return err
		}
		existed := tag.RowsAffected() == 1
		if !existed {
			if _, err := tx.Exec(ctx, `INSERT INTO count_limit (use_type, unique_id, begin_time) VALUES ($1, $2, $3)`, ut, id, last.Now); err != nil {
				return err
			}
		}
		held := make([]bool, len(reqs))
		var again []*driver.Request
		for i, err := range s.AllowBatchEachForTest(ctx, reqs) {
			r := reqs[i]
			held[i] = r.Checks[0].UseType == ut && r.ID == id
			switch {
			case held[i] && errors.Is(err, pgstore.ErrBusy):
				again = append(again, r)
			case held[i]:
				return fmt.Errorf("call %d, on the held row (%s, %s): got %v, want busy", i, ut, id, err)
			case err != nil:
				return fmt.Errorf("call %d, beside the held row (%s, %s): %w", i, ut, id, err)
			}
		}
		if err := tx.Rollback(ctx); err != nil {
			return err
		}
		lastHeld, lastExisted = held, existed
		return s.AllowBatchForTest(ctx, again)
	}
	return do, func() ([]bool, bool) { return lastHeld, lastExisted }
}

// writeProfile writes what plpgsql_check's profiler counted of every
// function of the schema pool works in, for internal/testkit/coverreport, into
// the directory modeltest.EnvCover names, if it names one. The server
// must load plpgsql_check at start with its profiler on, and have the
// extension in the public schema: coverreport's TestReport starts such a
// server.
func writeProfile(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	dir := os.Getenv(modeltest.EnvCover)
	if dir == "" {
		return
	}
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT p.oid::regprocedure::text, l.lanname, p.prosrc
		FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.pronamespace = current_schema()::regnamespace AND l.lanname IN ('plpgsql', 'sql')
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (coverreport.Function, error) {
		var f coverreport.Function
		return f, r.Scan(&f.Signature, &f.Language, &f.Source)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range fns {
		f := &fns[i]
		if f.Language != "plpgsql" {
			continue
		}
		rows, err := pool.Query(ctx, `SELECT stmtid, coalesce(parent_stmtid, -1), coalesce(parent_note, ''), lineno, stmtname, exec_stmts
			FROM public.plpgsql_profiler_function_statements_tb($1::regprocedure)`, f.Signature)
		if err != nil {
			t.Fatalf("%s: %v (%s needs a server that loads plpgsql_check at start, its profiler on, the extension in public)", f.Signature, err, modeltest.EnvCover)
		}
		f.Statements, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (coverreport.Statement, error) {
			var s coverreport.Statement
			return s, r.Scan(&s.ID, &s.Parent, &s.ParentNote, &s.Line, &s.Name, &s.Exec)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(fns)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, coverreport.ProfileFile(os.Getpid())), b, 0o644); err != nil {
		t.Fatal(err)
	}
}
