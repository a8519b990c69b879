// Package errs holds the errors countlimit exports, where both countlimit
// and its driver package can reach them: countlimit imports driver, and
// a store implements driver and returns countlimit's errors, so the
// errors live below both and are exported from countlimit alone.
package errs

import (
	"errors"
	"fmt"
)

// ErrUnavailable is countlimit.ErrUnavailable.
var ErrUnavailable = errors.New("store unavailable")

// ErrLocked is countlimit.ErrLocked; it wraps ErrUnavailable.
var ErrLocked = fmt.Errorf("%w: the id's state is locked by another transaction", ErrUnavailable)

// ErrInvalid is countlimit.ErrInvalid.
var ErrInvalid = errors.New("invalid argument")
