package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/internal/service/clikit"
	"github.com/countlimit/countlimit/internal/service/rulefile"
	"github.com/countlimit/countlimit/internal/service/server"
)

// DefaultAddr is where serve listens unless told otherwise: loopback, so a
// fresh start exposes nothing. Use --addr :8080 in a container.
const DefaultAddr = "127.0.0.1:8080"

// MinTokenLen is the shortest bearer token serve accepts.
const MinTokenLen = 16

// DefaultPurgeInterval is how often serve purges expired rows on
// PostgreSQL unless --purge-interval says otherwise: often enough that
// count_limit stays near the size of its live rows, and each pass, at
// most a few batches on a table that is purged, costs little beside the
// checks.
const DefaultPurgeInterval = 5 * time.Minute

// startTimeout bounds serve's first ping of its store, so that a store
// whose address drops packets does not hold the start for minutes.
const startTimeout = 5 * time.Second

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := clikit.NewFlagSet("serve")
	def := os.Getenv("COUNTLIMIT_ADDR")
	if def == "" {
		def = DefaultAddr
	}
	addr := fs.String("addr", def, "listen `ADDR` (default $COUNTLIMIT_ADDR, else "+DefaultAddr+")")
	storeURL := clikit.StoreFlag(fs, "memory", "postgres://..., redis://... or memory")
	rulesPath := fs.String("rules", "", "YAML rule `FILE` (default: the built-in example rules)")
	migrate := fs.Bool("migrate", false, "apply the PostgreSQL migrations at start")
	level := fs.String("log-level", "info", "log `LEVEL`: debug, info, warn or error")
	tokenFile := fs.String("token-file", "", "`FILE` holding the bearer token the API requires (beats $COUNTLIMIT_TOKEN)")
	leaseKey := leaseKeyFlag(fs)
	insecure := fs.Bool("insecure", false, "serve beyond loopback without a token")
	metricsAddr := fs.String("metrics-addr", "", "serve /metrics on this `ADDR`, with no token, instead of on --addr")
	storeTimeout := fs.Duration("store-timeout", time.Second, "give up on a store call after this long (503); 0: only the request's 5s bound")
	breakerFailures := fs.Int("breaker-failures", 5, "open the circuit breaker after `N` store failures in a row; 0: no breaker")
	breakerCoolDown := fs.Duration("breaker-cooldown", time.Second, "how long the open breaker answers 503 without calling the store before one probe")
	maxConns := fs.Int("max-conns", 0, "keep at most `N` HTTP connections open (--addr's and --metrics-addr's together); 0: the file limit less headroom")
	purgeInterval := fs.Duration("purge-interval", DefaultPurgeInterval, "on PostgreSQL, purge expired rows and leases in the background about every `duration`; 0: never")
	requirePersistence := fs.Bool("require-redis-persistence", false, "on Redis, answer /healthz 503 while the server persists nothing (neither AOF nor RDB snapshots), not only warn")
	purgeBatch := fs.Int("purge-batch", pgstore.DefaultPurgeBatchSize, fmt.Sprintf("delete at most `N` rows per purge statement (1 to %d)", pgstore.MaxBatchSize))
	if err := clikit.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return clikit.UsageErrorf("serve: unexpected argument %q", fs.Arg(0))
	}
	url, err := storeURL()
	if err != nil {
		return err
	}
	switch {
	case *storeTimeout < 0:
		return clikit.UsageErrorf("serve: --store-timeout must not be negative, got %v", *storeTimeout)
	case *breakerFailures < 0:
		return clikit.UsageErrorf("serve: --breaker-failures must not be negative, got %d", *breakerFailures)
	case *breakerCoolDown <= 0:
		return clikit.UsageErrorf("serve: --breaker-cooldown must be positive, got %v", *breakerCoolDown)
	case *maxConns < 0:
		return clikit.UsageErrorf("serve: --max-conns must not be negative, got %d", *maxConns)
	case *purgeInterval < 0:
		return clikit.UsageErrorf("serve: --purge-interval must not be negative (0 turns the purge off), got %v", *purgeInterval)
	case *purgeBatch < 1 || *purgeBatch > pgstore.MaxBatchSize:
		return clikit.UsageErrorf("serve: --purge-batch must be 1 to %d, got %d", pgstore.MaxBatchSize, *purgeBatch)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return clikit.UsageErrorf("serve: --log-level: %v", err)
	}
	token, err := loadToken(*tokenFile)
	if err != nil {
		return err
	}
	opts, err := leaseKey()
	if err != nil {
		return err
	}
	if err := checkExposure(*addr, token != "", *insecure); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	rf, err := clikit.LoadRules(*rulesPath)
	if err != nil {
		return err
	}
	// A store that does not answer yet (it may be starting beside us) does
	// not stop the service: it starts unhealthy and heals when the store
	// answers. Migrating needs the store, so --migrate fails instead.
	openCtx, cancelOpen := ctx, context.CancelFunc(func() {})
	if !*migrate {
		openCtx, cancelOpen = context.WithTimeout(ctx, startTimeout)
	}
	var storeDown error
	st, err := openStoreMaybeDown(openCtx, url, *migrate, log, &storeDown)
	cancelOpen()
	if err != nil {
		return err
	}
	defer st.close()
	if storeDown != nil && *migrate {
		return fmt.Errorf("serve --migrate: the store must answer at start to be migrated (start without --migrate, and run \"countlimit migrate up\" when it answers): %w", storeDown)
	}
	settings, warnings := storeChecks(ctx, st, log, storeDown == nil, *requirePersistence)

	conns := connLimit(*maxConns, st.conns(), log)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer ln.Close()
	var metricsLn net.Listener
	if *metricsAddr != "" {
		if metricsLn, err = net.Listen("tcp", *metricsAddr); err != nil {
			return fmt.Errorf("serve: --metrics-addr: %w", err)
		}
		defer metricsLn.Close()
	}
	metrics, observe := server.NewMetrics()
	opts = append(opts, countlimit.WithStoreTimeout(*storeTimeout), observe)
	if *breakerFailures > 0 {
		logChange := breakerLog(log)
		opts = append(opts, countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{
			Failures: *breakerFailures,
			CoolDown: *breakerCoolDown,
			OnChange: func(from, to countlimit.BreakerState) {
				logChange(from, to)
				metrics.BreakerChanged(from, to)
			},
		}))
	}
	// A schema behind this release's migrations does not stop the service
	// either: it holds checks back, and serves once it is migrated.
	var schema func(context.Context) error
	if st.behind != nil {
		schema = st.schemaReady
		log.Warn("the store's schema is behind this release: checks answer 503 until it is migrated", "err", st.behind)
	}
	var purges *server.Purges
	if st.pg != nil && *purgeInterval > 0 {
		purges = &server.Purges{}
	}
	handler := server.New(server.Config{
		Limiter:     countlimit.New(st.store, opts...),
		Metrics:     metrics,
		Rules:       rf,
		Ping:        st.ping,
		Settings:    settings,
		Warnings:    warnings,
		Logger:      log,
		Token:       token,
		OmitMetrics: metricsLn != nil,
		StartErr:    storeDown,
		Schema:      schema,
		Conns:       conns,
		Purges:      purges,
	})
	// Requests run under base, which is canceled if draining them takes too
	// long, so a stuck store cannot hold shutdown.
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	newServer := func(h http.Handler) *http.Server {
		srv := &http.Server{
			BaseContext:       func(net.Listener) context.Context { return base },
			Handler:           h,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      15 * time.Second,
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		if conns != nil {
			conns.Install(srv)
		}
		return srv
	}
	type listening struct {
		srv *http.Server
		ln  net.Listener
	}
	limited := func(ln net.Listener) net.Listener {
		if conns == nil {
			return ln
		}
		return conns.Listener(ln)
	}
	servers := []listening{{newServer(handler), limited(ln)}}
	if metricsLn != nil {
		servers = append(servers, listening{newServer(handler.Metrics()), limited(metricsLn)})
		fmt.Fprintf(stdout, "countlimit: metrics on http://%s/metrics\n", metricsLn.Addr())
	}
	if storeDown != nil {
		fmt.Fprintln(stdout, "countlimit: the store does not answer yet; serving anyway, unhealthy until it does")
	}
	if st.behind != nil {
		fmt.Fprintf(stdout, "countlimit: %v; serving anyway, unhealthy until it is migrated\n", st.behind)
	}
	if token == "" && !isLoopback(*addr) {
		log.Warn("serving beyond loopback with no token (--insecure): whoever reaches the address can reset and refund any id", "addr", ln.Addr().String())
	}
	from := rf.Name
	if from == rulefile.DefaultName {
		from = "the built-in example rules"
	}
	fmt.Fprintf(stdout, "countlimit: serving http://%s (store %s; %s and %s from %s)\n", ln.Addr(), st.desc,
		clikit.Plural(len(rf.Rules), "rule", "rules"), clikit.Plural(len(rf.Groups), "group", "groups"), from)
	attrs := []any{"addr", ln.Addr().String(), "store", st.desc, "rules", rf.Name, "token", token != ""}
	if metricsLn != nil {
		attrs = append(attrs, "metrics_addr", metricsLn.Addr().String())
	}
	if conns != nil {
		attrs = append(attrs, "max_conns", conns.Max())
	}
	if purges != nil {
		attrs = append(attrs, "purge_interval", purgeInterval.String())
	}
	log.Info("serving", attrs...)
	if purges != nil {
		stopPurge := startPurge(ctx, st.pg, *purgeInterval, *purgeBatch, purges, log)
		defer stopPurge() // before st.close: the pool waits for the purge's connection
	} else if st.pg == nil {
		ignoredPurgeFlags(fs, st, log)
	}
	if *requirePersistence && st.redis == nil {
		why := "PostgreSQL keeps its rows"
		if st.pg == nil {
			why = "memory counters live as long as the process, whatever the flag"
		}
		log.Info("--require-redis-persistence is ignored: the store is not Redis; " + why)
	}

	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- s.srv.Serve(s.ln) }()
	}
	select {
	case err := <-errc:
		for _, s := range servers {
			s.srv.Close()
		}
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var failed error
	for _, s := range servers {
		if err := s.srv.Shutdown(shutdown); err != nil && failed == nil {
			failed = fmt.Errorf("serve: shutdown: %w", err)
		}
	}
	if failed != nil {
		cancelBase()
		for _, s := range servers {
			s.srv.Close()
		}
		return failed
	}
	for range servers {
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	fmt.Fprintln(stdout, "countlimit: stopped")
	return nil
}

// connLimit returns the cap on serve's open connections: n, else
// server.DefaultMaxConns for the process's file limit and a store holding
// up to storeConns connections; nil (no cap) when n is 0 and the file
// limit is unknown or unlimited. Each connection holds a file, and a
// process out of files accepts nothing: without a cap, idle keep-alive
// connections alone could keep every new request waiting until they time
// out.
func connLimit(n, storeConns int, log *slog.Logger) *server.ConnLimit {
	files := server.FileLimit()
	if n == 0 {
		n = server.DefaultMaxConns(files, storeConns)
		if n == 0 {
			return nil
		}
	} else if files > 0 && n+storeConns >= files {
		log.Warn("--max-conns leaves no files for the rest of the process: at the file limit, idle connections are closed to accept new ones, and the store may fail to connect",
			"max_conns", n, "file_limit", files, "store_conns", storeConns)
	}
	return server.NewConnLimit(n, log)
}

// startPurge runs the background purge of expired rows and leases
// (pgstore.Store.PurgeEvery) until ctx ends or the returned func is
// called, which waits for it to stop. Each pass is one log line and goes
// into purges. A pass that fails is a warning, and the next tries again:
// the purge goes straight to the store, not through the Limiter, so it
// never opens the circuit breaker or fails a check.
func startPurge(ctx context.Context, pg *pgstore.Store, interval time.Duration, batch int, purges *server.Purges, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	report := func(p pgstore.PurgePass) {
		purges.Observe(p.Rows, p.Took, p.Err)
		took := p.Took.Round(time.Microsecond).String()
		if p.Err != nil {
			log.Warn("purge failed; the next pass tries again", "rows", p.Rows, "batches", p.Batches, "took", took, "err", p.Err)
			return
		}
		log.Info("purged expired rows", "rows", p.Rows, "batches", p.Batches, "took", took)
	}
	go func() {
		defer close(done)
		// It returns only when ctx ends: its arguments were checked.
		_ = pg.PurgeEvery(ctx, interval, pgstore.WithPurgeBatchSize(batch), pgstore.WithPurgeReport(report))
	}()
	return func() {
		cancel()
		<-done
	}
}

// ignoredPurgeFlags notes the purge flags given for a store that expires
// its own keys, where they do nothing.
func ignoredPurgeFlags(fs *flag.FlagSet, st *opened, log *slog.Logger) {
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "purge-interval" || f.Name == "purge-batch" {
			given = append(given, "--"+f.Name)
		}
	})
	if len(given) == 0 {
		return
	}
	why := "memory counters expire on their own"
	if st.redis != nil {
		why = "Redis keys expire on their own"
	}
	verb := "is"
	if len(given) > 1 {
		verb = "are"
	}
	log.Info(fmt.Sprintf("%s %s ignored: %s", strings.Join(given, " and "), verb, why))
}

