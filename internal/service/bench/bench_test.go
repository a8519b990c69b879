package bench_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

func TestMain(m *testing.M) { testbackend.Main(m) }

// run runs the command line through the command, as countlimit does, and
// returns its exit status and output.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// benchRow matches a row of a plain bench's table: callers, ids, calls,
// allowed, denied, errors, calls/s and four latencies.
var benchRow = regexp.MustCompile(`(?m)^ +(\d+) +(\d+) +(\d+) +(\d+) +(\d+) +(\d+) +(\d+) +\S+ +\S+ +\S+ +\S+$`)

func TestBench(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rules, []byte(`rules:
  three: {window: lifetime, limit: 3}
  five: {window: lifetime, limit: 5}
  plan: {window: lifetime, tiers: {free: 2, paid: 4}}
groups:
  both: {rules: [three, five]}
`), 0o644)
	for _, tc := range []struct {
		args    []string
		header  string
		callers []string
		allowed string // "" for every call
		denied  bool
	}{
		{[]string{"--callers", "4", "--ids", "10"}, "rule bench (fixed 1m0s, a limit no call reaches), over 10 ids", []string{"4"}, "", false},
		{[]string{"--callers", "1,3", "--ids", "10"}, "over 10 ids, 100ms per run", []string{"1", "3"}, "", false},
		// A rule that fills: denials are counted, not errors.
		{[]string{"--rule", "three", "--ids", "1"}, "rule three (lifetime, limit 3)", []string{"16"}, "3", true},
		// A group, checked with AllowAll: the tighter rule decides.
		{[]string{"--rule", "both", "--ids", "1"}, "rule both = three (lifetime, limit 3) AND five (lifetime, limit 5), with AllowAll", []string{"16"}, "3", true},
		// Tiers, alone and in runs of their own: each run starts from zero.
		{[]string{"--rule", "plan", "--tier", "paid", "--ids", "1"}, "rule plan (lifetime, limit 4), tier paid", []string{"16"}, "4", true},
		{[]string{"--rule", "plan", "--tier", "free", "--ids", "1", "--callers", "2,2"}, "tier free", []string{"2", "2"}, "2", true},
	} {
		args := append([]string{"bench", "--store", "memory", "--duration", "100ms", "--rules", rules}, tc.args...)
		code, out, stderr := run(t, args...)
		if code != cli.ExitOK || !strings.Contains(out, tc.header) {
			t.Errorf("countlimit %q: exit %d, stderr %q; want a header saying %q:\n%s", args, code, stderr, tc.header, out)
			continue
		}
		rows := benchRow.FindAllStringSubmatch(out, -1)
		if len(rows) != len(tc.callers) {
			t.Errorf("countlimit %q: %d rows, want %d:\n%s", args, len(rows), len(tc.callers), out)
			continue
		}
		for i, r := range rows {
			calls, allowed, denied, errs := r[3], r[4], r[5], r[6]
			switch {
			case r[1] != tc.callers[i]:
				t.Errorf("countlimit %q: row %d has %s callers, want %s:\n%s", args, i, r[1], tc.callers[i], out)
			case calls == "0" || errs != "0" || (denied != "0") != tc.denied:
				t.Errorf("countlimit %q: row %d: %s calls, %s denied, %s errors:\n%s", args, i, calls, denied, errs, out)
			case tc.allowed == "" && allowed != calls, tc.allowed != "" && allowed != tc.allowed:
				t.Errorf("countlimit %q: row %d: %s of %s calls allowed, want %q:\n%s", args, i, allowed, calls, tc.allowed, out)
			}
		}
	}
	// The built-in group, as the README shows it.
	if code, out, stderr := run(t, "bench", "--store", "memory", "--duration", "50ms", "--rule", "conversation.create"); code != cli.ExitOK || !strings.Contains(out, "with AllowAll") {
		t.Errorf("bench --rule conversation.create: exit %d, %q %q", code, out, stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--store", "memory", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"bench", "--store", "memory", "--callers", "0"}, "--callers wants numbers from 1 to 10000"},
		{[]string{"bench", "--store", "memory", "--concurrency", "4,x"}, "--concurrency wants numbers from 1 to 10000"},
		{[]string{"bench", "--store", "memory", "--ids", "0"}, "--ids must be at least 1"},
		{[]string{"bench", "--store", "memory", "--rule", "post.create"}, "needs a tier"},
		{[]string{"bench", "--store", "memory", "--rule", "nope"}, `unknown rule "nope"`},
		{[]string{"bench", "--store", "memory", "--rule", "export.running"}, "export.running has a concurrent window: it holds slots, not events"},
		{[]string{"bench", "--store", "memory", "--tier", "gold"}, "--tier goes with --rule"},
		{[]string{"bench", "--store", "memory", "--json", "--csv"}, "--json and --csv both print to stdout; pick one"},
		{[]string{"bench", "--store", "memory", "--plot", "bench.png"}, `--plot writes SVG: name a FILE.svg, got "bench.png"`},
		{[]string{"bench", "--store", "memory", "--plot", "/nonexistent/bench.svg"}, "--plot: open /nonexistent/bench.svg"},
		{[]string{"bench", "--store", "memory", "--concurrency", "4", "--callers", "4"}, "--concurrency is the old name of --callers"},
		{[]string{"bench", "--baseline", "--store", "postgres://x", "--rule", "sms.code"}, "takes no --rule"},
		{[]string{"bench", "--duration", "100ms", "--store", testbackend.FreshSchemaURL(t)}, "countlimit's schema is missing here"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("countlimit %v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// benchJSON is what bench --json prints.
type benchJSON struct {
	Mode              string `json:"mode"`
	Store             string `json:"store"`
	SynchronousCommit string `json:"synchronous_commit"`
	Rules             []struct {
		Name   string `json:"name"`
		Window string `json:"window"`
		Limit  int64  `json:"limit"`
	} `json:"rules"`
	RunSeconds float64 `json:"run_seconds"`
	Runs       []struct {
		Callers        int     `json:"callers"`
		IDs            int     `json:"ids"`
		Call           string  `json:"call"`
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
	} `json:"runs"`
}

// parseBenchCSV parses bench --csv's output: the header, then one map per row.
func parseBenchCSV(t *testing.T, out string) []map[string]string {
	t.Helper()
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatalf("bench --csv: %v\n%s", err, out)
	}
	want := "callers,ids,call,calls,allowed,denied,errors,elapsed_seconds,calls_per_second,p50_seconds,p90_seconds,p99_seconds,max_seconds,rows,run,check"
	if len(recs) == 0 || strings.Join(recs[0], ",") != want {
		t.Fatalf("bench --csv header: %q, want %q", recs, want)
	}
	var rows []map[string]string
	for _, rec := range recs[1:] {
		row := map[string]string{}
		for i, k := range recs[0] {
			row[k] = rec[i]
			if k != "call" && k != "rows" && k != "check" {
				if _, err := strconv.ParseFloat(rec[i], 64); err != nil {
					t.Errorf("bench --csv: %s = %q is not a number", k, rec[i])
				}
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// plotSeries reads an SVG from bench --plot: it must be well-formed XML, and
// it returns, per series ("call ids value", as "allow 10 p99"), its number
// of points, and the number of ratio labels.
func plotSeries(t *testing.T, path string) (map[string]int, int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	series := map[string]int{}
	var current string
	ratios := 0
	dec := xml.NewDecoder(f)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range el.Attr {
				attr[a.Name.Local] = a.Value
			}
			switch {
			case el.Name.Local == "svg" && el.Name.Space != "http://www.w3.org/2000/svg":
				t.Errorf("%s: the root is not an SVG element: %v", path, el.Name)
			case el.Name.Local == "g" && attr["class"] == "series":
				current = attr["data-call"] + " " + attr["data-ids"] + " " + attr["data-value"]
				series[current] += 0
			case el.Name.Local == "circle" && current != "":
				series[current]++
			case el.Name.Local == "text" && attr["class"] == "ratio":
				ratios++
			}
		case xml.EndElement:
			if el.Name.Local == "g" {
				current = ""
			}
		}
	}
	return series, ratios
}

func TestBenchOutputs(t *testing.T) {
	dir := t.TempDir()
	plot := filepath.Join(dir, "bench.svg")
	code, out, stderr := run(t, "bench", "--store", "memory", "--duration", "50ms", "--concurrency", "1,2,4", "--ids", "7", "--json", "--plot", plot)
	if code != cli.ExitOK {
		t.Fatalf("bench --json: exit %d: %s", code, stderr)
	}
	var got benchJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("bench --json printed no JSON: %v\n%s", err, out)
	}
	if got.Mode != "bench" || got.Store != "memory" || got.RunSeconds != 0.05 || len(got.Rules) != 1 || got.Rules[0].Window != "fixed 1m0s" || len(got.Runs) != 3 {
		t.Fatalf("bench --json: %+v", got)
	}
	for i, r := range got.Runs {
		if r.Callers != []int{1, 2, 4}[i] || r.IDs != 7 || r.Call != "allow" || r.Calls == 0 || r.Calls != r.Allowed+r.Denied+r.Errors || r.Allowed != r.Calls {
			t.Errorf("run %d: %+v", i, r)
		}
		if rate := float64(r.Calls) / r.ElapsedSeconds; math.Abs(rate-r.CallsPerSecond) > 1e-6*rate {
			t.Errorf("run %d: %v calls/s, but %d calls in %vs", i, r.CallsPerSecond, r.Calls, r.ElapsedSeconds)
		}
		if !(0 < r.P50Seconds && r.P50Seconds <= r.P90Seconds && r.P90Seconds <= r.P99Seconds && r.P99Seconds <= r.MaxSeconds) {
			t.Errorf("run %d: latencies not in order: %+v", i, r)
		}
	}
	// The table still goes to people, on stderr.
	if rows := benchRow.FindAllString(stderr, -1); len(rows) != 3 || !strings.Contains(stderr, "plot: "+plot) {
		t.Errorf("bench --json: stderr holds %d rows, want 3:\n%s", len(rows), stderr)
	}
	series, ratios := plotSeries(t, plot)
	want := map[string]int{"allow 7 calls/s": 3, "allow 7 p50": 3, "allow 7 p99": 3}
	if !maps.Equal(series, want) || ratios != 0 {
		t.Errorf("bench --plot: series %v and %d ratios, want %v and none", series, ratios, want)
	}

	code, out, stderr = run(t, "bench", "--store", "memory", "--duration", "50ms", "--concurrency", "2,3", "--rule", "conversation.create", "--csv")
	if code != cli.ExitOK {
		t.Fatalf("bench --csv: exit %d: %s", code, stderr)
	}
	rows := parseBenchCSV(t, out)
	if len(rows) != 2 {
		t.Fatalf("bench --csv: %d rows, want 2:\n%s", len(rows), out)
	}
	for i, r := range rows {
		if r["callers"] != []string{"2", "3"}[i] || r["ids"] != "1000" || r["call"] != "allow_all" || r["calls"] == "0" || r["errors"] != "0" {
			t.Errorf("bench --csv row %d: %v", i, r)
		}
	}
}

// TestBenchCleansUp: a bench counts under use types of its own and deletes
// its counters at the end, so a live table or Redis keeps none of them.
func TestBenchCleansUp(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatalf("migrate up: exit %d, %s", code, stderr)
	}
	args := []string{"--duration", "100ms", "--ids", "5", "--concurrency", "1,2", "--rule", "article.pin"}
	if code, _, stderr := run(t, append([]string{"bench", "--store", url}, args...)...); code != cli.ExitOK {
		t.Fatalf("bench on PostgreSQL: exit %d, %s", code, stderr)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var rows int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM count_limit").Scan(&rows); err != nil || rows != 0 {
		t.Errorf("after bench on PostgreSQL: %d rows left (err %v)", rows, err)
	}

	if code, _, stderr := run(t, append([]string{"bench", "--store", testbackend.RedisURL(t)}, args...)...); code != cli.ExitOK {
		t.Fatalf("bench on Redis: exit %d, %s", code, stderr)
	}
	// article.pin is a calendar month: its keys would stay for weeks.
	keys, _, err := testbackend.Redis(t).Scan(context.Background(), 0, "countlimit:bench.*", 100000).Result()
	if err != nil || len(keys) != 0 {
		t.Errorf("after bench on Redis: keys %q left (err %v)", keys, err)
	}
}

// benchSchema returns the schema a bench --baseline run says it works in
// (its first line, in text): each test knows the schema its own run made,
// whatever other runs on the same server make and drop beside it.
func benchSchema(t *testing.T, text string) string {
	t.Helper()
	m := regexp.MustCompile(`in schema (countlimit_bench_[0-9a-f]{8}) \(dropped at the end\)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("bench --baseline does not name the schema of its run:\n%s", text)
	}
	return m[1]
}

// schemaLeft reports whether the schema name is still in conn's database.
func schemaLeft(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var left bool
	if err := conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, name).Scan(&left); err != nil {
		t.Fatal(err)
	}
	return left
}

// TestBenchBaselineRandom: --rows random runs its series twice, each cell
// from tables emptied and analyzed, over ids drawn from --ids, and says
// which run each line is, in the table, the JSON and the plot.
func TestBenchBaselineRandom(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	plot := filepath.Join(t.TempDir(), "random.svg")
	code, out, stderr := run(t, "bench", "--baseline", "--store", url, "--rows", "random", "--duration", "400ms", "--callers", "1,2", "--ids", "50", "--json", "--plot", plot)
	if code != cli.ExitOK {
		t.Fatalf("bench --baseline --rows random: exit %d, %s", code, stderr)
	}
	// The table, on stderr: a section per run, a line per number of
	// callers with Allow's first and last fifth.
	line := regexp.MustCompile(`(?m)^ +(\d+) +50 +(\d+) +(\d+) +(\d+\.\d\d×|n/a) +\S+ +\S+ +\S+ +\S+ +(\d+) → (\d+)$`)
	sections := regexp.MustCompile(`(?m)^random ids, run \d of 2: .*$`).FindAllStringIndex(stderr, -1)
	if len(sections) != 2 {
		t.Fatalf("bench --baseline --rows random: %d sections, want 2 (run 1 and run 2):\n%s", len(sections), stderr)
	}
	for i, sec := range sections {
		end := len(stderr)
		if i+1 < len(sections) {
			end = sections[i+1][0]
		}
		text := stderr[sec[0]:end]
		if want := fmt.Sprintf("random ids, run %d of 2", i+1); !strings.HasPrefix(text, want) {
			t.Errorf("section %d starts %q, want %q", i, text[:min(len(text), 40)], want)
		}
		cells := line.FindAllStringSubmatch(text, -1)
		if len(cells) != 2 || cells[0][1] != "1" || cells[1][1] != "2" {
			t.Errorf("run %d: lines %q, want one for 1 and one for 2 callers over 50 ids:\n%s", i+1, cells, text)
		}
	}
	// The JSON: both sides of every cell of both runs, over 50 ids.
	var report struct {
		Runs []struct {
			Callers int    `json:"callers"`
			IDs     int    `json:"ids"`
			Call    string `json:"call"`
			Calls   int    `json:"calls"`
			Errors  int    `json:"errors"`
			Rows    string `json:"rows"`
			Run     int    `json:"run"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("bench --baseline --rows random --json: %v\n%s", err, out)
	}
	var got []string
	calls := map[string]int{}
	for _, r := range report.Runs {
		got = append(got, fmt.Sprintf("%s %d %d %d %s", r.Rows, r.Run, r.Callers, r.IDs, r.Call))
		calls[r.Call] += r.Calls
		if r.Errors != 0 {
			t.Errorf("bench --baseline --rows random --json: %+v", r)
		}
	}
	want := []string{
		"random 1 1 50 upsert", "random 1 1 50 allow", "random 1 2 50 upsert", "random 1 2 50 allow",
		"random 2 1 50 upsert", "random 2 1 50 allow", "random 2 2 50 upsert", "random 2 2 50 allow",
	}
	if !slices.Equal(got, want) {
		t.Errorf("bench --baseline --rows random --json runs: %q, want %q", got, want)
	}
	// A short cell may see no call end on a loaded machine; the run as a
	// whole must see both sides work.
	if calls["upsert"] == 0 || calls["allow"] == 0 {
		t.Errorf("bench --baseline --rows random: %v calls, want both sides working", calls)
	}
	// The plot: a column per run.
	svg, err := os.ReadFile(plot)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"1", "2"} {
		if !strings.Contains(string(svg), `data-rows="random" data-run="`+run+`"`) || !strings.Contains(string(svg), "at random, run "+run) {
			t.Errorf("bench --baseline --rows random --plot: no column for run %s", run)
		}
	}
	if schema := benchSchema(t, stderr); schemaLeft(t, conn, schema) {
		t.Errorf("after bench --baseline --rows random: schema %s left", schema)
	}
}

// TestBenchBaselineTableRows: --table-rows fills both tables with that
// many rows, says what a row costs on disk on each side, and draws the
// calls' ids from the rows it filled.
func TestBenchBaselineTableRows(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// A superuser may read the last checkpoint's LSN, which any checkpoint
	// after the fill's WAL moves on.
	var super bool
	var lastCheckpoint string
	if err := conn.QueryRow(context.Background(), `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super {
		if err := conn.QueryRow(context.Background(), `SELECT checkpoint_lsn::text FROM pg_control_checkpoint()`).Scan(&lastCheckpoint); err != nil {
			t.Fatal(err)
		}
	}
	code, out, stderr := run(t, "bench", "--baseline", "--store", url, "--rows", "existing", "--table-rows", "300", "--duration", "200ms", "--callers", "2", "--json")
	if code != cli.ExitOK {
		t.Fatalf("bench --baseline --table-rows: exit %d, %s", code, stderr)
	}
	if super {
		var moved bool
		if err := conn.QueryRow(context.Background(), `SELECT checkpoint_lsn > $1::pg_lsn FROM pg_control_checkpoint()`, lastCheckpoint).Scan(&moved); err != nil {
			t.Fatal(err)
		}
		if !moved || strings.Contains(stderr, "no CHECKPOINT") {
			t.Errorf("bench --baseline --table-rows: no checkpoint after the fill (the last one still at %s):\n%s", lastCheckpoint, stderr)
		}
	}
	if !regexp.MustCompile(`(?m)^on disk \(table \+ indexes\): count_limit \d+ bytes a row, the upsert's table \d+ \(\d+\.\d\d×\)$`).MatchString(stderr) {
		t.Errorf("bench --baseline --table-rows: no bytes a row:\n%s", stderr)
	}
	var report struct {
		TableRows       int   `json:"table_rows"`
		CountLimitBytes int64 `json:"count_limit_bytes"`
		BaselineBytes   int64 `json:"baseline_bytes"`
		Runs            []struct {
			Callers int    `json:"callers"`
			IDs     int    `json:"ids"`
			Call    string `json:"call"`
			Rows    string `json:"rows"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("bench --baseline --table-rows --json: %v\n%s", err, out)
	}
	// 300 rows and a hot one take at least a heap page and an index page
	// a side.
	if report.TableRows != 300 || report.CountLimitBytes < 2*8192 || report.BaselineBytes < 2*8192 {
		t.Errorf("bench --baseline --table-rows --json: %d rows, %d and %d bytes, want 300 rows and the bytes of both tables",
			report.TableRows, report.CountLimitBytes, report.BaselineBytes)
	}
	var got []string
	for _, r := range report.Runs {
		got = append(got, fmt.Sprintf("%d %d %s %s", r.Callers, r.IDs, r.Call, r.Rows))
	}
	want := []string{"2 300 upsert existing", "2 300 allow existing", "2 1 upsert existing", "2 1 allow existing"}
	if !slices.Equal(got, want) {
		t.Errorf("bench --baseline --table-rows --json runs: %q, want %q", got, want)
	}
	if schema := benchSchema(t, stderr); schemaLeft(t, conn, schema) {
		t.Errorf("after bench --baseline --table-rows: schema %s left", schema)
	}
}

func TestBenchBaseline(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatalf("migrate up: exit %d, %s", code, stderr)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	code, out, stderr := run(t, "bench", "--baseline", "--store", url, "--duration", "1200ms", "--callers", "1,3", "--ids", "5")
	if code != cli.ExitOK {
		t.Fatalf("bench --baseline: exit %d, %s", code, stderr)
	}
	// One line per cell: callers, ids, both rates, their ratio, both p50s and p99s.
	cells := regexp.MustCompile(`(?m)^ +(\d+) +(\d+) +(\d+) +(\d+) +(\d+\.\d\d×|n/a) +\S+ +\S+ +\S+ +\S+$`).FindAllStringSubmatch(out, -1)
	want := [][2]string{{"1", "5"}, {"1", "1"}, {"3", "5"}, {"3", "1"}}
	if len(cells) != len(want) {
		t.Fatalf("bench --baseline printed %d cells, want %d:\n%s", len(cells), len(want), out)
	}
	// On a loaded machine one side of a short cell may see no call end (a
	// commit waits for a slow disk); the run as a whole must see both work.
	var upserts, allows int
	for i, c := range cells {
		if c[1] != want[i][0] || c[2] != want[i][1] {
			t.Errorf("cell %d: %q, want %v callers over %v ids", i, c[0], want[i][0], want[i][1])
		}
		u, _ := strconv.Atoi(c[3])
		a, _ := strconv.Atoi(c[4])
		upserts, allows = upserts+u, allows+a
	}
	if upserts == 0 || allows == 0 {
		t.Errorf("bench --baseline: %d upserts/s and %d Allows/s over every cell, want both working:\n%s", upserts, allows, out)
	}
	if !strings.Contains(out, "synchronous_commit=on") {
		t.Errorf("bench --baseline does not say whether commits were durable:\n%s", out)
	}
	// New ids: one line per number of callers, with Allow's first and last
	// fifth.
	fresh := regexp.MustCompile(`(?m)^ +(\d+) +new +(\d+) +(\d+) +(\d+\.\d\d×|n/a) +\S+ +\S+ +\S+ +\S+ +(\d+) → (\d+)$`).FindAllStringSubmatch(out, -1)
	if len(fresh) != 2 || fresh[0][1] != "1" || fresh[1][1] != "3" {
		t.Errorf("bench --baseline's new ids: %q, want a line for 1 and 3 callers:\n%s", fresh, out)
	}
	// It leaves nothing behind: no schema of its own, no rows in the
	// database's count_limit.
	schema := benchSchema(t, out)
	var rows int
	err = conn.QueryRow(context.Background(), `SELECT count(*) FROM count_limit`).Scan(&rows)
	if left := schemaLeft(t, conn, schema); err != nil || left || rows != 0 {
		t.Errorf("after bench --baseline: schema %s left %v, %d count_limit rows left (err %v)", schema, left, rows, err)
	}

	// For machines: --csv holds every cell's two sides; --plot draws them.
	plot := filepath.Join(t.TempDir(), "baseline.svg")
	code, out, stderr = run(t, "bench", "--baseline", "--store", url, "--duration", "200ms", "--callers", "1,2", "--ids", "5", "--rows", "existing", "--csv", "--plot", plot)
	if code != cli.ExitOK {
		t.Fatalf("bench --baseline --csv: exit %d, %s", code, stderr)
	}
	var got []string
	wantSeries := map[string]int{}
	for _, r := range parseBenchCSV(t, out) {
		got = append(got, r["callers"]+" "+r["ids"]+" "+r["call"])
		if r["errors"] != "0" {
			t.Errorf("bench --baseline --csv: %v", r)
		}
		// A cell as short as this one may see no call end on a busy
		// machine; a log scale has no place for its latency of 0.
		series := r["call"] + " " + r["ids"] + " "
		wantSeries[series+"calls/s"]++
		for _, v := range []string{"p50", "p99"} {
			wantSeries[series+v] += 0
			if r[v+"_seconds"] != "0" {
				wantSeries[series+v]++
			}
		}
	}
	wantRows := []string{"1 5 upsert", "1 5 allow", "1 1 upsert", "1 1 allow", "2 5 upsert", "2 5 allow", "2 1 upsert", "2 1 allow"}
	if !slices.Equal(got, wantRows) {
		t.Errorf("bench --baseline --csv rows: %q, want %q", got, wantRows)
	}
	if !strings.Contains(stderr, "upsert/s") {
		t.Errorf("bench --baseline --csv: no table on stderr:\n%s", stderr)
	}
	series, ratios := plotSeries(t, plot)
	if !maps.Equal(series, wantSeries) || ratios > 4 || len(wantSeries) != 12 {
		t.Errorf("bench --baseline --plot: series %v and %d ratio labels, want %v and up to 4", series, ratios, wantSeries)
	}

	if code, _, stderr := run(t, "bench", "--baseline", "--store", "memory"); code != cli.ExitError || !strings.Contains(stderr, "--store must be postgres://") {
		t.Errorf("bench --baseline on memory: exit %d, %q", code, stderr)
	}
	if code, _, stderr := run(t, "bench", "--baseline", "--store", url, "--callers", "1,x"); code != cli.ExitError || !strings.Contains(stderr, "--callers") {
		t.Errorf("bench --callers 1,x: exit %d, %q", code, stderr)
	}
}

// TestBenchBaselineChecks: --check sets each kind of check beside the
// upsert, a section of the table each with both sides' calls a second and
// their ratio, and says in --json which check each run was measured for.
func TestBenchBaselineChecks(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	code, out, stderr := run(t, "bench", "--baseline", "--store", url, "--check", "all", "--rows", "existing,new", "--duration", "300ms", "--callers", "2", "--ids", "5", "--json")
	if code != cli.ExitOK {
		t.Fatalf("bench --baseline --check all: exit %d, %s", code, stderr)
	}
	kinds := []struct{ check, call, label string }{
		{"fixed", "allow", "Allow"}, {"smooth", "allow", "Allow"}, {"sliding", "allow", "Allow"},
		{"allowall", "allow_all", "AllowAll"}, {"lease", "acquire_release", "pairs"},
	}
	// The table, on stderr: a section per check, in the order of all, each
	// naming its side in the head and with a line per cell.
	sections := regexp.MustCompile(`(?m)^--check (\w+): .*, a limit no call reaches$`).FindAllStringSubmatchIndex(stderr, -1)
	if len(sections) != len(kinds) {
		t.Fatalf("bench --baseline --check all: %d sections, want %d:\n%s", len(sections), len(kinds), stderr)
	}
	cell := regexp.MustCompile(`(?m)^ +2 +(5|1|new) +(\d+) +(\d+) +(\d+\.\d\d×|n/a) +\S+ +\S+ +\S+ +\S+( +\d+ → \d+)?$`)
	for i, sec := range sections {
		end := len(stderr)
		if i+1 < len(sections) {
			end = sections[i+1][0]
		}
		text := stderr[sec[0]:end]
		k := kinds[i]
		if got := stderr[sec[2]:sec[3]]; got != k.check {
			t.Errorf("section %d is --check %s, want %s", i, got, k.check)
		}
		if !strings.Contains(text, "upsert/s "+strings.Repeat(" ", 11-len(k.label+"/s"))+k.label+"/s ") {
			t.Errorf("--check %s: the head does not name %s/s beside upsert/s:\n%s", k.check, k.label, text)
		}
		var ids []string
		for _, m := range cell.FindAllStringSubmatch(text, -1) {
			ids = append(ids, m[1])
		}
		if want := []string{"5", "1", "new"}; !slices.Equal(ids, want) {
			t.Errorf("--check %s: cells over %q ids, want %q:\n%s", k.check, ids, want, text)
		}
	}
	var report struct {
		Checks []string `json:"checks"`
		Rules  []struct {
			Check, Name, Window string
		} `json:"rules"`
		Runs []struct {
			Callers, IDs  int
			Call, Check   string
			Calls, Errors int
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("bench --baseline --check all --json: %v\n%s", err, out)
	}
	var wantChecks, gotRuns, wantRuns []string
	calls := map[string]int{}
	for _, k := range kinds {
		wantChecks = append(wantChecks, k.check)
		for _, ids := range []int{5, 1, 0} {
			wantRuns = append(wantRuns, fmt.Sprintf("%s %d upsert", k.check, ids), fmt.Sprintf("%s %d %s", k.check, ids, k.call))
		}
	}
	for _, r := range report.Runs {
		gotRuns = append(gotRuns, fmt.Sprintf("%s %d %s", r.Check, r.IDs, r.Call))
		calls[r.Check+" "+r.Call] += r.Calls
		if r.Errors != 0 || r.Calls < 2 { // each of the 2 callers finishes its first call, however long it takes
			t.Errorf("bench --baseline --check all --json: %+v", r)
		}
	}
	if !slices.Equal(report.Checks, wantChecks) || !slices.Equal(gotRuns, wantRuns) {
		t.Errorf("bench --baseline --check all --json: checks %q runs %q, want %q and %q", report.Checks, gotRuns, wantChecks, wantRuns)
	}
	for _, k := range kinds {
		if calls[k.check+" upsert"] == 0 || calls[k.check+" "+k.call] == 0 {
			t.Errorf("bench --baseline --check %s: %v calls, want both sides working", k.check, calls)
		}
	}
	windows := map[string]string{}
	for _, r := range report.Rules {
		windows[r.Check+" "+r.Name] = r.Window
	}
	if windows["allowall bench"] != "fixed 1m0s" || !strings.HasPrefix(windows["allowall bench.day"], "calendar day") || !strings.HasPrefix(windows["lease bench"], "concurrent") {
		t.Errorf("bench --baseline --check all --json rules: %v", windows)
	}
	if schema := benchSchema(t, stderr); schemaLeft(t, conn, schema) {
		t.Errorf("after bench --baseline --check all: schema %s left", schema)
	}
}

// TestBenchSmoothRule: bench runs a rule file's smooth rule on the memory
// store: a burst of 5 for one id in a run of 100ms at one a minute, 5
// allowed, the rest denied.
func TestBenchSmoothRule(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "smooth.yaml")
	if err := os.WriteFile(rules, []byte("rules:\n  api.smooth: {window: smooth 1m burst 5, limit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := run(t, "bench", "--store", "memory", "--duration", "100ms", "--rules", rules, "--rule", "api.smooth", "--ids", "1", "--callers", "2")
	if code != cli.ExitOK || !strings.Contains(out, "rule api.smooth (smooth 1m0s burst 5, limit 1)") {
		t.Fatalf("bench: exit %d, stderr %q:\n%s", code, stderr, out)
	}
	rows := benchRow.FindAllStringSubmatch(out, -1)
	if len(rows) != 1 || rows[0][4] != "5" || rows[0][5] == "0" || rows[0][6] != "0" {
		t.Errorf("bench: want one row with 5 allowed, some denied, no errors:\n%s", out)
	}
}
