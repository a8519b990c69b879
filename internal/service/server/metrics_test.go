package server_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/promlimit"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
)

// exposition is /metrics' text, parsed: each family's type, and the label
// names of its series (a histogram's le left out).
type exposition struct {
	types  map[string]string
	labels map[string][]string
}

var (
	typeLine  = regexp.MustCompile(`^# TYPE (\S+) (\S+)$`)
	labelName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
)

func parseExposition(t *testing.T, text string) exposition {
	t.Helper()
	e := exposition{types: map[string]string{}, labels: map[string][]string{}}
	for line := range strings.Lines(text) {
		line = strings.TrimSuffix(line, "\n")
		if m := typeLine.FindStringSubmatch(line); m != nil {
			e.types[m[1]] = m[2]
			continue
		}
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && e.types[base] == "histogram" {
				name = base
			}
		}
		var labels []string
		if i := strings.Index(rest, "}"); i >= 0 {
			for _, m := range labelName.FindAllStringSubmatch(rest[:i], -1) {
				if m[1] != "le" {
					labels = append(labels, m[1])
				}
			}
		}
		slices.Sort(labels)
		if prev, ok := e.labels[name]; ok && !slices.Equal(prev, labels) {
			t.Errorf("%s has series labelled %v and %v", name, prev, labels)
		}
		e.labels[name] = labels
	}
	return e
}

// TestServiceSharesTheLibrarysMetrics: every metric promlimit exports for
// an application's Limiter (its Observer and its breaker's OnChange), the
// service exports under the same name, type and label names (it registers
// promlimit's collector, so they cannot drift apart), and the service's
// Limiter feeds it.
func TestServiceSharesTheLibrarysMetrics(t *testing.T) {
	lib := promlimit.New()
	store := memstore.New(memstore.WithJanitorInterval(0))
	defer store.Close()
	l := countlimit.New(store, countlimit.WithObserver(lib.Observer()))
	if _, err := l.Allow(context.Background(), countlimit.Rule{UseType: "sms.code", Limit: 1, Window: countlimit.Fixed(time.Minute)}, "x"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(lib)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}

	metrics, observe := server.NewMetrics()
	svc := countlimit.New(store, observe)
	ts := httptest.NewServer(server.New(server.Config{Limiter: svc, Metrics: metrics, Rules: rulefile.Default(), Logger: quiet}))
	defer ts.Close()
	a := api{t, ts.URL}
	a.do("POST", "/v1/allow", `{"rule": "sms.code", "id": "y"}`)
	code, out := a.do("GET", "/metrics", "")
	text, _ := out["text"].(string)
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, text)
	}
	got := parseExposition(t, text)

	if len(families) != 10 {
		t.Fatalf("promlimit exports %d families, want 10", len(families))
	}
	for _, f := range families {
		name := f.GetName()
		var want []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			want = append(want, l.GetName())
		}
		slices.Sort(want)
		typ := strings.ToLower(f.GetType().String())
		if got.types[name] != typ || !slices.Equal(got.labels[name], want) {
			t.Errorf("%s: the service exports a %q labelled %v, promlimit a %q labelled %v", name, got.types[name], got.labels[name], typ, want)
		}
	}
	for _, want := range []string{
		`countlimit_decisions_total{rule="sms.code",verdict="allowed"} 1`,
		`countlimit_store_duration_seconds_count{op="allow"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("the service's /metrics lack %q", want)
		}
	}
	// The service counts decisions by the rule or group a request names,
	// once per request, not by the Limiter's use types.
	a.do("POST", "/v1/allow", `{"rule": "conversation.create", "id": "y"}`)
	_, out = a.do("GET", "/metrics", "")
	text, _ = out["text"].(string)
	for _, name := range []string{"conversation.hour", "conversation.day"} {
		if want := fmt.Sprintf(`rule=%q`, name); strings.Contains(text, want) {
			t.Errorf("a group's request was counted under its member %s", name)
		}
	}
	if want := `countlimit_decisions_total{rule="conversation.create",verdict="allowed"} 1`; !strings.Contains(text, want+"\n") {
		t.Errorf("the service's /metrics lack %q", want)
	}
}

// TestServiceMetricsTellFailures: the service's /metrics shows each series
// of what the failure options did (promlimit's series without labels)
// once, holding what the Limiter's observer and its breaker's OnChange
// told: 2 failures open the breaker, which refuses the next 3 calls.
func TestServiceMetricsTellFailures(t *testing.T) {
	metrics, observe := server.NewMetrics()
	cfg := server.Config{Rules: rulefile.Default(), Logger: quiet, Metrics: metrics}
	cfg.Limiter = countlimit.New(failing{}, observe,
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 2, CoolDown: time.Hour, OnChange: metrics.BreakerChanged}))
	ts := httptest.NewServer(server.New(cfg))
	defer ts.Close()
	a := api{t, ts.URL}
	for range 5 {
		if code, out := a.do("POST", "/v1/allow", `{"rule": "sms.code", "id": "y"}`); code != 503 {
			t.Fatalf("allow on a store that is down: %d %v, want 503", code, out)
		}
	}
	code, out := a.do("GET", "/metrics", "")
	text, _ := out["text"].(string)
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, text)
	}
	for _, want := range []string{
		"countlimit_store_failures_total 2", "countlimit_store_timeouts_total 0", "countlimit_locked_total 0",
		"countlimit_breaker_rejected_total 3", "countlimit_fallback_decisions_total 0",
		"countlimit_breaker_openings_total 1", "countlimit_breaker_state 1",
	} {
		name := strings.Fields(want)[0]
		var lines []string
		for line := range strings.Lines(text) {
			if strings.HasPrefix(line, name+" ") {
				lines = append(lines, strings.TrimSpace(line))
			}
		}
		if len(lines) != 1 || lines[0] != want {
			t.Errorf("/metrics shows %q, want just %q", lines, want)
		}
	}
}