// breakerLog logs the breaker opening and closing, one line each; its
// probes in between (open → half-open → open, once per cool-down) are not
// news.
func breakerLog(log *slog.Logger) func(from, to countlimit.BreakerState) {
	return func(from, to countlimit.BreakerState) {
		switch {
		case from == countlimit.BreakerClosed:
			log.Warn("circuit breaker open: checks answer 503 without calling the store until a probe succeeds")
		case to == countlimit.BreakerClosed:
			log.Info("circuit breaker closed: the store answers again")
		}
	}
}

// loadToken returns the bearer token the API requires: the contents of
// file (white space around it trimmed) when file is set, else
// $COUNTLIMIT_TOKEN; "" when neither is set. A token must be at least
// MinTokenLen printable ASCII characters with no spaces, so that it fits in
// a header as sent.
func loadToken(file string) (string, error) {
	tok, from := os.Getenv("COUNTLIMIT_TOKEN"), "$COUNTLIMIT_TOKEN"
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("serve: --token-file: %w", err)
		}
		tok, from = strings.TrimSpace(string(b)), "--token-file "+file
		if tok == "" {
			return "", fmt.Errorf("serve: %s is empty", from)
		}
	}
	if tok == "" {
		return "", nil
	}
	if len(tok) < MinTokenLen {
		return "", fmt.Errorf("serve: the token from %s is %d characters long, want at least %d (try: openssl rand -hex 32)", from, len(tok), MinTokenLen)
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] <= ' ' || tok[i] > '~' {
			return "", fmt.Errorf("serve: the token from %s holds a space, a control character or non-ASCII; want printable ASCII", from)
		}
	}
	return tok, nil
}

// checkExposure refuses a listen address beyond loopback when no token is
// set and insecure is false: whoever reaches the address could reset and
// refund any id.
func checkExposure(addr string, token, insecure bool) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("serve: --addr: %w", err)
	}
	if token || insecure || isLoopback(addr) {
		return nil
	}
	return fmt.Errorf("serve: --addr %s listens beyond loopback, and no token is set: whoever reaches it could reset and refund any id. "+
		"Set --token-file FILE or $COUNTLIMIT_TOKEN (callers then send \"Authorization: Bearer <token>\"), "+
		"or pass --insecure to serve without one", addr)
}

// isLoopback reports whether the listen address addr is on loopback only:
// localhost, 127.0.0.0/8 or ::1. An empty host (":8080"), 0.0.0.0, :: and
// any other name are not.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
