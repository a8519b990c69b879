package countlimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// untouchable is a Store that fails the test when called.
type untouchable struct{ t *testing.T }

func (u untouchable) Do(context.Context, *driver.Request) error {
	u.t.Helper()
	u.t.Error("an invalid call reached the store")
	return nil
}

// TestInvalidInput: every bad argument is ErrInvalid naming its field, and
// never reaches the store (its Do fails the test).
func TestInvalidInput(t *testing.T) {
	l := countlimit.New(untouchable{t})
	ctx := context.Background()
	ut := countlimit.UseType("invalid")
	good := countlimit.Rule{UseType: ut, Limit: 5, Window: countlimit.Fixed(time.Hour)}
	with := func(f func(*countlimit.Rule)) countlimit.Rule { r := good; f(&r); return r }
	allowWith := func(r countlimit.Rule, id string, n int64) func() error {
		return func() error { _, err := l.AllowN(ctx, r, id, n); return err }
	}
	cases := []struct {
		name  string
		call  func() error
		field string
	}{
		{"empty UseType", allowWith(with(func(r *countlimit.Rule) { r.UseType = "" }), "id", 1), "UseType"},
		{"NUL in UseType", allowWith(with(func(r *countlimit.Rule) { r.UseType += "\x00" }), "id", 1), "UseType"},
		{"empty id", allowWith(good, "", 1), "id"},
		{"id over 512 bytes", allowWith(good, strings.Repeat("x", expose.MaxIDLen+1), 1), "id"},
		{"id not UTF-8", allowWith(good, "user\xff", 1), "id"},
		{"NUL in id", allowWith(good, "a\x00b", 1), "id"},
		{"negative Limit", allowWith(with(func(r *countlimit.Rule) { r.Limit = -1 }), "id", 1), "Limit"},
		{"zero Window", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Window{} }), "id", 1), "Window"},
		{"Rolling(0)", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Rolling(0) }), "id", 1), "Window"},
		{"Fixed(-1s)", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Fixed(-time.Second) }), "id", 1), "Window"},
		{"Sliding(0)", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Sliding(0) }), "id", 1), "Window"},
		{"Calendar nil location", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Calendar(countlimit.Day, nil) }), "id", 1), "Window"},
		{"Calendar bad unit", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Calendar(countlimit.Unit(9), time.UTC) }), "id", 1), "Window"},
		{"negative Block", allowWith(with(func(r *countlimit.Rule) { r.Block = -time.Second }), "id", 1), "Block"},
		{"Block over 100 years", allowWith(with(func(r *countlimit.Rule) { r.Block = expose.MaxDuration + 1 }), "id", 1), "Block"},
		{"Rolling over 100 years", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Rolling(expose.MaxDuration + 1) }), "id", 1), "Window"},
		{"Limit over 2^53", allowWith(with(func(r *countlimit.Rule) { r.Limit = expose.MaxLimit + 1 }), "id", 1), "Limit"},
		{"Sliding Limit over 10000", allowWith(with(func(r *countlimit.Rule) {
			r.Window, r.Limit = countlimit.Sliding(time.Minute), expose.MaxSlidingLimit+1
		}), "id", 1), "Limit"},
		{"Smooth period 0", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Smooth(0, 5) }), "id", 1), "Window"},
		{"Smooth period over 100 years", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Smooth(expose.MaxDuration+1, 5) }), "id", 1), "Window"},
		{"Smooth burst 0", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Smooth(time.Second, 0) }), "id", 1), "Window"},
		{"Smooth burst over 2^53", allowWith(with(func(r *countlimit.Rule) { r.Window = countlimit.Smooth(time.Second, expose.MaxLimit+1) }), "id", 1), "Window"},
		{"Smooth faster than one a microsecond", allowWith(with(func(r *countlimit.Rule) {
			r.Window, r.Limit = countlimit.Smooth(time.Second, 5), 1_000_001
		}), "id", 1), "Limit"},
		{"Smooth burst drained in over 100 years", allowWith(with(func(r *countlimit.Rule) {
			r.Window, r.Limit = countlimit.Smooth(365*24*time.Hour, 101), 1
		}), "id", 1), "Window"},
		{"Smooth in AllowAll", func() error {
			_, err := l.AllowAll(ctx, "id", good, with(func(r *countlimit.Rule) { r.UseType += ".2"; r.Window = countlimit.Smooth(time.Second, -1) }))
			return err
		}, "Window"},
		{"AllowN n over 2^53", allowWith(good, "id", expose.MaxLimit+1), "n"},
		{"AllowN n=0", allowWith(good, "id", 0), "n"},
		{"AllowN n=-3", allowWith(good, "id", -3), "n"},
		{"Refund n=0", func() error { _, err := l.Refund(ctx, good, "id", 0); return err }, "n"},
		{"Peek empty id", func() error { _, err := l.Peek(ctx, good, ""); return err }, "id"},
		{"Reset empty id", func() error { return l.Reset(ctx, good, "") }, "id"},
		{"AllowAll no rules", func() error { _, err := l.AllowAll(ctx, "id"); return err }, "rules"},
		{"AllowAll same UseType twice", func() error { _, err := l.AllowAll(ctx, "id", good, good); return err }, "rules[1].UseType"},
		{"AllowAll one bad rule", func() error {
			_, err := l.AllowAll(ctx, "id", good, with(func(r *countlimit.Rule) { r.UseType += ".2"; r.Limit = -1 }))
			return err
		}, "Limit"},
		{"CheckLimit duration 0", func() error { _, err := l.CheckLimit(ctx, ut, "id", 1, 0, time.Time{}); return err }, "duration"},
		{"CheckLimit duration over 100 years", func() error {
			_, err := l.CheckLimit(ctx, ut, "id", 1, expose.MaxDuration+1, time.Time{})
			return err
		}, "duration"},
		{"CheckLimit negative limit", func() error { _, err := l.CheckLimit(ctx, ut, "id", -1, time.Hour, time.Time{}); return err }, "limit"},
		{"CheckLimit empty id", func() error { _, err := l.CheckLimit(ctx, ut, "", 1, time.Hour, time.Time{}); return err }, "id"},
	}
	for _, c := range cases {
		err := c.call()
		if !errors.Is(err, countlimit.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", c.name, err)
			continue
		}
		if errors.Is(err, countlimit.ErrUnavailable) {
			t.Errorf("%s: err = %v is also ErrUnavailable", c.name, err)
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %q does not name the field %q", c.name, err, c.field)
		}
	}
}
