package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

// DefaultPurgeBatchSize is the batch size of PurgeEvery, and of the CLI's
// purge and serve, unless told otherwise: each batch is one short
// statement holding at most that many row locks.
const DefaultPurgeBatchSize = 1000

// purgeBatchTimeout bounds one batch of PurgeEvery, so that a database
// that stops answering mid-statement (a dropped connection that TCP has
// not noticed) fails the pass instead of holding it until the kernel gives
// up; the next pass tries again.
const purgeBatchTimeout = time.Minute

// PurgePass is what one pass of PurgeEvery did.
type PurgePass struct {
	// Now is the instant the pass purged at: rows and leases that ended
	// at or before it were deleted.
	Now time.Time
	// Rows counts the rows and leases deleted, as Purge does, failed
	// passes included (what the batches before the failure deleted).
	Rows int64
	// Batches counts the statements the pass ran, a failed one included:
	// the batches of leases, then the ranges of count_limit's sweep.
	Batches int
	// Took is how long the pass took, pauses between batches included,
	// on this process's monotonic clock (not the purge clock).
	Took time.Duration
	// Err is why the pass stopped before it was done: a batch failed (an
	// ErrUnavailable, or one that took over a minute). Nil when it purged
	// everything that was expired. The next pass starts afresh.
	Err error
}

// PurgeOption configures PurgeEvery.
type PurgeOption func(*purgeConfig)

type purgeConfig struct {
	batchSize int
	now       func() time.Time
	report    func(PurgePass)
}

// WithPurgeBatchSize sets how many rows (and as many leases) one statement
// of PurgeEvery deletes at most: 1 to MaxBatchSize, default
// DefaultPurgeBatchSize.
func WithPurgeBatchSize(n int) PurgeOption { return func(c *purgeConfig) { c.batchSize = n } }

// WithPurgeReport makes PurgeEvery call report after every pass, failed
// ones included, on PurgeEvery's goroutine: for a log line or metrics. The
// next pass waits for it to return. A pass cut short because PurgeEvery's
// context ended is not reported; one that finished is, even if the
// context ended meanwhile.
func WithPurgeReport(report func(PurgePass)) PurgeOption {
	return func(c *purgeConfig) { c.report = report }
}

// PurgeEvery purges expired rows and leases, as Purge does, in one pass at
// once and then one about every interval, until ctx ends; it then returns
// ctx's error. Run it on a goroutine of its own, on a Store made on a pool, in
// one process or several: a PostgreSQL deployment must purge somehow, or
// count_limit keeps a row for every (use type, id) it ever saw.
//
// A pass deletes expired leases in batches (WithPurgeBatchSize) until a
// batch finds fewer than its size, then sweeps count_limit once from its
// first page to its last, 1024 pages a statement, deleting at most a
// batch's size of rows in each (Purge), so a pass has an end even while
// new rows expire: they go in the next pass. Each statement is short and
// skips the rows live checks hold locked, and after each the pass pauses
// as long as it took: the purge takes at most about half of one
// connection's time, and checks are never queued behind a long run of
// deletes. A pass reads the whole table (about a second of a core at 10
// million rows in memory: docs/benchmarks.md), so a large table wants an
// interval of minutes, not seconds.
//
// A pass that fails (the database is down, the schema is missing) is
// reported with its error and the next pass tries again: PurgeEvery never
// returns for a failing database. Its errors do not go through a Limiter,
// so they never count toward a circuit breaker or a Limiter's observer.
//
// Each wait between passes is interval with up to a tenth more or less at
// random, so that processes started together drift apart. Any number of
// processes may purge one database at once: their batches skip each
// other's rows, so they share the work and never wait for each other.
//
// Expiry is decided by this process's clock (time.Now, as the CLI's
// purge). Purging ends a window early by as much as that clock runs ahead
// of the clock that checks with it, as a Limiter whose clock runs ahead
// would (see countlimit.WithStoreClock): a Limiter with a clock of its own
// (WithClock) purges with [Store.Purge], which takes the instant from its
// caller.
//
// An interval that is not positive, or a batch size out of range, is
// countlimit.ErrInvalid, returned at once.
func (s *Store) PurgeEvery(ctx context.Context, interval time.Duration, opts ...PurgeOption) error {
	cfg := purgeConfig{batchSize: DefaultPurgeBatchSize}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if interval <= 0 {
		return fmt.Errorf("pgstore: purge every: %w: interval must be positive, got %v", countlimit.ErrInvalid, interval)
	}
	if cfg.batchSize < 1 || cfg.batchSize > MaxBatchSize {
		return fmt.Errorf("pgstore: purge every: %w: batch size must be 1 to %d, got %d", countlimit.ErrInvalid, MaxBatchSize, cfg.batchSize)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		pass := s.purgePass(ctx, cfg)
		if pass.Err != nil && ctx.Err() != nil {
			return ctx.Err() // cut short: not a failure of the database
		}
		if cfg.report != nil {
			cfg.report(pass)
		}
		timer.Reset(jitter(interval))
	}
}

// purgePass runs one pass of PurgeEvery.
func (s *Store) purgePass(ctx context.Context, cfg purgeConfig) PurgePass {
	start := time.Now()
	p := PurgePass{Now: cfg.now()}
	var sw purgeSweep
	for {
		began := time.Now()
		bctx, cancel := context.WithTimeout(ctx, purgeBatchTimeout)
		n, err := s.purgeStep(bctx, p.Now, cfg.batchSize, &sw)
		cancel()
		took := time.Since(began)
		p.Batches++
		p.Rows += n
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (the batch took over %v)", err, purgeBatchTimeout)
		}
		if err != nil || sw.done {
			p.Err = err
			p.Took = time.Since(start)
			return p
		}
		pause := time.NewTimer(took)
		select {
		case <-ctx.Done():
			pause.Stop()
			p.Err = ctx.Err()
			p.Took = time.Since(start)
			return p
		case <-pause.C:
		}
	}
}

// jitter returns d with up to a tenth more or less, at random.
func jitter(d time.Duration) time.Duration {
	if d < 10 {
		return d
	}
	return d - d/10 + rand.N(d/5)
}
