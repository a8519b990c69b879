package bench

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// benchReport is what a bench measured, as --json prints it.
type benchReport struct {
	Mode  string      `json:"mode"` // "bench" or "bench --baseline"
	Store string      `json:"store"`
	Rule  string      `json:"rule,omitempty"` // --rule: a rule or group of the rule file
	Tier  string      `json:"tier,omitempty"`
	Rules []benchRule `json:"rules"`
	// Checks are bench --baseline's kinds of check (--check), in the
	// order run.
	Checks            []string  `json:"checks,omitempty"`
	SynchronousCommit string    `json:"synchronous_commit,omitempty"` // PostgreSQL's, for --baseline
	RunSeconds        float64   `json:"run_seconds"`                  // --duration
	Started           time.Time `json:"started"`
	// With --table-rows: the rows each table was filled with, and the
	// bytes on disk (table, TOAST and indexes) of each after VACUUM.
	TableRows       int        `json:"table_rows,omitempty"`
	CountLimitBytes int64      `json:"count_limit_bytes,omitempty"`
	BaselineBytes   int64      `json:"baseline_bytes,omitempty"`
	Runs            []benchRun `json:"runs"`
}

// benchRule is a rule a bench checked.
type benchRule struct {
	Check        string  `json:"check,omitempty"` // bench --baseline: the --check kind it is a rule of
	Name         string  `json:"name"`
	Window       string  `json:"window"`
	Limit        int64   `json:"limit"`
	BlockSeconds float64 `json:"block_seconds,omitempty"`
}

// benchRun is one side measured at one number of callers: an element of
// --json's runs, a row of --csv. Latencies are in seconds.
type benchRun struct {
	Callers int    `json:"callers"`
	IDs     int    `json:"ids"`
	Call    string `json:"call"` // allow, allow_all, or (--baseline) upsert or acquire_release
	// Check is bench --baseline's kind of check (--check) the run was
	// measured for: its upsert runs beside it, alternated with it.
	Check          string  `json:"check,omitempty"`
	Calls          int     `json:"calls"`
	Allowed        int     `json:"allowed"`
	Denied         int     `json:"denied"`
	Errors         int     `json:"errors"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	CallsPerSecond float64 `json:"calls_per_second"`
	P50Seconds     float64 `json:"p50_seconds"`
	P90Seconds     float64 `json:"p90_seconds"`
	P99Seconds     float64 `json:"p99_seconds"`
	MaxSeconds     float64 `json:"max_seconds"`
	// Rows is what the tables held at the start (bench --baseline):
	// "existing", "new" or "random". With "new", IDs is 0: every call has
	// an id of its own. With "random", each call draws one of IDs, and Run
	// says which of the two series it is (1 or 2). With "new" and "random",
	// Allow's runs give the calls per second of the first and the last
	// fifth of their time.
	Rows                string  `json:"rows,omitempty"`
	Run                 int     `json:"run,omitempty"`
	FirstFifthPerSecond float64 `json:"first_fifth_calls_per_second,omitempty"`
	LastFifthPerSecond  float64 `json:"last_fifth_calls_per_second,omitempty"`
}

var benchCSVHeader = []string{"callers", "ids", "call", "calls", "allowed", "denied", "errors",
	"elapsed_seconds", "calls_per_second", "p50_seconds", "p90_seconds", "p99_seconds", "max_seconds", "rows", "run", "check"}

func (r benchRun) csv() []string {
	i := strconv.Itoa
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	return []string{i(r.Callers), i(r.IDs), r.Call, i(r.Calls), i(r.Allowed), i(r.Denied), i(r.Errors),
		f(r.ElapsedSeconds), f(r.CallsPerSecond), f(r.P50Seconds), f(r.P90Seconds), f(r.P99Seconds), f(r.MaxSeconds), r.Rows, i(r.Run), r.Check}
}

func newBenchRun(m *measurement, callers, ids int, call string) benchRun {
	return benchRun{
		Callers: callers, IDs: ids, Call: call,
		Calls: m.calls(), Allowed: m.allowed, Denied: m.denied, Errors: m.errs,
		ElapsedSeconds: m.elapsed.Seconds(), CallsPerSecond: m.rate(),
		P50Seconds: m.pct(.5).Seconds(), P90Seconds: m.pct(.9).Seconds(), P99Seconds: m.pct(.99).Seconds(), MaxSeconds: m.pct(1).Seconds(),
	}
}

// benchOutput is where a bench's results go: a table for people as they
// come, and at the end --json or --csv on stdout and the --plot file.
type benchOutput struct {
	human     io.Writer // stdout, or stderr when stdout takes --json or --csv
	stdout    io.Writer
	warn      io.Writer // stderr
	json, csv bool
	plot      *os.File // nil without --plot
	report    benchReport
}

const benchRowFormat = "%7s %6s %10s %9s %8s %7s %10s %9s %9s %9s %9s\n"

// header prints the head of a plain bench's table.
func (o *benchOutput) header() {
	fmt.Fprintf(o.human, benchRowFormat, "callers", "ids", "calls", "allowed", "denied", "errors", "calls/s", "p50", "p90", "p99", "max")
}

// add records a plain bench's run and prints its row.
func (o *benchOutput) add(r benchRun) {
	o.report.Runs = append(o.report.Runs, r)
	fmt.Fprintf(o.human, benchRowFormat, strconv.Itoa(r.Callers), strconv.Itoa(r.IDs), strconv.Itoa(r.Calls),
		strconv.Itoa(r.Allowed), strconv.Itoa(r.Denied), strconv.Itoa(r.Errors), fmt.Sprintf("%.0f", r.CallsPerSecond),
		latency(r.P50Seconds), latency(r.P90Seconds), latency(r.P99Seconds), latency(r.MaxSeconds))
}

// finish prints the report as --json or --csv asked, and draws the plot.
func (o *benchOutput) finish() error {
	switch {
	case o.json:
		b, err := json.MarshalIndent(o.report, "", "  ")
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(o.stdout, string(b)); err != nil {
			return err
		}
	case o.csv:
		w := csv.NewWriter(o.stdout)
		w.Write(benchCSVHeader)
		for _, r := range o.report.Runs {
			w.Write(r.csv())
		}
		w.Flush()
		if err := w.Error(); err != nil {
			return err
		}
	}
	if o.plot == nil {
		return nil
	}
	err := writePlot(o.plot, o.report)
	if cerr := o.plot.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: --plot: %w", err)
	}
	fmt.Fprintf(o.human, "plot: %s\n", o.plot.Name())
	o.plot = nil
	return nil
}

// latency formats seconds for people, to about three significant digits:
// 450ns, 45.1µs, 2.31ms, 1.03s.
func latency(s float64) string {
	ns := s * 1e9
	for _, u := range []struct {
		name string
		size float64
	}{{"ns", 1}, {"µs", 1e3}, {"ms", 1e6}} {
		v := ns / u.size
		switch {
		case u.name == "ns" && v < 999.5:
			return strconv.FormatFloat(v, 'f', 0, 64) + u.name
		case v < 999.5:
			return threeDigits(v) + u.name
		}
	}
	return threeDigits(ns/1e9) + "s"
}

func threeDigits(v float64) string {
	switch {
	case v >= 99.95:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 9.995:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}
