package countlimit

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit/driver"
)

// ErrLeaseExpired is returned by [Lease.Extend] when the lease is no longer
// held: it expired (its slot may already be someone else's) or was released.
// Take a new one with Acquire.
var ErrLeaseExpired = errors.New("lease expired or released")

// Lease is a slot of a [Concurrent] rule held for one id, as
// [Limiter.Acquire] returns it. It is a small value, safe to copy and to use
// from any goroutine. The zero Lease, which a denied Acquire returns, holds
// nothing.
//
// A lease is named by a random 128-bit token that only its holder knows:
// whoever has the token (or the lease's [Lease.String]) can release or
// extend it, and nobody can guess it.
type Lease struct {
	l       *Limiter
	useType UseType
	id      string
	token   string
	ttl     time.Duration
}

// Acquire takes a slot of r, which must have a [Concurrent] window, for id
// when one is free. Allowed reports whether it did; the Lease is then the
// slot, to give back with Release when the work is done (a lease not
// released frees itself ttl after it was taken or last extended). The
// Result is as for Allow: Used is the slots held after the call, ResetAt and
// RetryAfter are when the earliest held lease expires (a Release may free a
// slot sooner), and a denial of a rule with Block sets its penalty.
//
// A denied Acquire returns the zero Lease. Any other window is ErrInvalid.
// An Acquire that fails with ErrUnavailable may still have taken a slot (the
// store committed, the answer was lost): with no Lease to release it, that
// slot frees itself after ttl, so keep ttl no longer than the work needs.
func (l *Limiter) Acquire(ctx context.Context, r Rule, id string) (Lease, Result, error) {
	var res Result
	ls, err := l.acquire(ctx, &res, r, id, true)
	return ls, res, err
}

// acquire is Acquire, which tells the observer its decision when tell is
// set.
func (l *Limiter) acquire(ctx context.Context, res *Result, r Rule, id string, tell bool) (Lease, error) {
	token := newToken()
	if err := l.one(ctx, res, driver.OpAcquire, r, id, 1, token, tell); err != nil || !res.Allowed {
		return Lease{}, err
	}
	return Lease{l: l, useType: r.UseType, id: id, token: token, ttl: truncMicro(r.Window.d)}, nil
}

// Release gives the slot back. It is idempotent: releasing a lease that was
// already released, or that expired, is not an error, and frees nothing
// else. Release of the zero Lease does nothing.
func (ls Lease) Release(ctx context.Context) error {
	if ls.l == nil {
		return nil
	}
	_, err := ls.l.keyOp(ctx, driver.OpRelease, ls.useType, ls.id, ls.token, ls.ttl)
	return err
}

// Extend keeps the slot for another ttl from now, for work that runs longer
// than it expected. It fails with ErrLeaseExpired when the lease is no longer
// held (expired, so its slot may be someone else's, or released): the
// holder must stop, or Acquire again. Extending the zero Lease is
// ErrInvalid.
func (ls Lease) Extend(ctx context.Context) error {
	if ls.l == nil {
		return wrap(driver.OpExtend, "", invalidf("lease", "the zero Lease holds nothing (Acquire was denied or never called)"))
	}
	held, err := ls.l.keyOp(ctx, driver.OpExtend, ls.useType, ls.id, ls.token, ls.ttl)
	if err == nil && !held {
		err = wrap(driver.OpExtend, ls.useType, ErrLeaseExpired)
	}
	return err
}

// ID returns the id the slot was taken for.
func (ls Lease) ID() string { return ls.id }

// Lease string versions: leaseVersion carries a checksum, signedVersion
// an HMAC under the Limiter's lease key (WithLeaseKey).
const (
	leaseVersion  = "cl1"
	signedVersion = "cl2"
)

// WithLeaseKey signs the Limiter's lease strings ([Lease.String]) with
// HMAC-SHA256 under key, and makes [Limiter.ParseLease] take only strings
// signed with it. Without a key a lease string carries a checksum, which
// catches a mistyped or edited string but not a forgery: whoever recomputes
// it can name any id with any token. Such a string still frees nothing (no
// lease holds its token), and Release reports nil, as for a lease that
// expired. With a key, a forged string, or one naming another id than its
// token was taken for, is ErrInvalid and never reaches the store.
//
// Limiters that release or extend each other's leases (processes of one
// service, the CLI beside it) must share the key; keep it secret, like a
// session-signing key. Setting, changing or removing the key makes the
// lease strings already handed out unreadable: their slots free themselves
// ttl after they were taken or last extended. key must be at least
// 16 bytes: WithLeaseKey panics otherwise. The key is copied.
func WithLeaseKey(key []byte) Option {
	if len(key) < expose.MinLeaseKeyLen {
		panic(fmt.Sprintf("countlimit: WithLeaseKey: the key is %d bytes, want at least %d", len(key), expose.MinLeaseKeyLen))
	}
	key = append([]byte(nil), key...)
	return func(l *Limiter) { l.leaseKey = key }
}

// String returns the lease in a form [Limiter.ParseLease] reads back, to
// release or extend it from another process: printable ASCII without
// spaces, safe in a URL, at most about 1 400 bytes. It holds the lease's
// token, so treat it as a secret. It is signed when the Limiter has a lease
// key ([WithLeaseKey]). The zero Lease's String is "".
func (ls Lease) String() string {
	if ls.l == nil {
		return ""
	}
	ttl := strconv.FormatInt(ls.ttl.Microseconds(), 10)
	version := leaseVersion
	if ls.l.leaseKey != nil {
		version = signedVersion
	}
	return strings.Join([]string{
		version,
		base64.RawURLEncoding.EncodeToString([]byte(ls.useType)),
		base64.RawURLEncoding.EncodeToString([]byte(ls.id)),
		ttl,
		ls.token,
		leaseCheck(ls.l.leaseKey, ls.useType, ls.id, ttl, ls.token),
	}, ".")
}

