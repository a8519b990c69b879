package cli_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/service/cli"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// watched is a syncBuffer that closes ready once serve says it serves.
type watched struct {
	syncBuffer
	once  sync.Once
	ready chan struct{}
}

func (w *watched) Write(p []byte) (int, error) {
	n, err := w.syncBuffer.Write(p)
	if w.ready != nil && servingRE.MatchString(w.String()) {
		w.once.Do(func() { close(w.ready) })
	}
	return n, err
}

// served is a "countlimit serve" running in-process.
type served struct {
	base           string // http://host:port
	stdout, stderr *watched
	stop           func() int // stops it and returns its exit status
}

// launch runs "countlimit serve --addr 127.0.0.1:0 args..." and returns
// once it serves; later args override the --addr.
func launch(t *testing.T, args ...string) *served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &served{stdout: &watched{ready: make(chan struct{})}, stderr: &watched{}}
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, append([]string{"serve", "--addr", "127.0.0.1:0"}, args...), s.stdout, s.stderr)
	}()
	guard := time.NewTimer(30 * time.Second) // against a hang, not a timing assertion
	defer guard.Stop()
	select {
	case <-s.stdout.ready:
	case code := <-done:
		t.Fatalf("serve %v exited %d before serving: %s %s", args, code, s.stdout.String(), s.stderr.String())
	case <-guard.C:
		t.Fatalf("serve %v did not start: %s %s", args, s.stdout.String(), s.stderr.String())
	}
	s.base = "http://" + servingRE.FindStringSubmatch(s.stdout.String())[1]
	s.stop = func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(30 * time.Second):
			t.Fatal("serve did not stop after its context ended")
			return -1
		}
	}
	return s
}

// request makes one request and returns the status, the JSON body and the
// WWW-Authenticate header.
func request(t *testing.T, method, url, body, token string) (int, map[string]any, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := map[string]any{"text": string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: bad JSON %q", method, url, raw)
		}
	}
	return resp.StatusCode, out, resp.Header.Get("WWW-Authenticate")
}

func tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestServeToken(t *testing.T) {
	const fileToken, envToken = "file-token-0123456789abcdef", "env-token-0123456789abcdef"
	t.Setenv("COUNTLIMIT_TOKEN", envToken)
	// Beyond loopback: a token is enough, no --insecure needed.
	s := launch(t, "--addr", ":0", "--token-file", tokenFile(t, fileToken))
	s.base = strings.Replace(s.base, "[::]", "127.0.0.1", 1)
	sms := `{"rule": "sms.code", "id": "18500000000"}`
	for _, tc := range []struct {
		method, path, token string
		code                int
	}{
		{"POST", "/v1/allow", "", 401},
		{"POST", "/v1/reset", "", 401},
		{"POST", "/v1/allow", envToken, 401}, // --token-file beats $COUNTLIMIT_TOKEN
		{"POST", "/v1/allow", fileToken, 200},
		{"POST", "/v1/refund", fileToken, 200},
		{"GET", "/v1/rules", "", 401},
		{"GET", "/metrics", "", 401},
		{"GET", "/metrics", fileToken, 200},
		{"GET", "/healthz", "", 200},
	} {
		code, out, challenge := request(t, tc.method, s.base+tc.path, sms, tc.token)
		if code != tc.code || code == 401 && (!strings.HasPrefix(challenge, "Bearer ") || out["error"] == nil) {
			t.Errorf("%s %s with token %q: %d %v %q; want %d", tc.method, tc.path, tc.token, code, out, challenge, tc.code)
		}
	}
	if code := s.stop(); code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
	if strings.Contains(s.stdout.String()+s.stderr.String(), fileToken) {
		t.Error("serve printed its token")
	}

	// With no --token-file, $COUNTLIMIT_TOKEN is the token.
	s = launch(t)
	if code, _, _ := request(t, "POST", s.base+"/v1/allow", sms, envToken); code != 200 {
		t.Errorf("allow with $COUNTLIMIT_TOKEN's token: %d", code)
	}
	if code, _, _ := request(t, "POST", s.base+"/v1/allow", sms, ""); code != 401 {
		t.Errorf("allow without a token: %d", code)
	}
	s.stop()
}

