package countlimit

import (
	"fmt"
	"math/bits"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/countlimit/countlimit/internal/expose"
)

// UseType names what is limited, e.g. "password.change" or "sms.code". One
// UseType is one counter per id.
type UseType string

// Rule is a limit: at most Limit events of UseType per Window for each id.
// Rules are plain values; the Limiter and its store keep no configuration, so
// a changed Limit applies at once to the current window.
//
// A use type keeps one count per id, whatever kind of Window asks, so that
// a rule changed across a fleet one process at a time (or two handlers that
// disagree) never starts an id from zero: what one kind counted, the other
// carries over until the window that holds it ends. A window an id is
// counting in stays current until it ends (a Lifetime window never does:
// Reset the id), and a rule of another kind that counts in windows (Fixed,
// Rolling, Calendar, Lifetime) joins it; so it joins a Sliding log's window
// (oldest event to newest plus the span) and a Smooth id's (until it is
// drained), counting what they held. A rule changed to Sliding sees that
// count as events that leave its log when that window ends (or a span from
// now, when sooner), a rule changed to Smooth as that many units taken now
// (a full burst at the most). Either waits for that window's end when the
// count leaves no room, and says so in RetryAfter. Within a window of
// either rule, an id is so allowed at most the larger of the two limits,
// whichever order the calls of two rules come in. A Concurrent window's
// leases are apart from counts: a rule changed to or from Concurrent
// starts from none.
type Rule struct {
	UseType UseType
	// Limit is how many events a window allows; for a Smooth window, how
	// many per its period, evenly (the rate; its burst is the window's).
	// 0 allows none.
	Limit  int64
	Window Window
	// Block, when positive, is a penalty box: a denial puts the id in it for
	// Block, and every call is denied until it ends, even after the window
	// resets. Denials during the penalty do not extend it. Reset clears it.
	Block time.Duration
}

// Validate reports why r cannot be used, as every Limiter method would: an
// error wrapping ErrInvalid that names the field, or nil. Configuration
// loaders call it so a bad rule fails at load time, not on every check.
func (r Rule) Validate() error {
	if err := validateName(string(r.UseType)); err != "" {
		return invalidf("UseType", "%s", err)
	}
	return validateLimits(&r)
}

func validate(r *Rule, id string, n int64) error {
	if !plain(string(r.UseType)) || !plain(id) {
		if err := validateKey(r.UseType, id); err != nil {
			return err
		}
	}
	if err := validateLimits(r); err != nil {
		return err
	}
	if n < 1 || n > expose.MaxLimit {
		return invalidf("n", "must be 1 to 2^53, got %d", n)
	}
	return nil
}

func validateLimits(r *Rule) error {
	if r.Limit < 0 || r.Limit > expose.MaxLimit {
		return invalidf("Rule.Limit", "must be 0 to 2^53, got %d", r.Limit)
	}
	if err := r.Window.validate(); err != nil {
		return err
	}
	if r.Window.kind == kindSliding && r.Limit > expose.MaxSlidingLimit {
		return invalidf("Rule.Limit", "a Sliding window logs every event: at most %d, got %d (use Fixed or Rolling for more)", expose.MaxSlidingLimit, r.Limit)
	}
	if r.Window.kind == kindSmooth {
		if err := validateSmooth(r); err != nil {
			return err
		}
	}
	if r.Window.kind == kindConcurrent && r.Limit > expose.MaxConcurrentLimit {
		return invalidf("Rule.Limit", "a Concurrent window keeps a lease per slot: at most %d, got %d", expose.MaxConcurrentLimit, r.Limit)
	}
	if r.Block < 0 || r.Block > expose.MaxDuration {
		return invalidf("Rule.Block", "must be 0 to 100 years, got %v", r.Block)
	}
	return nil
}

// validateSmooth holds a Smooth rule to what every store computes
// exactly: at most one event per microsecond (the interval is rounded up
// to it, and a faster rate would be silently slowed), and a whole burst
// drained within 100 years, so that every time a store compares stays
// under 2^53 microseconds.
func validateSmooth(r *Rule) error {
	w := r.Window
	// period/Limit < 1µs, without a division: Limit*1000 <= 2^53*1000
	// does not overflow.
	if int64(w.d) < r.Limit*int64(time.Microsecond) {
		return invalidf("Rule.Limit", "a Smooth window admits at most one event per microsecond: %d per %v is more", r.Limit, w.d)
	}
	t := interval(w.d, r.Limit)
	if hi, lo := bits.Mul64(uint64(w.burst), uint64(t/time.Microsecond)); hi != 0 || lo > uint64(expose.MaxDuration/time.Microsecond) {
		return invalidf("Rule.Window", "smooth burst %d takes %d intervals of %v to drain, more than 100 years", w.burst, w.burst, t)
	}
	r.Window.iv = t
	return nil
}

// validateID reports whether id is usable as an id: non-empty, at most
// 512 bytes, valid UTF-8, no NUL byte. The error wraps ErrInvalid and
// names the field "id". The service uses it (internal/expose) to answer
// 400 before any check.
func validateID(id string) error {
	if err := validateName(id); err != "" {
		return invalidf("id", "%s", err)
	}
	return nil
}

func validateKey(ut UseType, id string) error {
	if err := validateName(string(ut)); err != "" {
		return invalidf("UseType", "%s", err)
	}
	return validateID(id)
}

// plain reports whether s is surely a good id or UseType: 1 to 512
// bytes of ASCII without NUL, as nearly every id is, settled in one pass.
// validateName takes a closer look at the rest.
func plain(s string) bool {
	if len(s) == 0 || len(s) > expose.MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == 0 || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func validateName(s string) string {
	switch {
	case plain(s):
		return ""
	case s == "":
		return "is empty"
	case len(s) > expose.MaxIDLen:
		return fmt.Sprintf("is %d bytes, more than %d", len(s), expose.MaxIDLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "holds a NUL byte"
	}
	return ""
}
