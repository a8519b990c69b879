// Package keystate works with model.Key, the stored state of a key, for
// the harnesses that read it back from stores and compare it with the
// model's (internal/testkit/modeltest: RunContract and the harness, and the stores'
// model tests).
package keystate

import (
	"maps"
	"slices"

	"github.com/countlimit/countlimit/internal/testkit/model"
)

// Empty reports whether k holds nothing: no window, log, tally, penalty,
// lease or smooth instant.
func Empty(k *model.Key) bool {
	return k == nil || k.Begin >= k.End && len(k.Log) == 0 && k.Denied == 0 && k.Blocked == 0 && len(k.Leases) == 0 && k.TAT == 0
}

// Live returns what of k is live at now, for a check whose sliding span
// is span (0 for any other kind): the logged events after now-span and the
// leases that expire after now, in new slices and maps; the rest as k has
// it. Two stores hold the same state when their keys' live parts agree.
func Live(k model.Key, span, now int64) model.Key {
	var log []int64
	for _, e := range k.Log {
		if span > 0 && e > now-span {
			log = append(log, e)
		}
	}
	var leases map[string]int64
	for t, e := range k.Leases {
		if e > now {
			if leases == nil {
				leases = map[string]int64{}
			}
			leases[t] = e
		}
	}
	k.Log, k.Leases = log, leases
	return k
}

// Clone returns a deep copy of k.
func Clone(k model.Key) model.Key {
	k.Log = slices.Clone(k.Log)
	k.Leases = maps.Clone(k.Leases)
	return k
}
