package testbackend

import (
	"slices"
	"sync"
	"testing"

	"github.com/countlimit/countlimit/countlimit"
)

// AllAtOnce has callers goroutines call allow each times, all starting at
// once (allow gets the caller's number), and holds the outcomes to an
// exact limit: exactly limit calls allowed, their Used values 1 to limit,
// each once, as if the calls had run one after another, and every other
// call denied with Used limit and nothing remaining. It returns how many
// were denied.
func AllAtOnce(t testing.TB, callers, each int, limit int64, allow func(caller int) (countlimit.Result, error)) (denied int) {
	t.Helper()
	var (
		mu    sync.Mutex
		used  []int64
		start = make(chan struct{})
		wg    sync.WaitGroup
	)
	for i := range callers {
		wg.Go(func() {
			<-start
			for range each {
				res, err := allow(i)
				mu.Lock()
				switch {
				case err != nil:
					t.Error(err)
				case res.Allowed:
					used = append(used, res.Used)
				default:
					denied++
					if res.Used != limit || res.Remaining != 0 {
						t.Errorf("denied with %+v, want Used %d", res, limit)
					}
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	slices.Sort(used)
	exact := int64(len(used)) == limit
	for i := range used {
		exact = exact && used[i] == int64(i+1)
	}
	if !exact {
		t.Errorf("%d allowed with Used %v; want exactly %d, Used 1..%d each once", len(used), used, limit, limit)
	}
	if want := callers*each - int(limit); denied != want {
		t.Errorf("%d denied, want %d", denied, want)
	}
	return denied
}