// ParseLease reads a lease written by [Lease.String] and returns it bound to
// l and to its rule: the one of rules whose UseType the string names and
// whose ttl it carries. The lease then lives by that rule's ttl, never by
// what the string says: a string whose ttl is not the rule's (it was
// edited, or the rule's ttl changed since the lease was taken) is
// ErrInvalid, and so is a string of a UseType none of rules has, and a
// call with no rules. Pass the rule the lease was taken under; a service
// with many rules may pass them all.
//
// A string that is malformed, was edited, or names another key than its
// token was taken for (its checksum binds the token to the rule and id) is
// ErrInvalid naming the field "lease". With a lease key ([WithLeaseKey]) l
// takes only strings signed with that key, so a forged string is
// ErrInvalid too; without one, l takes only unsigned strings, and what
// guards a lease is its unguessable token: a token the store does not hold
// releases nothing, and the rule bounds how long any lease lives.
func (l *Limiter) ParseLease(s string, rules ...Rule) (Lease, error) {
	bad := func(format string, args ...any) (Lease, error) {
		return Lease{}, fmt.Errorf("countlimit: parse lease: %w", invalidf("lease", format, args...))
	}
	if len(rules) == 0 {
		return Lease{}, fmt.Errorf("countlimit: parse lease: %w", invalidf("rules", "none given: pass the rule the lease was taken under, whose ttl the lease lives by"))
	}
	if len(s) > 4*expose.MaxIDLen {
		return bad("is %d bytes, longer than any lease", len(s))
	}
	parts := strings.Split(s, ".")
	if len(parts) != 6 || parts[0] != leaseVersion && parts[0] != signedVersion {
		want := leaseVersion
		if l.leaseKey != nil {
			want = signedVersion
		}
		return bad("is not a lease string (want %s.<use type>.<id>.<ttl>.<token>.<check>)", want)
	}
	switch signed := parts[0] == signedVersion; {
	case signed && l.leaseKey == nil:
		return bad("is signed, and this Limiter has no lease key to check it with (WithLeaseKey; the service's and the CLI's --lease-key-file)")
	case !signed && l.leaseKey != nil:
		return bad("is not signed, and this Limiter takes only leases signed with its lease key")
	}
	ut, err1 := base64.RawURLEncoding.DecodeString(parts[1])
	id, err2 := base64.RawURLEncoding.DecodeString(parts[2])
	if err := errors.Join(err1, err2); err != nil {
		return bad("use type or id is not base64url: %v", err)
	}
	if err := validateKey(UseType(ut), string(id)); err != nil {
		return Lease{}, fmt.Errorf("countlimit: parse lease: %w", err)
	}
	us, err := strconv.ParseInt(parts[3], 10, 64)
	if err != nil || us < 1 || us > expose.MaxDuration.Microseconds() || strconv.FormatInt(us, 10) != parts[3] {
		return bad("ttl %q is not 1 to %d microseconds", parts[3], expose.MaxDuration.Microseconds())
	}
	if !validToken(parts[4]) {
		return bad("token is not 22 base64url characters")
	}
	want := leaseCheck(l.leaseKey, UseType(ut), string(id), parts[3], parts[4])
	switch {
	case subtle.ConstantTimeCompare([]byte(want), []byte(parts[5])) == 1:
	case l.leaseKey != nil:
		return bad("signature does not match: the string was forged or edited, or signed with another lease key")
	default:
		return bad("checksum does not match: the string was edited or names another rule or id than its token was taken for")
	}
	ttl := time.Duration(us) * time.Microsecond
	var ruleTTLs []string
	for _, r := range rules {
		if r.UseType != UseType(ut) || r.Window.kind != kindConcurrent {
			continue
		}
		if err := r.Validate(); err != nil {
			return Lease{}, fmt.Errorf("countlimit: parse lease: %w", err)
		}
		if d := truncMicro(r.Window.d); d != ttl {
			ruleTTLs = append(ruleTTLs, d.String())
			continue
		}
		return Lease{l: l, useType: UseType(ut), id: string(id), token: parts[4], ttl: ttl}, nil
	}
	if ruleTTLs == nil {
		return bad("is a slot of %q, and no Concurrent rule of that UseType was given", ut)
	}
	return bad("ttl %v is not the rule's (%s): the string was edited, or the rule's ttl changed since the lease was taken", ttl, strings.Join(ruleTTLs, ", "))
}

// leaseCheck binds a token to its key and ttl: without a lease key, 48
// bits of SHA-256; with one, 128 bits of HMAC-SHA256 under it.
func leaseCheck(leaseKey []byte, ut UseType, id, ttl, token string) string {
	h, size := sha256.New(), 6
	if leaseKey != nil {
		h, size = hmac.New(sha256.New, leaseKey), 16
	}
	for _, s := range []string{"countlimit lease", string(ut), id, ttl, token} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:size])
}

// newToken returns 128 random bits in base64url: 22 characters.
func newToken() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func validToken(t string) bool {
	if len(t) != 22 {
		return false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(t)
	return err == nil && len(b) == 16
}

func errCountsSlots(field string) error {
	return invalidf(field, "a Concurrent window holds slots: take one with Acquire and give it back with Lease.Release")
}
