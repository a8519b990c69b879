// Package faulttest is countlimit's fault suite (issue 8). Its tests are
// behind the build tag "fault", so "go test ./..." stays fast:
//
//	go test -race -tags fault -count=1 -v ./internal/testkit/faulttest/
//
// The tests start their own PostgreSQL (initdb in a temporary directory, on a
// free port, as the postgres user when run as root) and redis-server, put 64
// concurrent callers on a Limiter over each store, and inject faults: killed
// connections, a server restart, a 10 s outage, a stall (a table lock on
// PostgreSQL, CLIENT PAUSE on Redis), SCRIPT FLUSH and a lost reply (a TCP
// proxy that forwards a script call and closes the connection instead of
// relaying its answer).
//
// Every fault is a subtest that asserts: no panic; every failed call is
// countlimit.ErrUnavailable and returns within its deadline plus 50 ms; the
// first call after the server is back succeeds within 1 s; where the fault
// keeps data, every acknowledged allowance is stored (none lost) and nothing
// is counted that neither an acknowledged nor a failed call can explain (no
// double counts); a key with Limit 100 never allows more; and goroutines go
// back to their baseline once pools and clients are closed. The figures are
// logged as a table, once per fault and again at the end.
//
// The Redis Cluster tests (cluster_test.go) start a six-node cluster (three
// masters, three replicas) and put 16 callers of fixed, AllowAll, sliding,
// smooth and lease checks on it: through two reshards of 3 000 slots
// (redis-cli --cluster reshard) no call fails, no shared key is allowed
// beyond its limit and every acknowledged count is stored; through a kill -9
// of a master, calls on its slots are answered by the promoted replica
// within 5 s of the promotion, every failed call is ErrUnavailable, and the
// only counts lost were acknowledged in the second before the kill.
//
// The servers' binaries are found with "pg_config --bindir" (else
// /usr/lib/postgresql/*/bin), and "redis-server" and "redis-cli" on PATH;
// without them the tests skip, or fail when COUNTLIMIT_REQUIRE_BACKENDS=1.
package faulttest
