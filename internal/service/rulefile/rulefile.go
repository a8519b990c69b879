// Package rulefile reads the YAML rule files of the countlimit command: named
// rules (window, limit or per-tier limits, penalty) and named groups of rules
// checked all-or-nothing. Errors name the file, the line and the field.
package rulefile

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"gopkg.in/yaml.v3"

	"github.com/countlimit/countlimit/countlimit"
)

//go:embed default.yaml
var defaultYAML []byte

// DefaultName is how the built-in file is named in messages.
const DefaultName = "(built-in rules)"

// Rule is one named rule of a file.
type Rule struct {
	Name        string
	Description string
	UseType     countlimit.UseType
	Window      countlimit.Window
	WindowText  string
	// Limit applies when a request names no tier; nil means a tier is required.
	Limit *int64
	Tiers map[string]int64
	Block time.Duration
}

// Group is a named set of rules checked all-or-nothing. It holds no rule
// with a concurrent window: Parse refuses one.
type Group struct {
	Name        string
	Description string
	Rules       []string
	line        int
}

// File is a parsed rule file. Its zero value holds no rules.
type File struct {
	Name   string
	Rules  map[string]*Rule
	Groups map[string]*Group
	order  []string // rule and group names, in file order
}

// ErrUnknown is wrapped by Resolve for a name that is neither rule nor group.
var ErrUnknown = errors.New("unknown rule")

// ErrTier is wrapped by Resolve when the tier is unknown or required.
var ErrTier = errors.New("bad tier")

// Default returns the built-in example rules, the file "countlimit rules
// default" prints: SMS codes, password changes, article pins, API calls and
// posts by tier, logins with a penalty box, exports running at once, and a
// group that limits new conversations per hour AND per day. It panics if they do not parse, which
// a test rules out.
func Default() *File {
	f, err := Parse(DefaultName, defaultYAML)
	if err != nil {
		panic("rulefile: built-in rules: " + err.Error())
	}
	return f
}

// DefaultYAML returns the text of the built-in rules.
func DefaultYAML() []byte { return append([]byte(nil), defaultYAML...) }

// Load reads and parses the file at path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses a rule file; name is used in error messages.
func Parse(name string, data []byte) (*File, error) {
	p := &parser{name: name}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s:%d: a second YAML document: a rule file holds one", name, extra.Line)
	}
	f := &File{Name: name, Rules: map[string]*Rule{}, Groups: map[string]*Group{}}
	if len(root.Content) == 0 {
		return nil, fmt.Errorf("%s: no rules", name)
	}
	doc := root.Content[0]
	if err := p.mapping(doc, "", func(key string, v *yaml.Node) error {
		switch key {
		case "rules":
			return p.mapping(v, "rules", func(rn string, rv *yaml.Node) error {
				r, err := p.rule(rn, rv)
				if err != nil {
					return err
				}
				f.Rules[rn] = r
				f.order = append(f.order, rn)
				return nil
			})
		case "groups":
			return p.mapping(v, "groups", func(gn string, gv *yaml.Node) error {
				g, err := p.group(gn, gv)
				if err != nil {
					return err
				}
				f.Groups[gn] = g
				f.order = append(f.order, gn)
				return nil
			})
		}
		return p.errf(v, key, "unknown field (want rules or groups)")
	}); err != nil {
		return nil, err
	}
	if len(f.Rules) == 0 {
		return nil, fmt.Errorf("%s: no rules", name)
	}
	for _, n := range f.order {
		g, ok := f.Groups[n]
		if !ok {
			continue
		}
		if _, clash := f.Rules[n]; clash {
			return nil, fmt.Errorf("%s:%d: groups.%s: a rule has the same name", name, g.line, n)
		}
		seen := map[countlimit.UseType]string{}
		for _, rn := range g.Rules {
			r, ok := f.Rules[rn]
			if !ok {
				return nil, fmt.Errorf("%s:%d: groups.%s.rules: unknown rule %q", name, g.line, n, rn)
			}
			if expose.WindowOf(r.Window).Concurrent {
				return nil, fmt.Errorf("%s:%d: groups.%s.rules: %s has a concurrent window: a group counts events all-or-nothing, while a concurrent rule holds slots, taken one rule at a time with acquire", name, g.line, n, rn)
			}
			if other, dup := seen[r.UseType]; dup {
				return nil, fmt.Errorf("%s:%d: groups.%s.rules: %s and %s share use type %q", name, g.line, n, other, rn, r.UseType)
			}
			seen[r.UseType] = rn
		}
	}
	return f, nil
}

