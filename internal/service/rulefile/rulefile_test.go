package rulefile_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/service/rulefile"
)

func TestDefaultHoldsTheExampleRules(t *testing.T) {
	f := rulefile.Default()
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	for _, tc := range []struct {
		name, tier string
		want       []countlimit.Rule
	}{
		{"sms.code", "", []countlimit.Rule{{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}}},
		{"password.change", "", []countlimit.Rule{{UseType: "password.change", Limit: 3, Window: countlimit.Calendar(countlimit.Day, shanghai)}}},
		{"article.pin", "", []countlimit.Rule{{UseType: "article.pin", Limit: 1, Window: countlimit.Calendar(countlimit.Month, shanghai)}}},
		{"api", "", []countlimit.Rule{{UseType: "api", Limit: 10, Window: countlimit.Fixed(time.Minute)}}},
		{"api", "registered", []countlimit.Rule{{UseType: "api", Limit: 100, Window: countlimit.Fixed(time.Minute)}}},
		{"api", "anonymous", []countlimit.Rule{{UseType: "api", Limit: 10, Window: countlimit.Fixed(time.Minute)}}},
		{"post.create", "bronze", []countlimit.Rule{{UseType: "post.create", Limit: 3, Window: countlimit.Fixed(time.Hour)}}},
		{"post.create", "silver", []countlimit.Rule{{UseType: "post.create", Limit: 5, Window: countlimit.Fixed(time.Hour)}}},
		{"post.create", "gold", []countlimit.Rule{{UseType: "post.create", Limit: 8, Window: countlimit.Fixed(time.Hour)}}},
		{"login", "", []countlimit.Rule{{UseType: "login", Limit: 5, Window: countlimit.Rolling(15 * time.Minute), Block: 30 * time.Minute}}},
		{"export.running", "", []countlimit.Rule{{UseType: "export.running", Limit: 3, Window: countlimit.Concurrent(10 * time.Minute)}}},
		{"conversation.create", "", []countlimit.Rule{
			{UseType: "conversation.hour", Limit: 10, Window: countlimit.Fixed(time.Hour)},
			{UseType: "conversation.day", Limit: 50, Window: countlimit.Calendar(countlimit.Day, shanghai)},
		}},
	} {
		got, err := f.Resolve(tc.name, tc.tier)
		if err != nil {
			t.Errorf("Resolve(%q, %q): %v", tc.name, tc.tier, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("Resolve(%q, %q) = %d rules, want %d", tc.name, tc.tier, len(got), len(tc.want))
			continue
		}
		for i := range got {
			g, w := got[i], tc.want[i]
			if g.UseType != w.UseType || g.Limit != w.Limit || g.Block != w.Block || g.Window.String() != w.Window.String() {
				t.Errorf("Resolve(%q, %q)[%d] = %+v (%v), want %+v (%v)", tc.name, tc.tier, i, g, g.Window, w, w.Window)
			}
		}
	}
	if got := strings.Join(f.Names(), " "); got != "sms.code password.change article.pin api post.create login export.running conversation.hour conversation.day conversation.create" {
		t.Errorf("Names() = %s", got)
	}
}

func TestResolveErrors(t *testing.T) {
	f := rulefile.Default()
	for _, tc := range []struct {
		name, tier string
		is         error
		msg        string
	}{
		{"nope", "", rulefile.ErrUnknown, `"nope"`},
		{"post.create", "", rulefile.ErrTier, "needs a tier (one of bronze, gold, silver)"},
		{"post.create", "platinum", rulefile.ErrTier, `no tier "platinum"`},
	} {
		_, err := f.Resolve(tc.name, tc.tier)
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Resolve(%q, %q) = %v, want %v containing %q", tc.name, tc.tier, err, tc.is, tc.msg)
		}
	}
}

