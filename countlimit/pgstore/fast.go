package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/db"
	"github.com/countlimit/countlimit/internal/store/gather"
)

// fast reports whether r takes the fast path: an allow of one rule whose
// window is neither sliding nor smooth. Every other call goes to
// countlimit_apply (a peek too: docs/benchmarks.md has what a statement of
// its own saved, and it was not worth another copy of the decision; a
// smooth check too: the fast path's statements know nothing of smooth
// windows, see docs/ARCHITECTURE.md, "Smooth keys").
func fast(r *driver.Request) bool {
	return len(r.Checks) == 1 && r.Checks[0].Span == 0 && !r.Checks[0].Smooth() && r.Op == driver.OpAllow
}

// penaltyEnd is when a denial of c at now would end its penalty, or zero.
func penaltyEnd(r *driver.Request, c *driver.Check) pgtype.Timestamptz {
	if c.Block <= 0 {
		return pgtype.Timestamptz{}
	}
	return timestamptz(r.Now.Add(c.Block))
}

// oneStatement is the statement a call of the fast path is sent as, alone.
type oneStatement int

const (
	// oneWaits is AllowOne, waiting for a row another transaction holds
	// (a Store on a connection or a transaction).
	oneWaits oneStatement = iota
	// onePooled is AllowOnePooled (the pool): AllowOne with skip_locked,
	// after a statement of its own for a row that exists and is free.
	onePooled
	// oneSkips is AllowOne with skip_locked alone: what AllowOnePooled
	// sends after its first statement found the row absent or held. Only
	// tests send it alone (AllowOneSkippingLockedForTest), to reach what
	// it decides of a row that exists and is free, which it meets on the
	// pool when another transaction lets the row go between the two.
	oneSkips
)

// allowOne runs r, which takes the fast path, as one statement: AllowOne,
// AllowOnePooled or AllowOne with skip_locked (stmt). Skipping locks (all
// but oneWaits), a row another transaction holds locked, or has inserted
// and not committed, is not waited for: the call fails with errBusy,
// nothing written.
func (s *Store) allowOne(ctx context.Context, d DBTX, r *driver.Request, stmt oneStatement) error {
	c := &r.Checks[0]
	p := db.AllowOnePooledParams{
		N:          r.N,
		BeginTime:  timestamptz(c.Begin),
		WindowEnd:  nullTime(c.End),
		LimitValue: c.Limit,
		PenaltyEnd: penaltyEnd(r, c),
		UseType:    string(c.UseType),
		UniqueID:   r.ID,
		Now:        timestamptz(r.Now),
		WindowKind: c.Kind,
	}
	one := func() (db.AllowOneRow, error) {
		row, err := s.q.AllowOnePooled(ctx, d, p)
		return db.AllowOneRow(row), err
	}
	if stmt != onePooled {
		one = func() (db.AllowOneRow, error) {
			return s.q.AllowOne(ctx, d, db.AllowOneParams{UseType: p.UseType, UniqueID: p.UniqueID, Now: p.Now, N: p.N,
				LimitValue: p.LimitValue, BeginTime: p.BeginTime, WindowEnd: p.WindowEnd, PenaltyEnd: p.PenaltyEnd,
				SkipLocked: stmt == oneSkips, WindowKind: p.WindowKind})
		}
	}
	skipLocked := stmt != oneWaits
	for range gather.MaxAttempts {
		sent := time.Now()
		row, err := one()
		if errors.Is(err, pgx.ErrNoRows) {
			continue // the row was created concurrently: now it is there
		}
		if skipLocked && s.busy(ctx, err, sent) {
			return errBusy
		}
		if err != nil {
			return err
		}
		if row.Busy {
			return errBusy
		}
		c.State = state(row.Allowed, row.Used, row.WindowBegin, row.WindowEnd, row.BlockedUntil)
		return nil
	}
	return fmt.Errorf("pgstore: row (%s, %s) was created concurrently %d times over", c.UseType, r.ID, gather.MaxAttempts)
}

