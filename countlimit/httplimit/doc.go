// Package httplimit is net/http middleware that limits requests with a
// [countlimit.Limiter].
//
// Each request is keyed by a [KeyFunc] ([ClientIP], [Header], or your own)
// and checked against the rules a [RuleFunc] picks for it: one rule, several
// checked all-or-nothing, or a tier chosen per request. An allowed request
// goes on to the next handler; a denied one is answered 429 Too Many
// Requests.
//
// Quick start:
//
//	store := memstore.New()
//	defer store.Close()
//	limiter := countlimit.New(store)
//
//	perMinute := countlimit.Rule{UseType: "api", Limit: 60, Window: countlimit.Fixed(time.Minute)}
//	limit := httplimit.Middleware(limiter,
//		httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8")), // behind a proxy in 10/8
//		httplimit.Rules(perMinute))
//	http.ListenAndServe(":8080", limit(mux))
//
// # Client IPs
//
// [ClientIP] keys a request by its client's address, read from
// X-Forwarded-For only behind the proxies you trust. An IPv4 client is
// keyed by its address; an IPv6 client by the /64 its address is in, since
// one client holds at least a /64 and could otherwise take a fresh limit,
// and cost the store a fresh counter, with each of its 2^64 addresses.
// [ClientIPPrefix] sets another prefix length: 48 or 56 to treat a whole
// site as one client, 128 to key each address apart. IPv4-mapped IPv6
// addresses (::ffff:192.0.2.1) are keyed as the IPv4 address they carry.
//
// # Headers
//
// Every checked response, allowed or denied, carries the RateLimit-Policy
// and RateLimit fields of draft-ietf-httpapi-ratelimit-headers, in the
// Structured Field syntax the drafts have used since -08 (the newest is -11,
// May 2026); the older RateLimit-Limit, -Remaining and -Reset fields of
// drafts -07 and before are not sent. Each rule is one List member,
// named by its UseType unless [WithPolicyName] says otherwise:
//
//	RateLimit-Policy: "api";q=60;w=60
//	RateLimit: "api";r=42;t=17
//
// The parameters:
//
//   - q is Rule.Limit.
//   - w is the window's length in seconds, rounded up, for Rolling, Fixed
//     and Sliding windows. Calendar windows (a month is 28 to 31 days, a day
//     23 to 25 hours) and Lifetime windows have no single length, so w is
//     left out.
//   - A Smooth window is stated as a quota that refills over a window: q
//     is its burst and w the seconds, rounded up, a whole burst takes to
//     drain (burst × the interval, period/Limit), so q/w is the rule's rate (less
//     where w rounds up: 10 a second with bursts of 3 is q=3;w=1), r is at
//     most q and t at most w. A smooth rule of Limit 0 has q=0 and no w.
//   - r is Result.Remaining, or 0 while the key sits in the penalty box
//     (Rule.Block), since nothing is allowed then. For a Smooth window, how
//     many fit at once.
//   - t is the seconds, rounded up, until Result.ResetAt, or until the
//     penalty ends if that is later; 0 once that time has passed. For a
//     Smooth window, until the whole burst fits again. A Lifetime
//     window never resets, so outside a penalty t is left out rather than
//     invite a retry.
//
// The fields are added, not set, so two layers of this middleware (say per
// IP and per user) list both their policies, as the fields' List syntax allows.
//
// A denied response also carries Retry-After: the whole seconds, rounded up
// and at least 1, until the same request can succeed, penalty included. It
// is left out when no wait helps (Result.RetryAfter is countlimit.RetryNever: a full Lifetime
// window).
//
// # Errors
//
// A store that fails (countlimit.ErrUnavailable) is answered 503 Service
// Unavailable, not 429: the store failed, not the client. [FailOpen] lets
// such requests through instead. An invalid check (countlimit.ErrInvalid)
// almost always means the key is unusable: empty because the KeyFunc found
// nothing, over 512 bytes, or not UTF-8. It is answered 400 Bad Request. (It
// can also mean the RuleFunc returned no rule or an invalid one, a bug that
// answers every request 400; test your rules.)
// [OnError] replaces both answers and [OnDenied] the 429. The middleware
// never panics on a request.
package httplimit
