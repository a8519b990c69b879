// The keys of a counter and of its sliding log, their use type and id
// escaped into one slot's hash tag.

package redisstore

import (
	"fmt"
	"strings"

	"github.com/countlimit/countlimit/countlimit"
)

// counterKey returns the Redis key of useType's counter for id (the layout
// is docs/library.md's, for operators).
func counterKey(useType countlimit.UseType, id string) string {
	k := logKey(useType, id)
	return k[:len(k)-len(logSuffix)]
}

// logKey returns the key of the sliding log beside counterKey(useType, id).
func logKey(useType countlimit.UseType, id string) string {
	ut, eid := escape(string(useType)), escape(id)
	var b strings.Builder
	b.Grow(logKeyLen(ut, eid))
	writeLogKey(&b, ut, eid)
	return b.String()
}

// logSuffix ends a sliding log's key; the counter's key is the log's
// without it, so appendKeys cuts both from one string.
const logSuffix = ":log"

// logKeyLen is the length of the log key writeLogKey writes.
func logKeyLen(ut, id string) int {
	return len("countlimit:") + len(ut) + len(":{}") + len(id) + len(logSuffix)
}

// writeLogKey writes the sliding log's key of an escaped use type and id:
// the one place the key format is spelled.
func writeLogKey(b *strings.Builder, ut, id string) {
	b.WriteString("countlimit:")
	b.WriteString(ut)
	b.WriteString(":{")
	b.WriteString(id)
	b.WriteString("}" + logSuffix)
}

// escaped holds the characters of the key format, which escape writes as
// %XX (their byte in upper-case hex), and nothing else.
const escaped = "%:{}"

// escape returns s with the characters of the key format escaped. It runs
// on every call, for its id and each of its use types: a table lookup a
// byte, where strings.ContainsAny built its set of four bytes each time.
func escape(s string) string {
	for i := 0; i < len(s); i++ {
		if special[s[i]] {
			return escaper.Replace(s)
		}
	}
	return s
}

var (
	// escaper replaces each of escaped.
	escaper = func() *strings.Replacer {
		var pairs []string
		for _, c := range []byte(escaped) {
			pairs = append(pairs, string(c), fmt.Sprintf("%%%02X", c))
		}
		return strings.NewReplacer(pairs...)
	}()
	// special marks the bytes of escaped.
	special = func() (t [256]bool) {
		for _, c := range []byte(escaped) {
			t[c] = true
		}
		return t
	}()
)