// Names returns the names of the rules and groups, in file order.
func (f *File) Names() []string { return append([]string(nil), f.order...) }

// Members returns the rule names that name stands for: the group's rules,
// or name itself.
func (f *File) Members(name string) []string {
	if g, ok := f.Groups[name]; ok {
		return append([]string(nil), g.Rules...)
	}
	return []string{name}
}

// Resolve returns the countlimit rules that name (a rule or a group) stands
// for, with limits for tier ("" for none). A rule without tiers has one
// limit, whatever the tier; a rule with tiers needs a tier it knows, or a
// limit for requests that name none.
func (f *File) Resolve(name, tier string) ([]countlimit.Rule, error) {
	if r, ok := f.Rules[name]; ok {
		cr, err := r.resolve(tier)
		if err != nil {
			return nil, err
		}
		return []countlimit.Rule{cr}, nil
	}
	g, ok := f.Groups[name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	out := make([]countlimit.Rule, 0, len(g.Rules))
	for _, rn := range g.Rules {
		cr, err := f.Rules[rn].resolve(tier)
		if err != nil {
			return nil, err
		}
		out = append(out, cr)
	}
	return out, nil
}

// ResolveUseTypes is Resolve without limits, for Reset, which needs no
// tier: the rules carry their UseType and Window, and Limit 0.
func (f *File) ResolveUseTypes(name string) ([]countlimit.Rule, error) {
	if _, ok := f.Rules[name]; !ok && f.Groups[name] == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	var out []countlimit.Rule
	for _, rn := range f.Members(name) {
		r := f.Rules[rn]
		out = append(out, countlimit.Rule{UseType: r.UseType, Window: r.Window, Block: r.Block})
	}
	return out, nil
}

func (r *Rule) resolve(tier string) (countlimit.Rule, error) {
	cr := countlimit.Rule{UseType: r.UseType, Window: r.Window, Block: r.Block}
	switch {
	case len(r.Tiers) == 0 || (tier == "" && r.Limit != nil):
		cr.Limit = *r.Limit
	case tier == "":
		return cr, fmt.Errorf("%w: rule %s needs a tier (one of %s)", ErrTier, r.Name, strings.Join(r.TierNames(), ", "))
	default:
		l, ok := r.Tiers[tier]
		if !ok {
			return cr, fmt.Errorf("%w: rule %s has no tier %q (one of %s)", ErrTier, r.Name, tier, strings.Join(r.TierNames(), ", "))
		}
		cr.Limit = l
	}
	return cr, nil
}

// TierNames returns the rule's tiers, sorted.
func (r *Rule) TierNames() []string {
	names := make([]string, 0, len(r.Tiers))
	for t := range r.Tiers {
		names = append(names, t)
	}
	sort.Strings(names)
	return names
}

type parser struct{ name string }

func (p *parser) errf(n *yaml.Node, field, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s: %s", p.name, n.Line, field, fmt.Sprintf(format, args...))
}

// mapping calls f for each key of a mapping node, in order, following
// YAML aliases.
func (p *parser) mapping(n *yaml.Node, field string, f func(key string, v *yaml.Node) error) error {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		if field == "" {
			field = "(top level)"
		}
		return p.errf(n, field, "want a mapping")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		full := k.Value
		if field != "" {
			full = field + "." + k.Value
		}
		if k.Value == "<<" {
			return p.errf(k, full, "merge keys are not supported: write the fields out")
		}
		if k.Kind != yaml.ScalarNode || k.Tag == "!!null" || strings.TrimSpace(k.Value) == "" {
			return p.errf(k, full, "want a name")
		}
		if seen[k.Value] {
			return p.errf(k, full, "appears twice")
		}
		seen[k.Value] = true
		if err := f(k.Value, deref(n.Content[i+1])); err != nil {
			return err
		}
	}
	return nil
}

