package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/cli"
	"github.com/countlimit/countlimit/internal/testbackend"
)

// syncBuffer is a bytes.Buffer safe to write from one goroutine and read
// from another.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingRE = regexp.MustCompile(`serving http://(\S+) `)

// startServe runs "countlimit serve args..." in-process on a free port and
// returns its base URL and a func that stops it and returns its exit status.
func startServe(t *testing.T, args ...string) (string, func() (int, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...), &out, &errOut)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(out.String()); m != nil {
			stop := func() (int, string) {
				cancel()
				select {
				case code := <-done:
					return code, out.String()
				case <-time.After(15 * time.Second):
					t.Fatal("serve did not stop after its context ended")
					return -1, ""
				}
			}
			t.Cleanup(func() { cancel() })
			return "http://" + m[1], stop
		}
		select {
		case code := <-done:
			cancel()
			t.Fatalf("serve exited %d before serving: %s %s", code, out.String(), errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("serve did not start: %s %s", out.String(), errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func post(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func TestServeMemory(t *testing.T) {
	base, stop := startServe(t)
	for i, want := range []bool{true, true, false} {
		code, out := post(t, base+"/v1/allow", `{"rule": "sms.code", "id": "18500000000"}`)
		if code != 200 || out["allowed"] != want {
			t.Fatalf("allow %d: %d %v, want allowed=%v", i+1, code, out, want)
		}
	}
	resp, err := http.Get(base + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	code, out := stop()
	if code != cli.ExitOK || !strings.Contains(out, "countlimit: stopped") {
		t.Errorf("serve after shutdown: exit %d, %q", code, out)
	}
}

func TestServeWithRulesFileAndPostgres(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte("rules:\n  export:\n    window: lifetime\n    limit: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base, stop := startServe(t, "--store", url, "--migrate", "--rules", rules)
	for i, want := range []bool{true, false} {
		code, out := post(t, base+"/v1/allow", `{"rule": "export", "id": "u1"}`)
		if code != 200 || out["allowed"] != want {
			t.Fatalf("allow %d: %d %v", i+1, code, out)
		}
	}
	if code, out := post(t, base+"/v1/allow", `{"rule": "sms.code", "id": "u1"}`); code != 400 || out["field"] != "rule" {
		t.Errorf("a rule not in the file: %d %v", code, out)
	}
	if code, _ := stop(); code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
}

func TestServeErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules:\n  a:\n    window: calendar day Mars/Olympus\n    limit: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--rules", bad}, `bad.yaml:3: rules.a.window: unknown time zone "Mars/Olympus"`},
		{[]string{"serve", "--rules", "/nonexistent/rules.yaml"}, "no such file"},
		{[]string{"serve", "--store", "mysql://x"}, `--store: want memory, postgres://... or redis://..., got "mysql://x"`},
		{[]string{"serve", "--migrate", "--store", "postgres://u:secret@127.0.0.1:1/db?connect_timeout=2"}, "--store postgres://u:xxxxx@127.0.0.1:1/db"},
		{[]string{"allow", "sms.code", "x", "--store", "redis://:secret@127.0.0.1:1"}, "--store redis://:xxxxx@127.0.0.1:1"},
		{[]string{"serve", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--addr", "127.0.0.1:99999"}, "serve:"},
		{[]string{"serve", "extra"}, `unexpected argument "extra"`},
		{[]string{"serve", "--migrate"}, "--migrate is for postgres:// stores"},
		{[]string{"serve", "--migrate", "--store", "postgres://u@127.0.0.1:1/db?sslpassword=secret&connect_timeout=2"}, "sslpassword=xxxxx"},
		{[]string{"serve", "--store", testbackend.FreshSchemaURL(t)}, "schema is missing here"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("countlimit %v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
		if strings.Contains(stderr, "secret") {
			t.Errorf("countlimit %v printed a password: %q", tc.args, stderr)
		}
	}
}

func TestCheckCommands(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatal(stderr)
	}
	steps := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"allow", "sms.code", "p1", "--store", url}, cli.ExitOK, "allowed: sms.code for p1\n  sms.code: 1 of 2 used, 1 left, resets "},
		{[]string{"allow", "--store", url, "sms.code", "p1"}, cli.ExitOK, "2 of 2 used, 0 left"},
		{[]string{"allow", "sms.code", "p1", "--store", url}, cli.ExitDenied, "denied: sms.code for p1 (retry in 4m59."},
		{[]string{"peek", "sms.code", "p1", "--store", url}, cli.ExitDenied, "2 of 2 used"},
		{[]string{"refund", "sms.code", "p1", "--cost", "2", "--store", url}, cli.ExitOK, "0 of 2 used, 2 left"},
		{[]string{"allow", "sms.code", "p1", "--cost", "3", "--store", url}, cli.ExitDenied, "(no wait helps)"},
		{[]string{"allow", "post.create", "m1", "--tier", "gold", "--store", url, "--json"}, cli.ExitOK, `"limit": 8`},
		{[]string{"allow", "conversation.create", "u1", "--store", url}, cli.ExitOK, "conversation.day: 1 of 50 used"},
		{[]string{"reset", "sms.code", "p1", "--store", url}, cli.ExitOK, "reset sms.code for p1"},
		{[]string{"reset", "post.create", "m1", "--store", url, "--json"}, cli.ExitOK, `{"reset": true}`},
		{[]string{"peek", "sms.code", "p1", "--store", url}, cli.ExitOK, "0 of 2 used"},
		{[]string{"allow", "sms.code", "p1", "--store", "memory"}, cli.ExitOK, "1 of 2 used"},
	}
	for i, s := range steps {
		code, out, stderr := run(t, s.args...)
		if code != s.code || !strings.Contains(out, s.want) {
			t.Errorf("step %d: countlimit %v: exit %d, stdout %q, stderr %q; want exit %d and %q", i, s.args, code, out, stderr, s.code, s.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"allow", "sms.code"}, "want RULE ID, got 1 arguments"},
		{[]string{"allow", "nope", "x"}, `unknown rule "nope"; rules: sms.code, password.change`},
		{[]string{"allow", "post.create", "x"}, "needs a tier"},
		{[]string{"allow", "sms.code", "x", "--cost", "0"}, "--cost must be 1 to 2^53"},
		{[]string{"allow", "sms.code", "", "--store", "memory"}, "invalid argument: id: is empty"},
		{[]string{"allow", "conversation.create", "x", "--cost", "2"}, "a group counts one event"},
		{[]string{"peek", "sms.code", "x", "--cost", "2"}, "peek takes no --cost"},
		{[]string{"reset", "sms.code", "x", "--cost", "1"}, "reset takes no --cost"},
		{[]string{"peek", "sms.code", "x", "--store", "postgres://u@127.0.0.1:1/db?connect_timeout=2"}, "--store postgres://u@127.0.0.1:1/db"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("countlimit %v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

func TestTopAndPurge(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatal(stderr)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := context.Background()
	l := countlimit.New(pgstore.New(pool))
	login := countlimit.Rule{UseType: "login", Limit: 2, Window: countlimit.Rolling(time.Hour), Block: time.Hour}
	for range 4 {
		l.Allow(ctx, login, "10.9.9.9")
	}
	pin := countlimit.Rule{UseType: "article.pin", Limit: 5, Window: countlimit.Fixed(time.Hour)}
	l.Allow(ctx, pin, "author-3")
	// Expired rows, written with a clock an hour behind.
	past := countlimit.New(pgstore.New(pool), countlimit.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) }))
	for i := range 30 {
		past.Allow(ctx, countlimit.Rule{UseType: "old", Limit: 1, Window: countlimit.Fixed(time.Minute)}, fmt.Sprint("id-", i))
	}

	l.Allow(ctx, pin, "odd\tid\x1b[31m")
	code, out, stderr := run(t, "top", "--store", url, "-n", "5")
	if !strings.Contains(out, `"odd\tid\x1b[31m"`) {
		t.Errorf("top printed an odd id raw:\n%q", out)
	}
	if code != cli.ExitOK {
		t.Fatalf("top: exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		`Nearest their limit \(3\)\nUSE TYPE +ID +USED +LIMIT +LEFT +DENIED +RESETS IN +BLOCKED FOR\nlogin +10\.9\.9\.9 +2 +2 +0 +2 +\S+ +\S+\narticle\.pin +author-3 +1 +5 +4 +0 +\S+ +-\n`,
		`Most denied \(1\)\n.*\nlogin +10\.9\.9\.9 `,
		`Blocked now \(1\)\n.*\nlogin +10\.9\.9\.9 `,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("top output does not match %s:\n%s", want, out)
		}
	}
	code, out, stderr = run(t, "purge", "--store", url, "--batch", "7")
	if code != cli.ExitOK || out != "purged 30 expired rows\n" {
		t.Errorf("purge: exit %d, %q %q", code, out, stderr)
	}
	code, out, _ = run(t, "purge", "--store", url)
	if code != cli.ExitOK || out != "purged 0 expired rows\n" {
		t.Errorf("second purge: exit %d, %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"top", "--store", "memory"}, "top: --store must be a postgres:// URL"},
		{[]string{"top", "--store", url, "-n", "0"}, "-n must be at least 1"},
		{[]string{"purge", "--store", "redis://127.0.0.1:6379"}, "Redis keys expire on their own"},
		{[]string{"purge", "--store", url, "--batch", "0"}, "--batch must be 1 to"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("countlimit %v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

func TestRulesCommands(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	code, def, _ := run(t, "rules", "default")
	if code != cli.ExitOK || !strings.Contains(def, "conversation.create:") {
		t.Fatalf("rules default: %d %q", code, def)
	}
	os.WriteFile(good, []byte(def), 0o644)
	os.WriteFile(bad, []byte("rules:\n  a:\n    window: fixed 1m\n    limit: 1\n    blok: 5m\n"), 0o644)
	if code, out, _ := run(t, "rules", "check", good); code != cli.ExitOK || !strings.Contains(out, "8 rules, 1 groups: ok") {
		t.Errorf("rules check good: %d %q", code, out)
	}
	if code, _, stderr := run(t, "rules", "check", bad); code != cli.ExitError || !strings.Contains(stderr, "bad.yaml:5: rules.a.blok: unknown field") {
		t.Errorf("rules check bad: %d %q", code, stderr)
	}
	for _, args := range [][]string{{"rules"}, {"rules", "check"}, {"rules", "lint", "x"}, {"rules", "default", "x"}} {
		if code, _, _ := run(t, args...); code != cli.ExitError {
			t.Errorf("countlimit %v: exit %d, want 2", args, code)
		}
	}
}

func TestBench(t *testing.T) {
	code, out, stderr := run(t, "bench", "--duration", "200ms", "--concurrency", "4", "--ids", "10")
	if code != cli.ExitOK {
		t.Fatalf("bench: exit %d, %s", code, stderr)
	}
	m := regexp.MustCompile(`calls +(\d+) +\((\d+) allowed, 0 denied, 0 errors\)\nthroughput +\d+ calls/s`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] || m[1] == "0" {
		t.Errorf("bench output:\n%s", out)
	}
	// A rule that fills: denials are counted, not errors.
	code, out, _ = run(t, "bench", "--duration", "100ms", "--rule", "article.pin", "--ids", "1")
	if code != cli.ExitOK || !regexp.MustCompile(`\(1 allowed, [1-9]\d* denied, 0 errors\)`).MatchString(out) {
		t.Errorf("bench --rule article.pin: exit %d\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"bench", "--concurrency", "0"}, "--concurrency must be 1 to 10000"},
		{[]string{"bench", "--ids", "0"}, "--ids must be at least 1"},
		{[]string{"bench", "--rule", "conversation.create"}, "is a group"},
		{[]string{"bench", "--rule", "post.create"}, "needs a tier"},
		{[]string{"bench", "--duration", "100ms", "--store", testbackend.FreshSchemaURL(t)}, "countlimit's schema is missing here"},
	} {
		code, _, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("countlimit %v: exit %d, stderr %q; want 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

func TestBenchBaseline(t *testing.T) {
	url := testbackend.FreshSchemaURL(t)
	if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
		t.Fatalf("migrate up: exit %d, %s", code, stderr)
	}
	code, out, stderr := run(t, "bench", "--baseline", "--store", url, "--duration", "600ms", "--callers", "1,3", "--ids", "5")
	if code != cli.ExitOK {
		t.Fatalf("bench --baseline: exit %d, %s", code, stderr)
	}
	// One line per cell: callers, ids, both rates, their ratio, both p99s.
	cells := regexp.MustCompile(`(?m)^ +(\d+) +(\d+) +(\d+) +(\d+) +(\d+\.\d\d)× +\S+ +\S+$`).FindAllStringSubmatch(out, -1)
	want := [][2]string{{"1", "5"}, {"1", "1"}, {"3", "5"}, {"3", "1"}}
	if len(cells) != len(want) {
		t.Fatalf("bench --baseline printed %d cells, want %d:\n%s", len(cells), len(want), out)
	}
	for i, c := range cells {
		if c[1] != want[i][0] || c[2] != want[i][1] || c[3] == "0" || c[4] == "0" {
			t.Errorf("cell %d: %q, want %v callers over %v ids and nonzero rates", i, c[0], want[i][0], want[i][1])
		}
	}
	if !strings.Contains(out, "synchronous_commit=on") {
		t.Errorf("bench --baseline does not say whether commits were durable:\n%s", out)
	}
	// It leaves nothing behind: no baseline table, no bench rows.
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables, rows int
	err = conn.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM pg_tables WHERE tablename LIKE 'countlimit_bench_baseline_%' AND schemaname = current_schema()),
		(SELECT count(*) FROM count_limit)`).Scan(&tables, &rows)
	if err != nil || tables != 0 || rows != 0 {
		t.Errorf("after bench --baseline: %d baseline tables and %d count_limit rows left (err %v)", tables, rows, err)
	}

	if code, _, stderr := run(t, "bench", "--baseline", "--store", "memory"); code != cli.ExitError || !strings.Contains(stderr, "--store must be postgres://") {
		t.Errorf("bench --baseline on memory: exit %d, %q", code, stderr)
	}
	if code, _, stderr := run(t, "bench", "--baseline", "--store", url, "--callers", "1,x"); code != cli.ExitError || !strings.Contains(stderr, "--callers") {
		t.Errorf("bench --callers 1,x: exit %d, %q", code, stderr)
	}
}