// state is a State from a statement's columns. For a Concurrent check,
// begin and end are the first and the last expiry of a live lease, both
// NULL when none is.
func state(allowed bool, used int64, begin, end, blocked pgtype.Timestamptz) driver.State {
	return driver.State{Allowed: allowed, Used: used, Begin: timeOf(begin), End: timeOf(end), BlockedUntil: timeOf(blocked)}
}

// sendBatch is the group commit: one statement for all calls. A batch of
// one is AllowOne; a batch whose calls all have keys of their own (nearly
// every batch over many ids) is AllowBatchDistinct; any other AllowBatch,
// which decides the calls of a key one after another. Calls whose row
// another transaction created meanwhile are sent again.
func (s *Store) sendBatch(ctx context.Context, calls []*gather.Call) {
	if len(calls) == 1 {
		calls[0].Err = outcome(s.allowOne(ctx, s.db, &calls[0].Req, onePooled))
		return
	}
	// Keys in lock order; calls of one key in arrival order.
	order := lockOrder(calls, func(a, b *driver.Request) int { return compareKeys(firstKey(a), firstKey(b)) })
	distinct := true
	for j := 1; j < len(order) && distinct; j++ {
		distinct = compareKeys(firstKey(&calls[order[j-1]].Req), firstKey(&calls[order[j]].Req)) != 0
	}
	if distinct {
		s.sendDistinct(ctx, calls, order)
		return
	}
	p := db.AllowBatchParams{
		KeyOf:       make([]int32, len(calls)),
		Seq:         make([]int32, len(calls)),
		Nows:        make([]pgtype.Timestamptz, len(calls)),
		Ns:          make([]int64, len(calls)),
		Limits:      make([]int64, len(calls)),
		Begins:      make([]pgtype.Timestamptz, len(calls)),
		WindowEnds:  make([]pgtype.Timestamptz, len(calls)),
		PenaltyEnds: make([]pgtype.Timestamptz, len(calls)),
	}
	first := make([]int, 0, len(calls)) // first[k-1] = position in order of key k's first call
	var seq int32
	for j, i := range order {
		r := &calls[i].Req
		c := &r.Checks[0]
		if j == 0 || compareKeys(firstKey(r), firstKey(&calls[order[j-1]].Req)) != 0 {
			p.UseTypes = append(p.UseTypes, string(c.UseType))
			p.UniqueIds = append(p.UniqueIds, r.ID)
			p.Kinds = append(p.Kinds, c.Kind) // the key's first call's
			first = append(first, j)
			seq = 0
		}
		seq++
		p.KeyOf[i] = int32(len(first))
		p.Seq[i] = seq
		p.Nows[i] = timestamptz(r.Now)
		p.Ns[i] = r.N
		p.Limits[i] = c.Limit
		p.Begins[i] = timestamptz(c.Begin)
		p.WindowEnds[i] = nullTime(c.End)
		p.PenaltyEnds[i] = penaltyEnd(r, c)
	}
	sent := time.Now()
	rows, err := s.q.AllowBatch(ctx, s.db, p)
	done := make([]bool, len(calls))
	for _, row := range rows {
		k, n := int(row.KeyOf), int(row.Seq)
		j := -1
		if k >= 1 && k <= len(first) {
			j = first[k-1] + n - 1
		}
		if n < 1 || j < 0 || j >= len(order) || int(p.KeyOf[order[j]]) != k || done[order[j]] {
			err = fmt.Errorf("pgstore: AllowBatch returned call (%d, %d), which it was not sent", k, n)
			break
		}
		i := order[j]
		done[i] = true
		if row.Busy {
			calls[i].Err = errBusy
			continue
		}
		calls[i].Req.Checks[0].State = state(row.Allowed, row.Used, row.WindowBegin, row.WindowEnd, row.BlockedUntil)
	}
	settle(calls, done, err, s.busy(ctx, err, sent))
}

