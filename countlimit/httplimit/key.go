package httplimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// KeyFunc returns the id a request is limited by: a client IP, an API key, a
// user id. Any func of this type will do, such as one that reads the user
// from the request's context. An empty string means the request has no
// usable key; the check then fails with countlimit.ErrInvalid (see
// [OnError]).
type KeyFunc func(*http.Request) string

// DefaultIPv6Prefix is the prefix length, in bits, by which ClientIP keys
// IPv6 clients: a /64, the smallest block a network gives one subscriber or
// LAN (address autoconfiguration needs a whole one).
const DefaultIPv6Prefix = 64

// ClientIP returns a KeyFunc that keys requests by the client's IP address:
// an IPv4 address on its own, an IPv6 address by the /64 it is in
// ([DefaultIPv6Prefix]; see [ClientIPPrefix] for another length). An IPv6
// client holds at least a /64 and may send each request from another of its
// 2^64 addresses: keyed by the full address, it would get a fresh limit,
// and the store a fresh counter, per request.
//
// The key is the address without port or zone ("192.0.2.1"), IPv4-mapped
// IPv6 addresses written as IPv4, or the IPv6 prefix in CIDR form
// ("2001:db8:1:2::/64").
//
// X-Forwarded-For is believed only when the request comes straight from a
// trusted proxy: when the IP of r.RemoteAddr is in one of the trusted
// prefixes. Its addresses are then walked from the right, past every
// trusted proxy, and the first untrusted one is the client; each proxy
// appends the address it saw, so only the entries left of that one can be
// forged. An entry that does not parse (a port is allowed, "unknown" is not)
// stops the walk at the last address known good. Without trusted prefixes,
// or from an untrusted peer, the header is ignored and the key is the peer's
// IP. Forwarded and X-Real-IP are never read: a proxy that writes one of them
// would pass the client's own copy of the other through. Proxies are
// matched by their full address, whatever the prefix clients are keyed by.
//
// A RemoteAddr that is not an IP address (a Unix socket) gives no key.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	return ClientIPPrefix(DefaultIPv6Prefix, trusted...)
}

// ClientIPPrefix is ClientIP keying IPv6 clients by the first ipv6Bits bits
// of their address: 56 or 48 to take in a whole site's delegation, 128 for
// one key per address (written without "/128", as IPv4 keys are). IPv4
// clients are keyed by their address whatever ipv6Bits is. It panics unless
// 0 < ipv6Bits <= 128.
func ClientIPPrefix(ipv6Bits int, trusted ...netip.Prefix) KeyFunc {
	if ipv6Bits < 1 || ipv6Bits > 128 {
		panic(fmt.Sprintf("httplimit: ClientIPPrefix called with ipv6Bits %d, want 1 to 128", ipv6Bits))
	}
	trusted = slices.Clone(trusted)
	key := func(a netip.Addr) string {
		if a.Is4() || ipv6Bits == 128 {
			return a.String()
		}
		p, _ := a.Prefix(ipv6Bits) // cannot fail: a is IPv6 and ipv6Bits in range
		return p.String()
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) string {
		client, ok := parseIP(r.RemoteAddr)
		if !ok {
			return ""
		}
		if !isTrusted(client) {
			return key(client)
		}
		for _, line := range slices.Backward(r.Header.Values("X-Forwarded-For")) {
			for _, entry := range slices.Backward(strings.Split(line, ",")) {
				a, ok := parseIP(strings.TrimSpace(entry))
				if !ok {
					return key(client)
				}
				client = a
				if !isTrusted(a) {
					return key(client)
				}
			}
		}
		return key(client) // every hop is trusted: the request began inside
	}
}

// parseIP reads an address as RemoteAddr and X-Forwarded-For write it:
// "192.0.2.1", "192.0.2.1:443", "2001:db8::1", "[2001:db8::1]:443" or
// "[2001:db8::1]".
func parseIP(s string) (netip.Addr, bool) {
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(s); err == nil {
		a = ap.Addr()
	} else {
		if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
			s = s[1 : len(s)-1]
		}
		if a, err = netip.ParseAddr(s); err != nil {
			return netip.Addr{}, false
		}
	}
	return a.Unmap().WithZone(""), true
}

// Header returns a KeyFunc that keys requests by the value of the named
// header, such as an API key, without surrounding spaces. A request without
// it has no key. The value is stored as the id as it is, so hash secrets in
// your own KeyFunc rather than keep them in the store.
func Header(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string { return strings.TrimSpace(r.Header.Get(name)) }
}
