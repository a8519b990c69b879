// Package testenv finds the PostgreSQL and Redis servers tests run on, in
// one place for the project's own tests (internal/testkit/testbackend) and the
// public helpers (pgstore/pgstoretest, redisstore/redisstoretest):
//
//  1. the URL in COUNTLIMIT_TEST_POSTGRES_URL / COUNTLIMIT_TEST_REDIS_URL;
//  2. else a server on its default local port that needs no password
//     (LocalPostgresURL, LocalRedisURL), as a developer's machine has,
//     unless COUNTLIMIT_TEST_LOCAL=off (to test on containers where such
//     servers run);
//  3. else a container started with testcontainers-go from
//     COUNTLIMIT_TEST_POSTGRES_IMAGE / COUNTLIMIT_TEST_REDIS_IMAGE (default
//     postgres:15-alpine, redis:7-alpine), where a Docker engine answers;
//  4. else the test is skipped with a message naming both variables and
//     what was tried — or fails, when COUNTLIMIT_REQUIRE_BACKENDS=1. A test
//     process that skipped says so on the terminal as it ends (Main), since
//     go test shows nothing else of a package that passes.
//
// A container is started once per test process, shared by its tests and
// removed by Main. Where Ryuk's image (testcontainers' reaper) is present,
// Ryuk also removes it should the process die first; where it is absent
// (no registry to pull it from), Ryuk is disabled rather than failing every
// start, and every container carries the Label so leftovers can be found.
//
// testenv imports no database driver, so the helpers built on it pull in
// only the driver they need.
package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// The environment variables the helpers read.
const (
	EnvPostgres      = "COUNTLIMIT_TEST_POSTGRES_URL"
	EnvRedis         = "COUNTLIMIT_TEST_REDIS_URL"
	EnvPostgresImage = "COUNTLIMIT_TEST_POSTGRES_IMAGE"
	EnvRedisImage    = "COUNTLIMIT_TEST_REDIS_IMAGE"
	EnvRequire       = "COUNTLIMIT_REQUIRE_BACKENDS"
	// EnvLocal set to "off" skips the servers on their default local
	// ports: the tests then take a URL or a container.
	EnvLocal = "COUNTLIMIT_TEST_LOCAL"
)

// The images started when the image variables are unset.
const (
	DefaultPostgresImage = "postgres:15-alpine"
	DefaultRedisImage    = "redis:7-alpine"
)

// Label is set on every container the helpers start; its value is the
// process id that started it: docker ps -a --filter label=org.countlimit.test
const Label = "org.countlimit.test"

var (
	mu       sync.Mutex
	cleanups []func()
)

// Main runs the tests, removes what the helpers created (schemas, pools,
// containers), and exits with the tests' code.
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	skippedNotice()
	os.Exit(code)
}

