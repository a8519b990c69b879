package countlimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// FuzzValidation feeds arbitrary keys, limits and weights to AllowN: bad
// input must fail with ErrInvalid and write nothing; good input must not.
func FuzzValidation(f *testing.F) {
	f.Add("sms.code", "18500000000", int64(2), int64(1), int64(time.Minute))
	f.Add("", "id", int64(1), int64(1), int64(time.Second))
	f.Add("ut", "a\x00b", int64(1), int64(1), int64(time.Second))
	f.Add("ut", "\xff\xfe", int64(1), int64(1), int64(time.Second))
	f.Add("ut", strings.Repeat("x", 513), int64(1), int64(1), int64(time.Second))
	f.Add("ut", "id", int64(-1), int64(1), int64(time.Second))
	f.Add("ut", "id", int64(1), int64(0), int64(time.Second))
	f.Add("ut", "id", int64(1), int64(1), int64(0))
	f.Add("ut", "id", int64(1)<<60, int64(1), int64(time.Second))
	f.Add("ut", "id", int64(expose.MaxLimit), int64(expose.MaxLimit)+1, int64(time.Second))
	f.Add("ut", "id", int64(1), int64(1), int64(expose.MaxDuration)+1)
	f.Fuzz(func(t *testing.T, ut, id string, limit, n, d int64) {
		s := memstore.New(memstore.WithJanitorInterval(0))
		l := countlimit.New(s, countlimit.WithClock(func() time.Time { return time.Unix(1700000000, 0) }))
		rule := countlimit.Rule{UseType: countlimit.UseType(ut), Limit: limit, Window: countlimit.Rolling(time.Duration(d))}
		res, err := l.AllowN(context.Background(), rule, id, n)
		valid := func(s string) bool {
			return s != "" && len(s) <= expose.MaxIDLen && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
		}
		// The bounds, from the exported constants, not from the code under test.
		wantOK := valid(ut) && valid(id) &&
			limit >= 0 && limit <= expose.MaxLimit &&
			n >= 1 && n <= expose.MaxLimit &&
			d >= int64(time.Microsecond) && d <= int64(expose.MaxDuration)
		switch {
		case wantOK && err != nil:
			t.Fatalf("AllowN(%q, %q, limit %d, n %d, d %d) = %v, want no error", ut, id, limit, n, d, err)
		case !wantOK && !errors.Is(err, countlimit.ErrInvalid):
			t.Fatalf("AllowN(%q, %q, limit %d, n %d, d %d) = %+v, %v; want ErrInvalid", ut, id, limit, n, d, res, err)
		case !wantOK && (s.Len() != 0 || res != countlimit.Result{}):
			t.Fatalf("invalid call wrote state (Len %d) or returned %+v", s.Len(), res)
		case wantOK && res.Allowed != (n <= limit):
			t.Fatalf("first AllowN(n %d) with limit %d: Allowed = %v", n, limit, res.Allowed)
		}
	})
}

func TestNewPanicsOnNilStore(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("New(nil) did not panic")
		}
	}()
	countlimit.New(nil)
}

// failing is a Store whose every call fails with a given error.
type failing struct{ err error }

func (f failing) Do(context.Context, *driver.Request) error { return f.err }

func TestStoreErrorsAreUnavailable(t *testing.T) {
	cause := errors.New("disk on fire")
	l := countlimit.New(failing{cause})
	rule := countlimit.Rule{UseType: "x", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	ctx := context.Background()
	check := func(name string, res any, err error) {
		t.Helper()
		if !errors.Is(err, countlimit.ErrUnavailable) || !errors.Is(err, cause) {
			t.Errorf("%s: err = %v, want ErrUnavailable wrapping the cause", name, err)
		}
		if !strings.Contains(err.Error(), `"x"`) {
			t.Errorf("%s: error %q does not name the use type", name, err)
		}
		switch r := res.(type) {
		case countlimit.Result:
			if r != (countlimit.Result{}) {
				t.Errorf("%s: Result = %+v on error, want zero", name, r)
			}
		case bool:
			if r {
				t.Errorf("%s: true on error", name)
			}
		}
	}
	r, err := l.Allow(ctx, rule, "id")
	check("Allow", r, err)
	r, err = l.Peek(ctx, rule, "id")
	check("Peek", r, err)
	r, err = l.Refund(ctx, rule, "id", 1)
	check("Refund", r, err)
	rs, err := l.AllowAll(ctx, "id", rule)
	check("AllowAll", nil, err)
	if rs != nil {
		t.Errorf("AllowAll results on error: %v", rs)
	}
	ok, err := l.CheckLimit(ctx, "x", "id", 1, time.Hour, time.Time{})
	check("CheckLimit", ok, err)
	check("Reset", nil, l.Reset(ctx, rule, "id"))
}
