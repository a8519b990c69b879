// Package countlimit answers one question for business code: may this event
// happen once more for this key in this period?
//
// A [Rule] names what is limited (a [UseType]), how many events a window
// allows, and the [Window]: [Rolling], [Fixed], natural [Calendar] days,
// weeks, months and years in any time zone, an exact [Sliding] log, or a
// [Lifetime]. A [Limiter] checks rules against a store: memstore (in
// process), pgstore (PostgreSQL, inside your own transaction if you like) or
// redisstore. Every check is one atomic step in the store, so N concurrent
// callers with a limit of L get exactly min(N, L) allowed.
//
// Quick start:
//
//	store := memstore.New() // or pgstore.New(pool), redisstore.New(client)
//	defer store.Close()     // memstore's janitor; the others close with their pool or client
//	limiter := countlimit.New(store)
//
//	shanghai, _ := time.LoadLocation("Asia/Shanghai")
//	passwordChange := countlimit.Rule{
//		UseType: "password.change",
//		Limit:   3,
//		Window:  countlimit.Calendar(countlimit.Day, shanghai),
//	}
//	res, err := limiter.Allow(ctx, passwordChange, userID)
//	if err != nil {
//		return err // bad input (ErrInvalid) or the store failed (ErrUnavailable)
//	}
//	if !res.Allowed {
//		return fmt.Errorf("try again in %v", res.RetryAfter)
//	}
//
// A denial is a Result with Allowed false, never an error. Only allowed
// events count. [Limiter.AllowAll] checks several rules (10 per hour AND 50
// per day) all-or-nothing; [Limiter.Refund] gives events back; a Rule's
// Block puts an id in a penalty box after a denial; [Limiter.CheckLimit] is
// the classic CheckLimit(useType, id, limit, duration, beginTime) model.
// A [Concurrent] rule limits how many run at once instead: [Limiter.Acquire]
// takes a slot, a [Lease], that its holder releases, and that frees itself
// after a ttl if the holder crashes.
//
// Time: the Limiter's clock (see [WithClock]) decides; stores take "now"
// from each call and never read their own while deciding. [WithStoreClock]
// corrects the Limiter's clock by the store's, read now and then, so that
// processes with skewed clocks agree. Times are kept to the microsecond.
//
// Bounds, so that every store computes exactly (Redis scripts count in
// double precision) and no sum overflows; past one a call is [ErrInvalid],
// naming the field: an id or UseType is 1 to 512 bytes of UTF-8 without
// NUL; a Limit, and AllowN's n, at most 2^53; a [Sliding] or [Concurrent]
// rule's Limit at most 10 000 (one timestamp or lease per event or slot);
// a window, penalty or CheckLimit duration at most 100 years; an
// [Limiter.AllowAll] at most 64 rules; a [WithLeaseKey] key at least 16
// bytes.
//
// Observing: [WithObserver] tells each decision and each store call, with
// what the failure options did about it; [CircuitBreaker].OnChange each
// change of the breaker's state. Package promlimit turns both into
// Prometheus metrics.
package countlimit