// sendDistinct sends calls whose keys are all different, in lock order
// (order), as one AllowBatchDistinct statement.
func (s *Store) sendDistinct(ctx context.Context, calls []*gather.Call, order []int) {
	p := db.AllowBatchDistinctParams{
		UseTypes:    make([]string, len(order)),
		UniqueIds:   make([]string, len(order)),
		Nows:        make([]pgtype.Timestamptz, len(order)),
		Ns:          make([]int64, len(order)),
		Limits:      make([]int64, len(order)),
		Begins:      make([]pgtype.Timestamptz, len(order)),
		WindowEnds:  make([]pgtype.Timestamptz, len(order)),
		PenaltyEnds: make([]pgtype.Timestamptz, len(order)),
		Kinds:       make([]string, len(order)),
	}
	for j, i := range order {
		r := &calls[i].Req
		c := &r.Checks[0]
		p.UseTypes[j] = string(c.UseType)
		p.UniqueIds[j] = r.ID
		p.Nows[j] = timestamptz(r.Now)
		p.Ns[j] = r.N
		p.Limits[j] = c.Limit
		p.Begins[j] = timestamptz(c.Begin)
		p.WindowEnds[j] = nullTime(c.End)
		p.PenaltyEnds[j] = penaltyEnd(r, c)
		p.Kinds[j] = c.Kind
	}
	sent := time.Now()
	rows, err := s.q.AllowBatchDistinct(ctx, s.db, p)
	done := make([]bool, len(calls))
	for _, row := range rows {
		j := int(row.KeyOf) - 1
		if j >= 0 && j < len(order) && done[order[j]] && row.Busy && calls[order[j]].Err == errBusy {
			// countlimit_allow_distinct (migration 00001) reports a key
			// busy twice when it found the key held by another
			// transaction's insert at its first try and locked at its
			// second: the same answer again.
			continue
		}
		if j < 0 || j >= len(order) || done[order[j]] {
			err = fmt.Errorf("pgstore: AllowBatchDistinct returned call %d, which it was not sent", row.KeyOf)
			break
		}
		i := order[j]
		done[i] = true
		if row.Busy {
			calls[i].Err = errBusy
			continue
		}
		calls[i].Req.Checks[0].State = state(row.Allowed, row.Used, row.WindowBegin, row.WindowEnd, row.BlockedUntil)
	}
	settle(calls, done, err, s.busy(ctx, err, sent))
}

// settle ends a batch's statement: if it failed (err), every call fails with
// it, or is busy when it gave up waiting for a lock (busy); else the calls it
// did not apply (done false) are sent again.
func settle(calls []*gather.Call, done []bool, err error, busy bool) {
	if busy {
		// A lock the batch could not get by key: a DBA's lock of the
		// table, or a second held key met on the run past the first.
		for _, c := range calls {
			c.Err = errBusy
		}
		return
	}
	if err != nil {
		err = interpretError(err)
		for _, c := range calls {
			c.Err = err
		}
		return
	}
	for i, c := range calls {
		if !done[i] {
			c.Retry()
		}
	}
}

// outcome is a call's Err from its statement's error: errBusy as it is,
// any other through interpretError.
func outcome(err error) error {
	if err == errBusy {
		return errBusy
	}
	return interpretError(err)
}

// lockOrder returns the positions of calls sorted by cmp of their
// requests, calls that compare equal in arrival order.
func lockOrder(calls []*gather.Call, cmp func(a, b *driver.Request) int) []int {
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp(&calls[a].Req, &calls[b].Req) })
	return order
}

// key is a row's primary key, in the order statements lock rows: by
// unique_id, then use_type, bytewise (COLLATE "C").
type key struct{ id, useType string }

// firstKey is the first row r locks: its id with its least use type.
func firstKey(r *driver.Request) key {
	k := key{id: r.ID}
	for i := range r.Checks {
		if ut := string(r.Checks[i].UseType); i == 0 || ut < k.useType {
			k.useType = ut
		}
	}
	return k
}

// rowSeed keys rowHash.
var rowSeed = maphash.MakeSeed()

// rowHash is the hash of the row a group-committed call (one rule) locks,
// for the batcher, which never lets two batches in flight share a row.
func rowHash(r *driver.Request) uint64 {
	var h maphash.Hash
	h.SetSeed(rowSeed)
	h.WriteString(r.ID)
	h.WriteByte(0)
	h.WriteString(string(r.Checks[0].UseType))
	return h.Sum64()
}

func compareKeys(a, b key) int {
	return cmp.Or(strings.Compare(a.id, b.id), strings.Compare(a.useType, b.useType))
}
