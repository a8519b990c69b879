package cli

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// storeSettings returns what serve gives server.Config.Settings for st: nil
// for a store with no settings to watch, else a check that logs what it
// finds (see evictionWatch). When up, the store answered at start, and the
// check runs once now, so its finding is logged before serving.
func storeSettings(ctx context.Context, st *opened, log *slog.Logger, up bool) func(context.Context) error {
	if st.settings == nil {
		return nil
	}
	w := &evictionWatch{check: st.settings, log: log}
	if up {
		ctx, cancel := context.WithTimeout(ctx, startTimeout)
		defer cancel()
		_ = w.settings(ctx)
	}
	return w.settings
}

// evictionWatch reports a Redis store's maxmemory-policy
// (redisstore.Store.CheckEviction) for serve: an evicting policy fails
// /healthz and is logged when found and when fixed, not at every probe; a
// server that will not say is logged once and stays healthy, since the
// store works and only the operator can tell.
type evictionWatch struct {
	check func(context.Context) error
	log   *slog.Logger

	mu       sync.Mutex
	evicting string // the evicting policy's error last logged; "" for none
	unknown  sync.Once
}

func (w *evictionWatch) settings(ctx context.Context) error {
	err := w.check(ctx)
	switch {
	case errors.Is(err, redisstore.ErrEvictionPolicy):
		w.mu.Lock()
		defer w.mu.Unlock()
		if msg := err.Error(); msg != w.evicting {
			w.evicting = msg
			w.log.Error("Redis's maxmemory-policy evicts keys; /healthz answers 503 until it is noeviction", "err", err)
		}
		return err
	case errors.Is(err, redisstore.ErrPolicyUnknown):
		w.unknown.Do(func() {
			w.log.Warn("could not check Redis's maxmemory-policy; make sure it is noeviction, or counters can be evicted and ids allowed beyond their limits", "err", err)
		})
	case err == nil:
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.evicting != "" {
			w.evicting = ""
			w.log.Info("Redis's maxmemory-policy is noeviction now")
		}
	}
	// A store that did not answer: /healthz's ping says so.
	return nil
}
