// Package errs holds the errors countlimit exports, where both countlimit
// and its driver package can reach them: countlimit imports driver, and
// a store implements driver and returns countlimit's errors, so the
// errors live below both and are exported from countlimit alone.
package errs

import (
	"errors"
	"fmt"
)

// Unavailable is countlimit.ErrUnavailable.
var Unavailable = errors.New("store unavailable")

// Locked is countlimit.ErrLocked; it wraps Unavailable.
var Locked = fmt.Errorf("%w: the id's state is locked by another transaction", Unavailable)

// Invalid is countlimit.ErrInvalid.
var Invalid = errors.New("invalid argument")