func TestServeRefusesExposure(t *testing.T) {
	t.Setenv("COUNTLIMIT_TOKEN", "")
	t.Setenv("COUNTLIMIT_ADDR", "")
	for _, tc := range []struct {
		args []string
		env  string // $COUNTLIMIT_ADDR
		want string
	}{
		{[]string{"serve", "--addr", ":0"}, "", "--addr :0 listens beyond loopback, and no token is set"},
		{[]string{"serve", "--addr", "0.0.0.0:0", "--metrics-addr", "127.0.0.1:0"}, "", "pass --insecure"},
		{[]string{"serve"}, ":0", "Set --token-file FILE or $COUNTLIMIT_TOKEN"},
		{[]string{"serve", "--addr", ":0", "--token-file", "/nonexistent/token"}, "", "--token-file: open /nonexistent/token"},
		{[]string{"serve", "--token-file", tokenFile(t, "")}, "", "is empty"},
		{[]string{"serve", "--token-file", tokenFile(t, "short")}, "", "want at least 16"},
	} {
		t.Setenv("COUNTLIMIT_ADDR", tc.env)
		code, out, stderr := run(t, tc.args...)
		if code != cli.ExitError || !strings.Contains(stderr, tc.want) || strings.Contains(out, "serving") {
			t.Errorf("countlimit %v with COUNTLIMIT_ADDR=%q: exit %d, stderr %q; want 2 and %q", tc.args, tc.env, code, stderr, tc.want)
		}
	}
	t.Setenv("COUNTLIMIT_ADDR", "")
	s := launch(t, "--addr", "0.0.0.0:0", "--insecure")
	if !strings.Contains(s.stderr.String(), "serving beyond loopback with no token (--insecure)") {
		t.Errorf("serve --insecure did not warn: %s", s.stderr.String())
	}
	if code := s.stop(); code != cli.ExitOK {
		t.Errorf("serve --insecure: exit %d", code)
	}
}

var metricsRE = regexp.MustCompile(`metrics on (http://\S+/metrics)`)

func TestServeMetricsAddr(t *testing.T) {
	t.Parallel()
	const token = "metrics-test-token-0123456789"
	s := launch(t, "--metrics-addr", "127.0.0.1:0", "--token-file", tokenFile(t, token))
	m := metricsRE.FindStringSubmatch(s.stdout.String())
	if m == nil {
		t.Fatalf("serve --metrics-addr did not say where: %s", s.stdout.String())
	}
	if code, _, _ := request(t, "POST", s.base+"/v1/allow", `{"rule": "sms.code", "id": "x"}`, token); code != 200 {
		t.Errorf("allow: %d", code)
	}
	if code, out, _ := request(t, "GET", s.base+"/metrics", "", token); code != 404 {
		t.Errorf("GET /metrics on --addr: %d %v, want 404", code, out)
	}
	code, out, _ := request(t, "GET", m[1], "", "")
	if text := out["text"].(string); code != 200 || !strings.Contains(text, `countlimit_decisions_total{rule="sms.code",verdict="allowed"} 1`) {
		t.Errorf("GET %s with no token: %d, want 200 with the API's metrics:\n%s", m[1], code, text)
	}
	if code, _, _ := request(t, "POST", strings.TrimSuffix(m[1], "/metrics")+"/v1/allow", `{"rule": "sms.code", "id": "x"}`, token); code != 404 {
		t.Errorf("the metrics address serves the API: %d", code)
	}
	if code := s.stop(); code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
}

func TestServeStoreDownAtStart(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://postgres:secret@127.0.0.1:1/x",
		"redis://:secret@127.0.0.1:1/0",
	} {
		t.Run(strings.SplitN(url, ":", 2)[0], func(t *testing.T) {
			t.Parallel()
			s := launch(t, "--store", url)
			if !strings.Contains(s.stdout.String(), "the store does not answer yet") {
				t.Errorf("stdout does not say the store is down: %s", s.stdout.String())
			}
			for i := range 2 {
				if code, out, _ := request(t, "GET", s.base+"/healthz", "", ""); code != 503 || out["status"] != "unavailable" || out["reason"] == nil {
					t.Errorf("step %d: healthz: %d %v, want 503 with a reason", i, code, out)
				}
				if code, out, _ := request(t, "POST", s.base+"/v1/allow", `{"rule": "sms.code", "id": "x"}`, ""); code != 503 || out["error"] != "store unavailable" {
					t.Errorf("step %d: allow: %d %v, want 503", i, code, out)
				}
			}
			if code := s.stop(); code != cli.ExitOK {
				t.Errorf("exit %d", code)
			}
			logs := s.stderr.String()
			if n := strings.Count(logs, `"msg":"store unavailable at start; serving, unhealthy until it answers"`); n != 1 {
				t.Errorf("%d start warnings, want 1:\n%s", n, logs)
			}
			if n := strings.Count(logs, `"msg":"store unavailable"`); n != 0 {
				t.Errorf("%d more outage lines while down from the start, want 0:\n%s", n, logs)
			}
			if strings.Contains(logs+s.stdout.String(), "secret") {
				t.Errorf("serve printed the store's password:\n%s", logs)
			}
		})
	}
}