// deref follows a YAML alias to the node it names.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func (p *parser) rule(name string, n *yaml.Node) (*Rule, error) {
	at := "rules." + name
	r := &Rule{Name: name, UseType: countlimit.UseType(name)}
	var sawWindow bool
	limitAt := map[string]*yaml.Node{} // field -> node, checked once the window is known
	// valid checks one part of the rule as the library will, so a bad rule
	// fails here rather than on every check.
	valid := func(v *yaml.Node, field string, cr countlimit.Rule) error {
		if err := cr.Validate(); err != nil {
			return p.errf(v, field, "%s", strings.TrimPrefix(err.Error(), "invalid argument: "))
		}
		return nil
	}
	err := p.mapping(n, at, func(key string, v *yaml.Node) error {
		field := at + "." + key
		switch key {
		case "description":
			return p.str(v, field, &r.Description)
		case "use_type":
			var s string
			if err := p.str(v, field, &s); err != nil {
				return err
			}
			r.UseType = countlimit.UseType(s)
			return valid(v, field, countlimit.Rule{UseType: r.UseType, Window: countlimit.Lifetime()})
		case "window":
			if err := p.str(v, field, &r.WindowText); err != nil {
				return err
			}
			w, err := ParseWindow(r.WindowText)
			if err != nil {
				return p.errf(v, field, "%v", err)
			}
			r.Window, sawWindow = w, true
			return valid(v, field, countlimit.Rule{UseType: "x", Window: w, Limit: anyLimit(w)})
		case "limit":
			l, err := p.limit(v, field)
			if err != nil {
				return err
			}
			r.Limit = &l
			limitAt[field] = v
		case "tiers":
			r.Tiers = map[string]int64{}
			return p.mapping(v, field, func(tier string, tv *yaml.Node) error {
				l, err := p.limit(tv, field+"."+tier)
				r.Tiers[tier] = l
				limitAt[field+"."+tier] = tv
				return err
			})
		case "block":
			var s string
			if err := p.str(v, field, &s); err != nil {
				return err
			}
			d, err := ParseDuration(s)
			if err != nil || d <= 0 {
				return p.errf(v, field, "want a positive duration like 30m, got %q", s)
			}
			r.Block = d
			return valid(v, field, countlimit.Rule{UseType: "x", Window: countlimit.Lifetime(), Block: d})
		default:
			return p.errf(v, field, "unknown field (want description, use_type, window, limit, tiers or block)")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !sawWindow {
		return nil, p.errf(n, at+".window", "missing")
	}
	if r.Limit == nil && len(r.Tiers) == 0 {
		return nil, p.errf(n, at+".limit", "missing: give a limit, tiers, or both")
	}
	if err := valid(n, at, countlimit.Rule{UseType: r.UseType, Window: r.Window, Limit: anyLimit(r.Window)}); err != nil {
		return nil, err // a name too long or odd to be a use type
	}
	if r.Limit != nil {
		if err := valid(limitAt[at+".limit"], at+".limit", countlimit.Rule{UseType: r.UseType, Limit: *r.Limit, Window: r.Window}); err != nil {
			return nil, err
		}
	}
	for _, tier := range r.TierNames() {
		field := at + ".tiers." + tier
		if err := valid(limitAt[field], field, countlimit.Rule{UseType: r.UseType, Limit: r.Tiers[tier], Window: r.Window}); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// anyLimit is a limit that w takes whatever else it holds, for checking w
// before the rule's limits are known: 0, or for a smooth window the
// fastest rate its period allows (what depends on the limit is checked
// with each limit).
func anyLimit(w countlimit.Window) int64 {
	if expose.WindowOf(w).Smooth {
		return int64(expose.WindowOf(w).Duration / time.Microsecond)
	}
	return 0
}

func (p *parser) group(name string, n *yaml.Node) (*Group, error) {
	at := "groups." + name
	g := &Group{Name: name, line: n.Line}
	err := p.mapping(n, at, func(key string, v *yaml.Node) error {
		field := at + "." + key
		switch key {
		case "description":
			return p.str(v, field, &g.Description)
		case "rules":
			if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
				return p.errf(v, field, "want a list of rule names")
			}
			for _, item := range v.Content {
				var s string
				if err := p.str(item, field, &s); err != nil {
					return err
				}
				g.Rules = append(g.Rules, s)
			}
			return nil
		}
		return p.errf(v, field, "unknown field (want description or rules)")
	})
	if err != nil {
		return nil, err
	}
	if len(g.Rules) == 0 {
		return nil, p.errf(n, at+".rules", "missing")
	}
	if len(g.Rules) > expose.MaxRules {
		return nil, p.errf(n, at+".rules", "%d rules, at most %d (one AllowAll call takes expose.MaxRules)", len(g.Rules), expose.MaxRules)
	}
	return g, nil
}

func (p *parser) str(n *yaml.Node, field string, out *string) error {
	if n.Kind != yaml.ScalarNode {
		return p.errf(n, field, "want a string")
	}
	*out = n.Value
	return nil
}

func (p *parser) limit(n *yaml.Node, field string) (int64, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, p.errf(n, field, "want a whole number")
	}
	l, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil || l < 0 {
		return 0, p.errf(n, field, "want a whole number >= 0, got %q", n.Value)
	}
	return l, nil
}

// ParseWindow parses "rolling 5m", "fixed 1h", "sliding 30s",
// "calendar day|week|month|year [Time/Zone]" (default UTC), "lifetime",
// "concurrent 10m": at most limit held at once, each slot a lease that frees
// itself 10m after it was taken or last extended, or "smooth 1s burst 20":
// limit per 1s, evenly, with bursts of up to 20 (countlimit.Smooth), as
// the window's String writes it.
func ParseWindow(s string) (countlimit.Window, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return countlimit.Window{}, errors.New("empty window")
	}
	dur := func() (time.Duration, error) {
		if len(f) != 2 {
			return 0, fmt.Errorf("want %q followed by a duration, like \"%s 5m\"", f[0], f[0])
		}
		d, err := ParseDuration(f[1])
		if err != nil || d < time.Microsecond {
			return 0, fmt.Errorf("bad duration %q: want a positive Go duration (90s, 15m, 1h) or days (7d)", f[1])
		}
		return d, nil
	}
	switch f[0] {
	case "rolling":
		d, err := dur()
		return countlimit.Rolling(d), err
	case "fixed":
		d, err := dur()
		return countlimit.Fixed(d), err
	case "sliding":
		d, err := dur()
		return countlimit.Sliding(d), err
	case "concurrent":
		d, err := dur()
		return countlimit.Concurrent(d), err
	case "smooth":
		if len(f) != 4 || f[2] != "burst" {
			return countlimit.Window{}, errors.New(`want "smooth" followed by a period and a burst, like "smooth 1s burst 20"`)
		}
		d, err := ParseDuration(f[1])
		if err != nil || d < time.Microsecond {
			return countlimit.Window{}, fmt.Errorf("bad period %q: want a positive Go duration (1s, 15m, 1h) or days (7d)", f[1])
		}
		b, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil || b < 1 {
			return countlimit.Window{}, fmt.Errorf("bad burst %q: want a whole number >= 1", f[3])
		}
		return countlimit.Smooth(d, b), nil
	case "lifetime":
		if len(f) != 1 {
			return countlimit.Window{}, errors.New("lifetime takes nothing after it")
		}
		return countlimit.Lifetime(), nil
	case "calendar":
		if len(f) < 2 || len(f) > 3 {
			return countlimit.Window{}, errors.New(`want "calendar day|week|month|year [Time/Zone]"`)
		}
		units := map[string]countlimit.Unit{"day": countlimit.Day, "week": countlimit.Week, "month": countlimit.Month, "year": countlimit.Year}
		u, ok := units[f[1]]
		if !ok {
			return countlimit.Window{}, fmt.Errorf("unknown calendar unit %q: want day, week, month or year", f[1])
		}
		loc := time.UTC
		if len(f) == 3 {
			if f[2] == "Local" {
				return countlimit.Window{}, errors.New(`time zone "Local" depends on the host: name an IANA zone like Asia/Shanghai`)
			}
			var err error
			if loc, err = time.LoadLocation(f[2]); err != nil {
				return countlimit.Window{}, fmt.Errorf("unknown time zone %q", f[2])
			}
		}
		return countlimit.Calendar(u, loc), nil
	}
	return countlimit.Window{}, fmt.Errorf("unknown window kind %q: want rolling, fixed, sliding, calendar, lifetime, concurrent or smooth", f[0])
}

// ParseDuration is time.ParseDuration that also takes whole days: "7d".
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n < 0 || n > 100*366 {
			return 0, fmt.Errorf("bad number of days %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}
