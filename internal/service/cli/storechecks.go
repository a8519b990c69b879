package cli

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// storeChecks returns what serve gives server.Config.Settings and
// Config.Warnings for st: nil for a store with no settings to watch. On
// Redis an evicting maxmemory-policy fails /healthz; a server that
// persists nothing is a warning, or with requirePersistence a failure too.
// When up, the store answered at start, and the checks run once now, so
// their findings are logged before serving.
func storeChecks(ctx context.Context, st *opened, log *slog.Logger, up, requirePersistence bool) (settings func(context.Context) error, warnings func(context.Context) []string) {
	if st.eviction == nil {
		return nil, nil
	}
	eviction := evictionWatch(st.eviction, log)
	persistence := persistenceWatch(st.persistence, log, requirePersistence)
	if up {
		ctx, cancel := context.WithTimeout(ctx, startTimeout)
		defer cancel()
		_ = eviction.report(ctx)
		_ = persistence.report(ctx)
	}
	if requirePersistence {
		return func(ctx context.Context) error {
			return errors.Join(eviction.report(ctx), persistence.report(ctx))
		}, nil
	}
	return eviction.report, func(ctx context.Context) []string {
		if err := persistence.report(ctx); err != nil {
			return []string{err.Error()}
		}
		return nil
	}
}

// evictionWatch reports a Redis store's maxmemory-policy
// (redisstore.Store.CheckEviction) for serve: an evicting policy fails
// /healthz.
func evictionWatch(check func(context.Context) error, log *slog.Logger) *watch {
	return &watch{
		check: check, finding: redisstore.ErrEvictionPolicy, log: log, level: slog.LevelError,
		foundMsg:   "Redis's maxmemory-policy evicts keys; /healthz answers 503 until it is noeviction",
		fixedMsg:   "Redis's maxmemory-policy is noeviction now",
		unknownMsg: "could not check Redis's maxmemory-policy; make sure it is noeviction, or counters can be evicted and ids allowed beyond their limits",
	}
}

// persistenceWatch reports whether a Redis store persists anything
// (redisstore.Store.CheckPersistence) for serve: one that persists nothing
// is a warning in /healthz, or a failure when required.
func persistenceWatch(check func(context.Context) error, log *slog.Logger, required bool) *watch {
	w := &watch{
		check: check, finding: redisstore.ErrNoPersistence, log: log, level: slog.LevelWarn,
		foundMsg:   "Redis persists nothing (neither AOF nor RDB snapshots): a restart forgets every count and allows every id anew; /healthz lists it under warnings",
		fixedMsg:   "Redis persists its data now (AOF or RDB snapshots)",
		unknownMsg: "could not check Redis's persistence; make sure AOF or RDB snapshots are on if counts must outlive a restart",
	}
	if required {
		w.level = slog.LevelError
		w.foundMsg = "Redis persists nothing (neither AOF nor RDB snapshots): a restart forgets every count and allows every id anew; /healthz answers 503 until AOF or snapshots are on (--require-redis-persistence)"
	}
	return w
}

// watch reports one setting of a store for serve. A finding (an error
// that is finding) is logged when found and when fixed, not at every
// probe; a server that will not say is logged once and counts as no
// finding, since the store works and only the operator can tell; a store
// that does not answer is left to /healthz's ping.
type watch struct {
	check      func(context.Context) error
	finding    error
	log        *slog.Logger
	level      slog.Level // of the line that logs a finding
	foundMsg   string     // the line that logs a finding
	fixedMsg   string     // the line that logs it fixed
	unknownMsg string     // the line that logs a server that will not say

	mu      sync.Mutex
	last    string // the finding last logged; "" for none
	unknown sync.Once
}

// report asks, logs what is new, and returns the finding, or nil.
func (w *watch) report(ctx context.Context) error {
	err := w.check(ctx)
	switch {
	case errors.Is(err, w.finding):
		w.mu.Lock()
		defer w.mu.Unlock()
		if msg := err.Error(); msg != w.last {
			w.last = msg
			w.log.Log(ctx, w.level, w.foundMsg, "err", err)
		}
		return err
	case errors.Is(err, redisstore.ErrPolicyUnknown):
		w.unknown.Do(func() { w.log.Warn(w.unknownMsg, "err", err) })
	case err == nil:
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.last != "" {
			w.last = ""
			w.log.Info(w.fixedMsg)
		}
	}
	return nil
}