func TestParseErrorsNameFileLineAndField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown top-level field", "rules:\n  a: {window: fixed 1m, limit: 1}\nrulez: {}\n", "r.yaml:3: rulez: unknown field"},
		{"unknown rule field", "rules:\n  a:\n    window: fixed 1m\n    limit: 1\n    limt: 2\n", "r.yaml:5: rules.a.limt: unknown field"},
		{"bad duration", "rules:\n  a:\n    window: rolling 5 minutes\n    limit: 1\n", "r.yaml:3: rules.a.window: want \"rolling\" followed by a duration"},
		{"bad duration value", "rules:\n  a:\n    window: fixed 5x\n    limit: 1\n", `r.yaml:3: rules.a.window: bad duration "5x"`},
		{"unknown zone", "rules:\n  a:\n    window: calendar day Asia/Shangai\n    limit: 1\n", `r.yaml:3: rules.a.window: unknown time zone "Asia/Shangai"`},
		{"unknown unit", "rules:\n  a:\n    window: calendar fortnight\n    limit: 1\n", `r.yaml:3: rules.a.window: unknown calendar unit "fortnight"`},
		{"unknown kind", "rules:\n  a:\n    window: leaky 1m\n    limit: 1\n", `r.yaml:3: rules.a.window: unknown window kind "leaky": want rolling, fixed, sliding, calendar, lifetime, concurrent or smooth`},
		{"concurrent without a ttl", "rules:\n  a:\n    window: concurrent\n    limit: 1\n", `r.yaml:3: rules.a.window: want "concurrent" followed by a duration, like "concurrent 5m"`},
		{"concurrent bad ttl", "rules:\n  a:\n    window: concurrent 10 minutes\n    limit: 1\n", `r.yaml:3: rules.a.window: want "concurrent" followed by a duration`},
		{"concurrent zero ttl", "rules:\n  a:\n    window: concurrent 0s\n    limit: 1\n", `r.yaml:3: rules.a.window: bad duration "0s"`},
		{"concurrent ttl over 100 years", "rules:\n  a:\n    window: concurrent 1000000h\n    limit: 1\n", "r.yaml:3: rules.a.window: Rule.Window: concurrent duration must be 1µs to 100 years"},
		{"concurrent limit over 10000", "rules:\n  a:\n    window: concurrent 1m\n    limit: 20000\n", "r.yaml:4: rules.a.limit: Rule.Limit: a Concurrent window keeps a lease per slot: at most 10000"},
		{"concurrent tier over 10000", "rules:\n  a:\n    window: concurrent 1m\n    tiers: {gold: 20000}\n", "r.yaml:4: rules.a.tiers.gold: Rule.Limit: a Concurrent window keeps a lease per slot"},
		{"concurrent rule in a group", "rules:\n  a: {window: fixed 1m, limit: 1}\n  b: {window: concurrent 1m, limit: 1}\ngroups:\n  g: {rules: [a, b]}\n", "r.yaml:5: groups.g.rules: b has a concurrent window: a group counts events all-or-nothing"},
		{"smooth without a burst", "rules:\n  a:\n    window: smooth 1s\n    limit: 1\n", `r.yaml:3: rules.a.window: want "smooth" followed by a period and a burst, like "smooth 1s burst 20"`},
		{"smooth bad period", "rules:\n  a:\n    window: smooth 0s burst 2\n    limit: 1\n", `r.yaml:3: rules.a.window: bad period "0s"`},
		{"smooth bad burst", "rules:\n  a:\n    window: smooth 1s burst 0\n    limit: 1\n", `r.yaml:3: rules.a.window: bad burst "0"`},
		{"smooth burst over 2^53", "rules:\n  a:\n    window: smooth 1s burst 9007199254740993\n    limit: 1\n", "r.yaml:3: rules.a.window: Rule.Window: smooth burst must be 1 to 2^53"},
		{"smooth faster than a microsecond", "rules:\n  a:\n    window: smooth 1s burst 5\n    limit: 2000000\n", "r.yaml:4: rules.a.limit: Rule.Limit: a Smooth window admits at most one event per microsecond"},
		{"smooth tier drains in over 100 years", "rules:\n  a:\n    window: smooth 365d burst 101\n    tiers: {free: 1, pro: 2}\n", "r.yaml:4: rules.a.tiers.free: Rule.Window: smooth burst 101 takes 101 intervals"},
		{"negative limit", "rules:\n  a:\n    window: fixed 1m\n    limit: -1\n", `r.yaml:4: rules.a.limit: want a whole number >= 0, got "-1"`},
		{"bad tier limit", "rules:\n  a:\n    window: fixed 1m\n    tiers:\n      gold: lots\n", `r.yaml:5: rules.a.tiers.gold: want a whole number >= 0, got "lots"`},
		{"bad block", "rules:\n  a:\n    window: fixed 1m\n    limit: 1\n    block: forever\n", `r.yaml:5: rules.a.block: want a positive duration`},
		{"missing window", "rules:\n  a:\n    limit: 1\n", "r.yaml:3: rules.a.window: missing"},
		{"missing limit", "rules:\n  a:\n    window: fixed 1m\n", "r.yaml:3: rules.a.limit: missing"},
		{"duplicate rule", "rules:\n  a: {window: fixed 1m, limit: 1}\n  a: {window: fixed 1m, limit: 2}\n", "r.yaml:3: rules.a: appears twice"},
		{"group of unknown rule", "rules:\n  a: {window: fixed 1m, limit: 1}\ngroups:\n  g: {rules: [a, b]}\n", `r.yaml:4: groups.g.rules: unknown rule "b"`},
		{"limit over 2^53", "rules:\n  a:\n    window: fixed 1m\n    limit: 9223372036854775807\n", "r.yaml:4: rules.a.limit: Rule.Limit: must be 0 to 2^53"},
		{"sliding tier over 10000", "rules:\n  a:\n    window: sliding 1m\n    tiers: {gold: 20000}\n", "r.yaml:4: rules.a.tiers.gold: Rule.Limit: a Sliding window logs every event"},
		{"window over 100 years", "rules:\n  a:\n    window: rolling 1000000h\n    limit: 1\n", "r.yaml:3: rules.a.window: Rule.Window: rolling duration must be 1µs to 100 years"},
		{"block over 100 years", "rules:\n  a:\n    window: fixed 1m\n    limit: 1\n    block: 2000000h\n", "r.yaml:5: rules.a.block: Rule.Block: must be 0 to 100 years"},
		{"NUL in use type", "rules:\n  a:\n    window: fixed 1m\n    limit: 1\n    use_type: \"x\\0y\"\n", "r.yaml:5: rules.a.use_type: UseType: holds a NUL byte"},
		{"use type over 512 bytes", "rules:\n  " + strings.Repeat("n", 600) + ":\n    window: fixed 1m\n    limit: 1\n", "UseType: is 600 bytes"},
		{"host time zone", "rules:\n  a:\n    window: calendar day Local\n    limit: 1\n", `r.yaml:3: rules.a.window: time zone "Local" depends on the host`},
		{"anchor in an unknown top-level field", "base: &b {window: fixed 1m}\nrules:\n  a:\n    <<: *b\n    limit: 1\n", "r.yaml:1: base: unknown field"},
		{"merge key in a rule", "rules:\n  a:\n    <<: {window: fixed 1m}\n    limit: 1\n", "r.yaml:3: rules.a.<<: merge keys are not supported"},
		{"second document", "rules:\n  a: {window: fixed 1m, limit: 1}\n---\nrules: {}\n", ": a second YAML document: a rule file holds one"},
		{"null rule name", "rules:\n  ~: {window: fixed 1m, limit: 1}\n", "r.yaml:2: rules.~: want a name"},
		{"group sharing a use type (line)", "rules:\n  a: {window: fixed 1m, limit: 1}\n  b: {window: fixed 1h, limit: 1, use_type: a}\ngroups:\n  g: {rules: [a, b]}\n", `r.yaml:5: groups.g.rules`},
		{"group sharing a use type", "rules:\n  a: {window: fixed 1m, limit: 1}\n  b: {window: fixed 1h, limit: 1, use_type: a}\ngroups:\n  g: {rules: [a, b]}\n", `share use type "a"`},
		{"group named like a rule", "rules:\n  a: {window: fixed 1m, limit: 1}\ngroups:\n  a: {rules: [a]}\n", "groups.a: a rule has the same name"},
		{"empty group", "rules:\n  a: {window: fixed 1m, limit: 1}\ngroups:\n  g: {rules: []}\n", "r.yaml:4: groups.g.rules: want a list"},
		{"group over MaxRules", "rules:\n  a: {window: fixed 1m, limit: 1}\ngroups:\n  g: {rules: [" + strings.TrimSuffix(strings.Repeat("a, ", expose.MaxRules+1), ", ") + "]}\n", "r.yaml:4: groups.g.rules: 65 rules, at most 64"},
		{"no rules", "groups: {}\n", "r.yaml: no rules"},
		{"not YAML", "rules: [\n", "r.yaml: yaml:"},
		{"empty", "", "r.yaml: no rules"},
	} {
		_, err := rulefile.Parse("r.yaml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  reports.export:\n    window: lifetime\n    limit: 3\n    use_type: export\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := rulefile.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := f.Resolve("reports.export", "")
	if err != nil || rs[0].UseType != "export" || rs[0].Limit != 3 || rs[0].Window.String() != "lifetime" {
		t.Fatalf("Resolve = %+v, %v", rs, err)
	}
	if _, err := rulefile.Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"90s": 90 * time.Second, "7d": 7 * 24 * time.Hour, "1h30m": 90 * time.Minute} {
		if got, err := rulefile.ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "-1d", "1.5d", "abc"} {
		if _, err := rulefile.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q): no error", in)
		}
	}
}

