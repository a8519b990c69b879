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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
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
	if !strings.Contains(out, " (store memory; 9 rules and 1 group from the built-in example rules)\n") {
		t.Errorf("serve does not say what it serves: %q", out)
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
	if code, out := stop(); code != cli.ExitOK || !strings.Contains(out, "; 1 rule and 0 groups from "+rules+")\n") {
		t.Errorf("exit %d: %q", code, out)
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
	// A step with a wait says "retry in D": D is the wait less the time
	// since the call of step since, as the CLI's clock read it during
	// both calls.
	steps := []struct {
		args  []string
		code  int
		want  string
		wait  time.Duration
		since int
	}{
		{args: []string{"allow", "sms.code", "p1", "--store", url}, code: cli.ExitOK, want: "allowed: sms.code for p1\n  sms.code: 1 of 2 used, 1 left, resets "},
		{args: []string{"allow", "--store", url, "sms.code", "p1"}, code: cli.ExitOK, want: "2 of 2 used, 0 left"},
		// sliding 5m: the first event leaves the log 5 minutes after it.
		{args: []string{"allow", "sms.code", "p1", "--store", url}, code: cli.ExitDenied, want: "denied: sms.code for p1 (retry in ", wait: 5 * time.Minute, since: 0},
		{args: []string{"peek", "sms.code", "p1", "--store", url}, code: cli.ExitDenied, want: "would be denied: sms.code for p1 (retry in ", wait: 5 * time.Minute, since: 0},
		{args: []string{"peek", "sms.code", "p1", "--store", url}, code: cli.ExitDenied, want: "2 of 2 used"},
		{args: []string{"refund", "sms.code", "p1", "--cost", "2", "--store", url}, code: cli.ExitOK, want: "refunded 2: sms.code for p1\n  sms.code: 0 of 2 used, 2 left"},
		{args: []string{"peek", "sms.code", "p1", "--store", url}, code: cli.ExitOK, want: "would be allowed: sms.code for p1\n"},
		{args: []string{"allow", "sms.code", "p1", "--cost", "3", "--store", url}, code: cli.ExitDenied, want: "(no wait helps)"},
		{args: []string{"allow", "post.create", "m1", "--tier", "gold", "--store", url, "--json"}, code: cli.ExitOK, want: `"limit": 8`},
		{args: []string{"allow", "conversation.create", "u1", "--store", url}, code: cli.ExitOK, want: "conversation.day: 1 of 50 used"},
		{args: []string{"reset", "sms.code", "p1", "--store", url}, code: cli.ExitOK, want: "reset sms.code for p1"},
		{args: []string{"reset", "post.create", "m1", "--store", url, "--json"}, code: cli.ExitOK, want: `{"reset": true}`},
		{args: []string{"peek", "sms.code", "p1", "--store", url}, code: cli.ExitOK, want: "0 of 2 used"},
		// A refund leaves a penalty in place: refunded, and still denied.
		{args: []string{"allow", "login", "10.0.0.1", "--cost", "5", "--store", url}, code: cli.ExitOK, want: "5 of 5 used"},
		// Blocked for 30 minutes from here.
		{args: []string{"allow", "login", "10.0.0.1", "--store", url}, code: cli.ExitDenied, want: ", blocked until "},
		{args: []string{"refund", "login", "10.0.0.1", "--store", url}, code: cli.ExitOK,
			want: "refunded 1: login for 10.0.0.1; the next allow would still be denied (retry in ", wait: 30 * time.Minute, since: 14},
		{args: []string{"refund", "login", "10.0.0.1", "--store", url, "--json"}, code: cli.ExitOK, want: "{\n  \"refunded\": 1,\n  \"allowed\": false"},
	}
	spans := make([]span, len(steps))
	for i, s := range steps {
		code, out, stderr, at := timed(t, s.args...)
		spans[i] = at
		if code != s.code || !strings.Contains(out, s.want) {
			t.Errorf("step %d: countlimit %v: exit %d, stdout %q, stderr %q; want exit %d and %q", i, s.args, code, out, stderr, s.code, s.want)
		} else if s.wait > 0 {
			if err := checkWait(out, s.wait, spans[s.since], at); err != nil {
				t.Errorf("step %d: countlimit %v: %v (the wait of step %d's call less the time since)", i, s.args, err, s.since)
			}
		}
	}
	// $COUNTLIMIT_STORE names the store when --store does not.
	t.Setenv("COUNTLIMIT_STORE", url)
	if code, out, stderr := run(t, "allow", "sms.code", "env-1"); code != cli.ExitOK || !strings.Contains(out, "1 of 2 used") {
		t.Errorf("allow with COUNTLIMIT_STORE: exit %d, %q %q", code, out, stderr)
	}
	if code, out, stderr := run(t, "allow", "sms.code", "env-1"); code != cli.ExitOK || !strings.Contains(out, "2 of 2 used") {
		t.Errorf("allow again with COUNTLIMIT_STORE: exit %d, %q %q", code, out, stderr)
	}
	t.Setenv("COUNTLIMIT_STORE", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"allow", "sms.code"}, "want RULE ID, got 1 argument\n"},
		{[]string{"allow", "nope", "x", "--store", url}, `unknown rule "nope"; rules: sms.code, password.change`},
		{[]string{"allow", "post.create", "x", "--store", url}, "needs a tier"},
		{[]string{"allow", "sms.code", "x", "--cost", "0", "--store", url}, "--cost must be 1 to 2^53"},
		{[]string{"allow", "sms.code", "", "--store", url}, "invalid argument: id: is empty"},
		{[]string{"allow", "sms.code", "x", "--store", "memory"}, "--store memory would forget the count when the command exits"},
		{[]string{"allow", "conversation.create", "x", "--cost", "2", "--store", url}, "a group counts one event"},
		{[]string{"peek", "sms.code", "x", "--cost", "2", "--store", url}, "peek takes no --cost"},
		{[]string{"reset", "sms.code", "x", "--cost", "1", "--store", url}, "reset takes no --cost"},
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
	// Expired rows, written with a clock two hours behind.
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
	code, out, stderr = run(t, "top", "--store", url, "-n", "5", "--json")
	if code != cli.ExitOK {
		t.Fatalf("top --json: exit %d: %s", code, stderr)
	}
	var tables map[string][]struct {
		UseType         string   `json:"use_type"`
		UniqueID        string   `json:"unique_id"`
		Used            int64    `json:"used"`
		Limit           int64    `json:"limit"`
		Denied          int64    `json:"denied"`
		Blocked         bool     `json:"blocked"`
		BlockedUntil    *string  `json:"blocked_until"`
		BlockedFor      float64  `json:"blocked_for_seconds"`
		ResetsInSeconds *float64 `json:"resets_in_seconds"`
	}
	if err := json.Unmarshal([]byte(out), &tables); err != nil {
		t.Fatalf("top --json: %v\n%s", err, out)
	}
	if n := len(tables["nearest_limit"]); n != 3 {
		t.Errorf("top --json: %d counters nearest their limit, want 3:\n%s", n, out)
	}
	for _, key := range []string{"most_denied", "blocked"} {
		rows := tables[key]
		if len(rows) != 1 || rows[0].UseType != "login" || rows[0].UniqueID != "10.9.9.9" || rows[0].Denied != 2 || rows[0].Used != 2 || rows[0].Limit != 2 {
			t.Errorf("top --json: %s = %+v, want login 10.9.9.9 with 2 of 2 used and 2 denied", key, rows)
			continue
		}
		if !rows[0].Blocked || rows[0].BlockedUntil == nil || rows[0].BlockedFor < 3500 || rows[0].BlockedFor > 3600 {
			t.Errorf("top --json: %s[0] = %+v, want blocked for about an hour", key, rows[0])
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
	if code, out, _ := run(t, "rules", "check", good); code != cli.ExitOK || !strings.Contains(out, "9 rules and 1 group: ok") {
		t.Errorf("rules check good: %d %q", code, out)
	}
	one := filepath.Join(dir, "one.yaml")
	os.WriteFile(one, []byte("rules:\n  a:\n    window: fixed 1m\n    limit: 1\n"), 0o644)
	if code, out, _ := run(t, "rules", "check", one); code != cli.ExitOK || out != one+": 1 rule and 0 groups: ok\n" {
		t.Errorf("rules check one: %d %q", code, out)
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
