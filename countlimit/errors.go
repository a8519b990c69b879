package countlimit

import (
	"fmt"

	"github.com/countlimit/countlimit/countlimit/internal/errs"
)

// ErrInvalid is returned by every Limiter method when an argument is bad: an
// empty UseType or id, an id over 512 bytes or not valid UTF-8 or holding a NUL
// byte, a negative Limit or Block, an invalid Window, n < 1, or a rule
// whose kind of window the store does not support (every store of this
// module supports every kind; a store of one's own may not). Nothing is
// written. The
// error's message names the field or the store; test with errors.Is. It
// is the error a store refusing a request wraps.
var ErrInvalid = errs.ErrInvalid

// ErrUnavailable is returned when the store cannot be reached, fails, or the
// context ends before it answers. Stores wrap their driver's error with it, so
// errors.Is(err, ErrUnavailable) holds and errors.As still finds the cause.
// A call that fails with ErrUnavailable may or may not have been counted
// (the network may fail after the store committed); the Result is zero and
// Allowed is false. A store wraps its errors with it through
// driver.Unavailable.
var ErrUnavailable = errs.ErrUnavailable

// fieldError is an ErrInvalid that names the offending field.
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string { return "invalid argument: " + e.field + ": " + e.msg }
func (e *fieldError) Unwrap() error { return ErrInvalid }

func invalidf(field, format string, args ...any) error {
	return &fieldError{field: field, msg: fmt.Sprintf(format, args...)}
}