func TestServeMigrateNeedsTheStore(t *testing.T) {
	t.Parallel()
	code, out, stderr := run(t, "serve", "--migrate", "--store", "postgres://postgres@127.0.0.1:1/x")
	if code != cli.ExitError || !strings.Contains(stderr, "serve --migrate: the store must answer at start") || strings.Contains(out, "serving") {
		t.Errorf("serve --migrate with the store down: exit %d, stderr %q", code, stderr)
	}
}

// With the store down, the circuit breaker opens after --breaker-failures
// failed checks: later checks are answered without calling the store, the
// log says so once, and /metrics shows it, through the Limiter's observer.
func TestServeCircuitBreaker(t *testing.T) {
	t.Parallel()
	s := launch(t, "--store", "postgres://postgres@127.0.0.1:1/x", "--breaker-failures", "2", "--breaker-cooldown", "1h", "--store-timeout", "2s")
	for i := range 6 {
		if code, out, _ := request(t, "POST", s.base+"/v1/allow", `{"rule": "sms.code", "id": "x"}`, ""); code != 503 {
			t.Fatalf("allow %d with the store down: %d %v, want 503", i, code, out)
		}
	}
	_, out, _ := request(t, "GET", s.base+"/metrics", "", "")
	text, _ := out["text"].(string)
	for _, want := range []string{
		"countlimit_breaker_state 1",
		"countlimit_breaker_openings_total 1",
		"countlimit_breaker_rejected_total 4",
		"countlimit_store_failures_total 2",
		`countlimit_store_duration_seconds_count{op="allow"} 2`, // the two calls that reached the store
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code := s.stop(); code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
	if n := strings.Count(s.stderr.String(), "circuit breaker open"); n != 1 {
		t.Errorf("%d breaker lines, want 1:\n%s", n, s.stderr.String())
	}
}

func TestServeFailureFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"serve", "--store-timeout", "-1s"},
		{"serve", "--breaker-failures", "-1"},
		{"serve", "--breaker-cooldown", "0s"},
		{"serve", "--max-conns", "-1"},
		{"serve", "--purge-interval", "-1s"},
		{"serve", "--purge-batch", "0"},
		{"serve", "--purge-batch", "2000000"},
	} {
		var stdout, stderr strings.Builder
		if code := cli.Run(context.Background(), args, &stdout, &stderr); code != cli.ExitError || !strings.Contains(stderr.String(), args[1]) {
			t.Errorf("%v: exit %d, stderr %q; want a usage error naming %s", args, code, stderr.String(), args[1])
		}
	}
}

// TestServeLeaseKey: with --lease-key-file the service hands out signed
// leases and refuses an unsigned one; a short key stops it at start.
func TestServeLeaseKey(t *testing.T) {
	t.Setenv("COUNTLIMIT_LEASE_KEY", "")
	key := filepath.Join(t.TempDir(), "lease.key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := run(t, "serve", "--lease-key-file", tokenFile(t, "short")); code != cli.ExitError || !strings.Contains(stderr, "want at least 16") {
		t.Errorf("serve with a 5-byte lease key: exit %d, stderr %q; want 2", code, stderr)
	}
	s := launch(t, "--lease-key-file", key)
	defer s.stop()
	code, out := post(t, s.base+"/v1/acquire", `{"rule": "export.running", "id": "u1"}`)
	lease, _ := out["lease"].(string)
	if code != 200 || !strings.HasPrefix(lease, "cl2.") {
		t.Fatalf("acquire: %d %v; want a signed lease", code, out)
	}
	unsigned := "cl1" + strings.TrimPrefix(lease, "cl2")
	if code, out := post(t, s.base+"/v1/release", `{"lease": "`+unsigned+`"}`); code != 400 {
		t.Errorf("release of an unsigned lease: %d %v; want 400", code, out)
	}
	if code, out := post(t, s.base+"/v1/release", `{"lease": "`+lease+`"}`); code != 200 || out["released"] != true {
		t.Errorf("release: %d %v; want released", code, out)
	}
}