// Cleanup runs the functions given to AtExit, newest first, and forgets
// them. Main calls it.
func Cleanup() {
	mu.Lock()
	fs := cleanups
	cleanups = nil
	mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// AtExit registers f to run at Cleanup: for what outlives a single test.
func AtExit(f func()) {
	mu.Lock()
	defer mu.Unlock()
	cleanups = append(cleanups, f)
}

// Required reports whether a missing backend must fail the test.
func Required() bool { return os.Getenv(EnvRequire) == "1" }

// Unavailable skips t, or fails it when backends are required.
func Unavailable(t testing.TB, what string, why error) {
	t.Helper()
	if Required() {
		t.Fatalf("%s is required (%s=1) but unavailable: %v", what, EnvRequire, why)
	}
	skipMu.Lock()
	if _, ok := skipped[what]; !ok {
		skipped[what] = why
	}
	skipMu.Unlock()
	t.Skipf("skipping: %s unavailable: %v", what, why)
}

// A server is found once per process, from its URL variable or a container.
type server struct {
	what         string // for messages: "PostgreSQL"
	env          string // the URL variable
	imageEnv     string
	defaultImage string
	start        func(ctx context.Context, image string) (string, error)
	localURL     string       // the server looked for on its default port
	local        func() error // whether it is there and lets the tests in

	once sync.Once
	url  string
	err  error
}

func (s *server) find() (string, error) {
	s.once.Do(func() { s.url, s.err = s.lookup() })
	return s.url, s.err
}

func (s *server) lookup() (string, error) {
	if u := os.Getenv(s.env); u != "" {
		return u, nil
	}
	localErr := fmt.Errorf("%s=off", EnvLocal)
	if os.Getenv(EnvLocal) != "off" {
		localErr = s.local()
	}
	if localErr == nil {
		return s.localURL, nil
	}
	image := os.Getenv(s.imageEnv)
	if image == "" {
		image = s.defaultImage
	}
	if err := docker(); err != nil {
		return "", fmt.Errorf("%s is not set, %v, and no Docker engine answered to run %s (%s) with testcontainers: %w",
			s.env, localErr, image, s.imageEnv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	u, err := s.start(ctx, image)
	if err != nil {
		if present, known := imagePresent(image); known && !present {
			return "", fmt.Errorf("%s is not set, and image %s (%s) is not in the Docker engine, whose pull of it failed: %w",
				s.env, image, s.imageEnv, err)
		}
		hint := ""
		if _, set := os.LookupEnv("TESTCONTAINERS_HOST_OVERRIDE"); !set && inAContainer() {
			hint = " (these tests run in a container: if the Docker engine runs in it too, " +
				"set TESTCONTAINERS_HOST_OVERRIDE=127.0.0.1 so testcontainers looks for the published ports there)"
		}
		return "", fmt.Errorf("%s is not set, and a container of %s (%s) did not start%s: %w",
			s.env, image, s.imageEnv, hint, err)
	}
	return u, nil
}

var (
	postgres = &server{
		what: "PostgreSQL", env: EnvPostgres, imageEnv: EnvPostgresImage, defaultImage: DefaultPostgresImage,
		localURL: LocalPostgresURL, local: localPostgres,
		start: func(ctx context.Context, image string) (string, error) {
			c, err := tcpostgres.Run(ctx, image,
				tcpostgres.WithDatabase("countlimit"),
				tcpostgres.BasicWaitStrategies(),
				labels())
			if err := keep(c, err); err != nil {
				return "", err
			}
			return c.ConnectionString(ctx, "sslmode=disable")
		},
	}
	redis = &server{
		what: "Redis", env: EnvRedis, imageEnv: EnvRedisImage, defaultImage: DefaultRedisImage,
		localURL: LocalRedisURL, local: localRedis,
		start: func(ctx context.Context, image string) (string, error) {
			c, err := tcredis.Run(ctx, image, labels())
			if err := keep(c, err); err != nil {
				return "", err
			}
			return c.ConnectionString(ctx)
		},
	}
)

// inAContainer reports what testcontainers looks at to decide that it runs
// in a container, beside the engine rather than on its host.
func inAContainer() bool {
	_, err := os.Stat("/.dockerenv")
	return err == nil
}

func labels() testcontainers.CustomizeRequestOption {
	return testcontainers.WithLabels(map[string]string{Label: strconv.Itoa(os.Getpid())})
}

// keep registers the removal of c at Cleanup when it started (err is nil),
// and removes what was created of it at once when it did not.
func keep(c testcontainers.Container, err error) error {
	remove := func() {
		if err := testcontainers.TerminateContainer(c); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		}
	}
	if err != nil {
		remove()
		return err
	}
	AtExit(remove)
	return nil
}

// PostgresURL returns the URL of a PostgreSQL server, or skips t.
func PostgresURL(t testing.TB) string { t.Helper(); return postgres.need(t) }

// RedisURL returns the URL of a Redis server, or skips t.
func RedisURL(t testing.TB) string { t.Helper(); return redis.need(t) }

// FindPostgres returns the URL of a PostgreSQL server, or why there is none.
func FindPostgres() (string, error) { return postgres.find() }

// FindRedis returns the URL of a Redis server, or why there is none.
func FindRedis() (string, error) { return redis.find() }

func (s *server) need(t testing.TB) string {
	t.Helper()
	u, err := s.find()
	if err != nil {
		Unavailable(t, s.what, err)
	}
	return u
}

var (
	dockerOnce sync.Once
	dockerErr  error
)

// docker reports whether a Docker engine answers testcontainers, having
// first disabled Ryuk where its image is absent.
func docker() error {
	dockerOnce.Do(func() {
		disableRyukWithoutImage()
		// testcontainers panics on some hosts without an engine; that
		// is an answer too.
		defer func() {
			if r := recover(); r != nil {
				dockerErr = fmt.Errorf("%v", r)
			}
		}()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			dockerErr = err
			return
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		dockerErr = p.Health(ctx)
	})
	return dockerErr
}

// disableRyukWithoutImage sets TESTCONTAINERS_RYUK_DISABLED=true when the
// engine lacks Ryuk's image: with no registry to pull it from, every
// container start would fail on it. testcontainers reads its configuration
// once, at its first use, so this runs before anything else of it, with a
// plain Docker client (DOCKER_HOST or the default socket). Where that finds
// no engine, or the variable is set already, nothing changes.
func disableRyukWithoutImage() {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") != "" {
		return
	}
	//lint:ignore SA1019 deprecated as an option, still the image Ryuk runs
	image := testcontainers.ReaperDefaultImage
	if prefix := os.Getenv("TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX"); prefix != "" {
		image = path.Join(prefix, image)
	}
	if present, known := imagePresent(image); known && !present {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
}

// imagePresent reports whether the Docker engine at DOCKER_HOST (or the
// default socket) has image; known is false when no engine answered there.
func imagePresent(image string) (present, known bool) {
	c, err := client.New(client.FromEnv)
	if err != nil {
		return false, false
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Ping(ctx, client.PingOptions{}); err != nil {
		return false, false
	}
	_, err = c.ImageInspect(ctx, image)
	return err == nil, true
}

// FreePort returns a loopback TCP port that was free a moment ago, for a
// private server a test starts. It is drawn at random from below the
// kernel's ephemeral range (EphemeralLow), 2 000 to 10 000 under it: a
// port the kernel hands out could be taken by another test's outgoing
// connection between this look and the server's bind, and the server would
// fail to start. The 2 000 ports right under the range, and those 10 000
// below them, are left to callers that need a pair 10 000 apart (a Redis
// Cluster node and its bus).
func FreePort(t testing.TB) int {
	t.Helper()
	low := EphemeralLow()
	for range 1000 {
		if p := low - 10000 + rand.IntN(8000); PortFree(p) {
			return p
		}
	}
	t.Fatalf("no free port in %d to %d", low-10000, low-2000)
	return 0
}

// PortFree reports whether a listener could bind port on 127.0.0.1 now.
func PortFree(port int) bool {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// EphemeralLow is the first port of the kernel's ephemeral range, from which
// it picks the local ports of outgoing connections: Linux's
// /proc/sys/net/ipv4/ip_local_port_range, or its default 32768 where that
// cannot be read or leaves fewer than 13 024 ports below it.
func EphemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000+1024 {
				low = v
			}
		}
	}
	return low
}

// WaitFor calls ok every 50 ms until it reports true, and fails t, naming
// what it waited for, when limit has passed first.
func WaitFor(t testing.TB, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
