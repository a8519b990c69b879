package server

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Purges records the background purges of expired rows that serve runs on
// PostgreSQL (pgstore.Store.PurgeEvery), for /metrics: set Config.Purges
// and call Observe after each pass. The zero value is ready; it is safe
// for concurrent use.
type Purges struct {
	rows, passes, failures atomic.Uint64
	nanos                  atomic.Int64 // time spent in passes
	lastOK                 atomic.Int64 // Unix nanoseconds when a pass last succeeded; 0: never
}

// Observe records one pass: the rows and leases it deleted, how long it
// took and, for a pass that failed, its error. A failed pass's rows count
// too: they are gone.
func (p *Purges) Observe(rows int64, took time.Duration, err error) {
	p.rows.Add(uint64(max(rows, 0)))
	p.passes.Add(1)
	p.nanos.Add(int64(took))
	if err != nil {
		p.failures.Add(1)
		return
	}
	p.lastOK.Store(time.Now().UnixNano())
}

// collectors export p. The last success's timestamp is the one to alert
// on: a purge that fails every pass leaves the table growing.
func (p *Purges) collectors() []prometheus.Collector {
	counter := func(name, help string, v func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, v)
	}
	return []prometheus.Collector{
		counter("countlimit_purged_rows_total", "Expired rows and leases the background purge deleted (PostgreSQL).",
			func() float64 { return float64(p.rows.Load()) }),
		counter("countlimit_purge_passes_total", "Background purge passes run, failed ones included.",
			func() float64 { return float64(p.passes.Load()) }),
		counter("countlimit_purge_failures_total", "Background purge passes that failed; the next pass tries again.",
			func() float64 { return float64(p.failures.Load()) }),
		counter("countlimit_purge_seconds_total", "Time spent in background purge passes.",
			func() float64 { return time.Duration(p.nanos.Load()).Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "countlimit_purge_last_success_timestamp_seconds",
			Help: "When a background purge pass last succeeded, in Unix time; 0 before the first.",
		}, func() float64 {
			if n := p.lastOK.Load(); n != 0 {
				return float64(n) / 1e9
			}
			return 0
		}),
	}
}