// TestServeSilentConnsYield is issue 32's lock-out: with --max-conns 20,
// 25 connections that send nothing, or a request line and headers a byte
// at a time, or headers and then a body a byte at a time, must not keep a
// new client from its answer. Before the cap yielded to new clients, it
// got 503 until the server's header or read timeout (5 s, 10 s) closed
// some of them.
func TestServeSilentConnsYield(t *testing.T) {
	t.Parallel()
	s := launch(t, "--max-conns", "20")
	addr := strings.TrimPrefix(s.base, "http://")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var held []net.Conn
	var once sync.Once
	letGo := func() {
		once.Do(func() {
			close(stop)
			wg.Wait()
			for _, c := range held {
				c.Close()
			}
		})
	}
	defer letGo()
	for i := range 25 {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		var slowly string
		switch i % 3 {
		case 0: // silent
			continue
		case 1:
			slowly = "GET /healthz HTTP/1.1\r\nHost: countlimit\r\nX-Pad: " + strings.Repeat("a", 10000)
		case 2:
			if _, err := io.WriteString(c, "POST /v1/allow HTTP/1.1\r\nHost: countlimit\r\nContent-Length: 60000\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			slowly = `{"rule": "sms.code", "id": "` + strings.Repeat("a", 10000)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range len(slowly) {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				if _, err := c.Write([]byte{slowly[i]}); err != nil {
					return
				}
			}
		}()
	}

	client := &http.Client{
		Timeout:   30 * time.Second, // against a hang, not a timing assertion
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	for i := range 3 {
		start := time.Now()
		resp, err := client.Get(s.base + "/healthz")
		if err != nil {
			t.Errorf("client %d with 25 connections held without a request: %v", i, err)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Well before the 5 s header timeout that would otherwise free a slot.
		if took := time.Since(start); resp.StatusCode != 200 || took > 2500*time.Millisecond {
			t.Errorf("client %d with 25 connections held without a request: %d %s after %v; want 200 at once", i, resp.StatusCode, raw, took)
		}
	}
	letGo() // a handler reading a body would hold the shutdown
	if code := s.stop(); code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
}

// TestServeSchemaBehind: serve on a PostgreSQL schema that lacks
// migrations (none applied, or the latest rolled back) starts; /healthz
// and checks answer 503 saying which migrations are missing and what to
// run, without calling the store; once "countlimit migrate up" has run,
// /healthz turns 200 and checks are served.
func TestServeSchemaBehind(t *testing.T) {
	t.Parallel()
	names := migrationNames(t)
	for _, tc := range []struct {
		name    string
		down    int    // migrations rolled back after all were applied; -1: none applied
		missing string // a migration /healthz must name
	}{
		{"none applied", -1, names[0]},
		{"latest rolled back", 1, names[len(names)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := testbackend.FreshSchemaURL(t)
			if tc.down >= 0 {
				if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
					t.Fatal(stderr)
				}
				for range tc.down {
					if code, _, stderr := run(t, "migrate", "down", "--store", url); code != cli.ExitOK {
						t.Fatal(stderr)
					}
				}
			}
			s := launch(t, "--store", url)
			if out := s.stdout.String(); !strings.Contains(out, tc.missing) {
				t.Errorf("stdout does not name the missing migration %s: %s", tc.missing, out)
			}
			allow := `{"rule": "sms.code", "id": "behind"}`
			for i := range 2 {
				code, out, _ := request(t, "GET", s.base+"/healthz", "", "")
				reason, _ := out["reason"].(string)
				if code != 503 || out["error"] != "store schema not ready" || !strings.Contains(reason, tc.missing) || !strings.Contains(reason, `"countlimit migrate up"`) {
					t.Errorf("step %d: healthz: %d %v, want 503 naming %s and \"countlimit migrate up\"", i, code, out, tc.missing)
				}
				code, out, _ = request(t, "POST", s.base+"/v1/allow", allow, "")
				msg, _ := out["error"].(string)
				if code != 503 || !strings.Contains(msg, tc.missing) || !strings.Contains(msg, `"countlimit migrate up"`) {
					t.Errorf("step %d: allow: %d %v, want 503 naming %s and \"countlimit migrate up\"", i, code, out, tc.missing)
				}
			}

			if code, _, stderr := run(t, "migrate", "up", "--store", url); code != cli.ExitOK {
				t.Fatal(stderr)
			}
			if code, out, _ := request(t, "GET", s.base+"/healthz", "", ""); code != 200 {
				t.Errorf("healthz once migrated: %d %v, want 200", code, out)
			}
			if code, out, _ := request(t, "POST", s.base+"/v1/allow", allow, ""); code != 200 || out["allowed"] != true {
				t.Errorf("allow once migrated: %d %v, want 200 allowed", code, out)
			}
			if code := s.stop(); code != cli.ExitOK {
				t.Errorf("exit %d", code)
			}
			if logs := s.stderr.String(); !strings.Contains(logs, "the store's schema is ready: serving checks") {
				t.Errorf("the log does not say the schema turned ready:\n%s", logs)
			}
		})
	}
}