func TestConcurrentWindow(t *testing.T) {
	f, err := rulefile.Parse("r.yaml", []byte(`
rules:
  export.running:
    window: concurrent 10m
    limit: 3
  upload: {window: concurrent 1h30m, tiers: {free: 1, pro: 4}, block: 1m}
  day: {window: concurrent 2d, limit: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, tier string
		want       countlimit.Rule
		text       string
	}{
		{"export.running", "", countlimit.Rule{UseType: "export.running", Limit: 3, Window: countlimit.Concurrent(10 * time.Minute)}, "concurrent 10m"},
		{"upload", "pro", countlimit.Rule{UseType: "upload", Limit: 4, Window: countlimit.Concurrent(90 * time.Minute), Block: time.Minute}, "concurrent 1h30m"},
		{"day", "", countlimit.Rule{UseType: "day", Window: countlimit.Concurrent(48 * time.Hour)}, "concurrent 2d"},
	} {
		rs, err := f.Resolve(tc.name, tc.tier)
		if err != nil || len(rs) != 1 {
			t.Fatalf("Resolve(%q, %q) = %+v, %v", tc.name, tc.tier, rs, err)
		}
		g := rs[0]
		if g.UseType != tc.want.UseType || g.Limit != tc.want.Limit || g.Block != tc.want.Block || g.Window != tc.want.Window || !expose.WindowOf(g.Window).Concurrent {
			t.Errorf("Resolve(%q, %q) = %+v (%v), want %+v (%v)", tc.name, tc.tier, g, g.Window, tc.want, tc.want.Window)
		}
		if got := f.Rules[tc.name].WindowText; got != tc.text {
			t.Errorf("%s: WindowText = %q, want %q", tc.name, got, tc.text)
		}
	}
	if w, err := rulefile.ParseWindow("concurrent 10m"); err != nil || w.String() != "concurrent 10m0s" {
		t.Errorf("ParseWindow(concurrent 10m) = %v, %v", w, err)
	}
}

func TestTiersInGroupsAndAliases(t *testing.T) {
	f, err := rulefile.Parse("r.yaml", []byte(`
rules:
  post: {window: fixed 1h, tiers: {bronze: 3, gold: 8}}
  conv: {window: fixed 1h, limit: 10}
  api:
    window: &minute fixed 1m
    limit: 5
  api2:
    window: *minute
    limit: 6
groups:
  both: {rules: [post, conv]}
`))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := f.Resolve("both", "gold")
	if err != nil || rs[0].Limit != 8 || rs[1].Limit != 10 {
		t.Errorf("Resolve(both, gold) = %+v, %v; want 8 and conv's own 10", rs, err)
	}
	if _, err := f.Resolve("both", ""); !errors.Is(err, rulefile.ErrTier) {
		t.Errorf("Resolve(both, \"\") = %v; want ErrTier (post has no limit without a tier)", err)
	}
	if rs, err := f.Resolve("conv", "gold"); err != nil || rs[0].Limit != 10 {
		t.Errorf("a rule without tiers ignores the tier: %+v, %v", rs, err)
	}
	if rs, err := f.Resolve("api2", ""); err != nil || rs[0].Window.String() != "fixed 1m0s" {
		t.Errorf("an aliased window: %+v, %v", rs, err)
	}
	rs, err = f.ResolveUseTypes("both")
	if err != nil || len(rs) != 2 || rs[0].UseType != "post" || rs[1].UseType != "conv" {
		t.Errorf("ResolveUseTypes(both) = %+v, %v", rs, err)
	}
	if _, err := f.ResolveUseTypes("nope"); !errors.Is(err, rulefile.ErrUnknown) {
		t.Errorf("ResolveUseTypes(nope) = %v", err)
	}
}

// TestSmoothWindow: "smooth 1s burst 20" is Smooth(time.Second, 20), as
// the window's String writes it, with a limit or tiers, and in a group
// beside other kinds.
func TestSmoothWindow(t *testing.T) {
	f, err := rulefile.Parse("r.yaml", []byte(`
rules:
  api.calls:
    window: smooth 1s burst 20
    limit: 10
  uploads: {window: smooth 1h burst 5, tiers: {free: 2, pro: 20}, block: 10m}
  api.daily: {window: calendar day, limit: 10000}
groups:
  api: {rules: [api.calls, api.daily]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, tier string
		want       countlimit.Rule
	}{
		{"api.calls", "", countlimit.Rule{UseType: "api.calls", Limit: 10, Window: countlimit.Smooth(time.Second, 20)}},
		{"uploads", "pro", countlimit.Rule{UseType: "uploads", Limit: 20, Window: countlimit.Smooth(time.Hour, 5), Block: 10 * time.Minute}},
	} {
		rs, err := f.Resolve(tc.name, tc.tier)
		if err != nil || len(rs) != 1 || rs[0] != tc.want {
			t.Errorf("Resolve(%q, %q) = %+v, %v; want %+v", tc.name, tc.tier, rs, err, tc.want)
		}
	}
	if rs, err := f.Resolve("api", ""); err != nil || len(rs) != 2 || !expose.WindowOf(rs[0].Window).Smooth {
		t.Errorf("Resolve(api) = %+v, %v; want the smooth rule and the daily one", rs, err)
	}
	for _, text := range []string{"smooth 1s burst 20", "smooth 1m30s burst 1"} {
		w, err := rulefile.ParseWindow(text)
		if err != nil || w.String() != text {
			t.Errorf("ParseWindow(%q) = %v, %v; want it back", text, w, err)
		}
	}
}
