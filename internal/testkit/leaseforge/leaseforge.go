// Package leaseforge writes unsigned lease strings as anyone can, checksum
// and all: the tests' stand-in for whoever holds a lease string and edits
// it, and reads the token a string names. Only tests and the storetest
// suite import it.
package leaseforge

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

// Unsigned returns the unsigned (cl1) lease string of token under (ut, id)
// with the given ttl, with a checksum that countlimit accepts.
func Unsigned(ut countlimit.UseType, id string, ttl time.Duration, token string) string {
	enc := base64.RawURLEncoding.EncodeToString
	us := strconv.FormatInt(ttl.Microseconds(), 10)
	h := sha256.New()
	for _, s := range []string{"countlimit lease", string(ut), id, us, token} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return strings.Join([]string{"cl1", enc([]byte(ut)), enc([]byte(id)), us, token, enc(h.Sum(nil)[:6])}, ".")
}

// WithTTL returns the unsigned lease string s with its ttl rewritten and
// its checksum made anew, or "" when s is not an unsigned lease string.
func WithTTL(s string, ttl time.Duration) string {
	p := strings.Split(s, ".")
	if len(p) != 6 || p[0] != "cl1" {
		return ""
	}
	ut, err1 := base64.RawURLEncoding.DecodeString(p[1])
	id, err2 := base64.RawURLEncoding.DecodeString(p[2])
	if err1 != nil || err2 != nil {
		return ""
	}
	return Unsigned(countlimit.UseType(ut), string(id), ttl, p[4])
}

// Token returns the token a lease string names (signed or not), or "" when
// s is not a lease string: the name the store keeps the lease by.
func Token(s string) string {
	p := strings.Split(s, ".")
	if len(p) != 6 {
		return ""
	}
	return p[4]
}
