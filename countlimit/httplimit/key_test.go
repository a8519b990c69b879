package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/httplimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

func TestClientIP(t *testing.T) {
	t.Parallel()
	proxies := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("fd00::/8"),
	}
	tests := []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string // one X-Forwarded-For line each
		want    string
	}{
		{"no proxy", nil, "192.0.2.1:1234", nil, "192.0.2.1"},
		{"no trusted proxies: header ignored", nil, "192.0.2.1:1234", []string{"203.0.113.7"}, "192.0.2.1"},
		{"spoofed by an untrusted peer", proxies, "192.0.2.1:1234", []string{"203.0.113.7"}, "192.0.2.1"},
		{"spoofed chain from an untrusted peer", proxies, "192.0.2.1:1234", []string{"203.0.113.7, 10.0.0.2"}, "192.0.2.1"},
		{"trusted proxy", proxies, "10.0.0.1:1234", []string{"203.0.113.7"}, "203.0.113.7"},
		{"trusted proxy, no header", proxies, "10.0.0.1:1234", nil, "10.0.0.1"},
		{"trusted proxy, empty header", proxies, "10.0.0.1:1234", []string{""}, "10.0.0.1"},
		{"client spoofs left of the real entry", proxies, "10.0.0.1:1234", []string{"198.51.100.66, 203.0.113.7"}, "203.0.113.7"},
		{"walks past every trusted hop", proxies, "10.0.0.1:1234", []string{"198.51.100.66, 203.0.113.7, 10.9.9.9, 10.0.0.2"}, "203.0.113.7"},
		{"several header lines, last is rightmost", proxies, "10.0.0.1:1234", []string{"198.51.100.66, 203.0.113.7", "10.0.0.2"}, "203.0.113.7"},
		{"all hops trusted: the first", proxies, "10.0.0.1:1234", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"spaces around entries", proxies, "10.0.0.1:1234", []string{"  203.0.113.7  ,10.0.0.2 "}, "203.0.113.7"},
		{"entry with a port", proxies, "10.0.0.1:1234", []string{"203.0.113.7:5555"}, "203.0.113.7"},
		{"malformed entry stops at the last good hop", proxies, "10.0.0.1:1234", []string{"203.0.113.7, garbage, 10.0.0.2"}, "10.0.0.2"},
		{"malformed rightmost entry", proxies, "10.0.0.1:1234", []string{"unknown"}, "10.0.0.1"},
		{"empty entry", proxies, "10.0.0.1:1234", []string{"203.0.113.7,,10.0.0.2"}, "10.0.0.2"},
		{"IPv6 peer", nil, "[2001:db8::1]:443", nil, "2001:db8::/64"},
		{"IPv6 peer, long form", nil, "[2001:0db8:0000::0001]:443", nil, "2001:db8::/64"},
		{"IPv6 peer with zone", nil, "[fe80::1%eth0]:443", nil, "fe80::/64"},
		{"IPv6 spoof from untrusted peer", proxies, "[2001:db8:0:1::1]:443", []string{"2001:db8::66"}, "2001:db8:0:1::/64"},
		{"IPv6 trusted proxy", proxies, "[fd00::1]:443", []string{"2001:db8:0:7::7"}, "2001:db8:0:7::/64"},
		{"IPv6 entry with port", proxies, "[fd00::1]:443", []string{"[2001:db8::7]:5555"}, "2001:db8::/64"},
		{"IPv6 entry in brackets", proxies, "[fd00::1]:443", []string{"[2001:db8::7]"}, "2001:db8::/64"},
		{"IPv6 half bracket is malformed", proxies, "[fd00::1]:443", []string{"[2001:db8::7"}, "fd00::/64"},
		{"IPv6 proxies matched by full address", []netip.Prefix{netip.MustParsePrefix("2001:db8::1/128")}, "[2001:db8::2]:443", []string{"2001:db8:0:7::7"}, "2001:db8::/64"},
		{"IPv4-mapped peer is IPv4", proxies, "[::ffff:10.0.0.1]:443", []string{"203.0.113.7"}, "203.0.113.7"},
		{"IPv4-mapped entry is IPv4", proxies, "10.0.0.1:1234", []string{"::ffff:203.0.113.7"}, "203.0.113.7"},
		{"RemoteAddr without port", nil, "192.0.2.1", nil, "192.0.2.1"},
		{"RemoteAddr not an IP: no key", proxies, "@", []string{"203.0.113.7"}, ""},
		{"RemoteAddr empty: no key", nil, "", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := httplimit.ClientIP(tc.trusted...)(r); got != tc.want {
				t.Errorf("ClientIP(%v) with RemoteAddr %q, X-Forwarded-For %q = %q, want %q", tc.trusted, tc.remote, tc.xff, got, tc.want)
			}
		})
	}
}

func TestClientIPPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		bits     int
		a, b     string // two clients' RemoteAddr
		wantA    string
		sameKeys bool
	}{
		{64, "[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", "2001:db8:1:2::/64", true},
		{64, "[2001:db8:1:2::1]:1", "[2001:db8:1:3::1]:1", "2001:db8:1:2::/64", false},
		{56, "[2001:db8:1:2::1]:1", "[2001:db8:1:ff::1]:1", "2001:db8:1::/56", true},
		{56, "[2001:db8:1:2::1]:1", "[2001:db8:1:100::1]:1", "2001:db8:1::/56", false},
		{48, "[2001:db8:1:2::1]:1", "[2001:db8:1:ffff::1]:1", "2001:db8:1::/48", true},
		{1, "[2001:db8::1]:1", "[7fff::1]:1", "::/1", true},
		{127, "[2001:db8::2]:1", "[2001:db8::3]:1", "2001:db8::2/127", true},
		{128, "[2001:db8::1]:1", "[2001:db8::2]:1", "2001:db8::1", false},
		{128, "[2001:db8::1]:1", "[2001:0db8::0001%eth0]:1", "2001:db8::1", true},
		// IPv4 is keyed by address, mapped or not, whatever the prefix.
		{64, "192.0.2.1:1", "[::ffff:192.0.2.1]:1", "192.0.2.1", true},
		{64, "192.0.2.1:1", "192.0.2.2:1", "192.0.2.1", false},
		{64, "[::ffff:192.0.2.1]:1", "[::ffff:192.0.2.2]:1", "192.0.2.1", false},
		{1, "192.0.2.1:1", "[::ffff:192.0.2.1]:1", "192.0.2.1", true},
		{128, "192.0.2.1:1", "[::ffff:192.0.2.1]:1", "192.0.2.1", true},
	}
	for i, tc := range tests {
		key := httplimit.ClientIPPrefix(tc.bits)
		if tc.bits == httplimit.DefaultIPv6Prefix {
			key = httplimit.ClientIP()
		}
		ra := httptest.NewRequest(http.MethodGet, "/", nil)
		ra.RemoteAddr = tc.a
		rb := httptest.NewRequest(http.MethodGet, "/", nil)
		rb.RemoteAddr = tc.b
		ka, kb := key(ra), key(rb)
		if ka != tc.wantA {
			t.Errorf("case %d: /%d key of %s = %q, want %q", i, tc.bits, tc.a, ka, tc.wantA)
		}
		if (ka == kb) != tc.sameKeys {
			t.Errorf("case %d: /%d keys of %s and %s: %q and %q; want the same: %v", i, tc.bits, tc.a, tc.b, ka, kb, tc.sameKeys)
		}
	}
}

func TestClientIPPrefixBadBits(t *testing.T) {
	t.Parallel()
	for _, bits := range []int{-1, 0, 129, 1 << 20} {
		func() {
			defer func() {
				if msg, _ := recover().(string); !strings.Contains(msg, fmt.Sprint("ipv6Bits ", bits)) {
					t.Errorf("ClientIPPrefix(%d) panicked with %q, want a message naming ipv6Bits %d", bits, msg, bits)
				}
			}()
			httplimit.ClientIPPrefix(bits)
		}()
	}
}

// TestClientIPPrefixMiddleware: a client that walks through the addresses
// of its /64 gets no fresh limit, and costs the store one counter.
func TestClientIPPrefixMiddleware(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { store.Close() })
	l := countlimit.New(store, countlimit.WithClock(storetest.NewClock(t0).Now))
	rule := countlimit.Rule{UseType: "api", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	h := httplimit.Middleware(l, httplimit.ClientIP(), httplimit.Rules(rule))(served)
	for i := range 1000 {
		remote := fmt.Sprintf("[2001:db8:1:2:%x::%x]:443", i, i)
		want := http.StatusTooManyRequests
		if i == 0 {
			want = http.StatusOK
		}
		if rec := do(h, req{remote: remote}); rec.Code != want {
			t.Fatalf("request %d from %s: status %d, want %d", i, remote, rec.Code, want)
		}
	}
	if rec := do(h, req{remote: "[2001:db8:1:3::1]:443"}); rec.Code != http.StatusOK {
		t.Errorf("another /64: status %d, want 200", rec.Code)
	}
	if n := store.Len(); n != 2 {
		t.Errorf("store holds %d counters, want 2: one per /64", n)
	}
}

// TestClientIPMiddleware checks that a forged X-Forwarded-For buys no fresh
// limit, while one set by a trusted proxy keys each client apart.
func TestClientIPMiddleware(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(t0)
	rule := countlimit.Rule{UseType: "api", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	h := httplimit.Middleware(newLimiter(t, clock), httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8")),
		httplimit.Rules(rule))(served)
	xff := func(v string) map[string]string { return map[string]string{"X-Forwarded-For": v} }
	steps := []struct {
		req
		status int
	}{
		{req{remote: "198.51.100.1:1", header: xff("203.0.113.1")}, 200},
		{req{remote: "198.51.100.1:1", header: xff("203.0.113.2")}, 429},
		{req{remote: "10.0.0.1:1", header: xff("203.0.113.1")}, 200},
		{req{remote: "10.0.0.1:1", header: xff("203.0.113.2")}, 200},
		{req{remote: "10.0.0.2:1", header: xff("203.0.113.1")}, 429},
		{req{remote: "10.0.0.1:1", header: xff("203.0.113.3, 203.0.113.2")}, 429},
	}
	for i, s := range steps {
		if rec := do(h, s.req); rec.Code != s.status {
			t.Errorf("step %d (%v): status = %d, want %d", i, s.req, rec.Code, s.status)
		}
	}
}

func TestHeader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header []string // name, value pairs
		want   string
	}{
		{"present", []string{"X-API-Key", "k-123"}, "k-123"},
		{"trimmed", []string{"X-API-Key", "  k-123 \t"}, "k-123"},
		{"any case", []string{"x-api-key", "k-123"}, "k-123"},
		{"first of several", []string{"X-API-Key", "k-1", "X-API-Key", "k-2"}, "k-1"},
		{"absent", nil, ""},
		{"other header", []string{"Authorization", "k-123"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for i := 0; i < len(tc.header); i += 2 {
				r.Header.Add(tc.header[i], tc.header[i+1])
			}
			for _, name := range []string{"X-API-Key", "x-api-key"} {
				if got := httplimit.Header(name)(r); got != tc.want {
					t.Errorf("Header(%q) with %s = %q, want %q", name, fmt.Sprint(r.Header), got, tc.want)
				}
			}
		})
	}
}
