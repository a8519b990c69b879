package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/internal/server"
)

// DefaultAddr is where serve listens unless told otherwise: loopback, so a
// fresh start exposes nothing. Use --addr :8080 in a container.
const DefaultAddr = "127.0.0.1:8080"

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve")
	def := os.Getenv("COUNTLIMIT_ADDR")
	if def == "" {
		def = DefaultAddr
	}
	addr := fs.String("addr", def, "listen address (default $COUNTLIMIT_ADDR, else "+DefaultAddr+")")
	storeURL := storeFlag(fs)
	rulesPath := fs.String("rules", "", "YAML rule file (default: the built-in rules)")
	migrate := fs.Bool("migrate", false, "apply the PostgreSQL migrations at start")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("serve: unexpected argument %q", fs.Arg(0))
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		return usageErrorf("serve: --log-level: %v", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	rf, err := loadRules(*rulesPath)
	if err != nil {
		return err
	}
	st, err := openStore(ctx, *storeURL, *migrate, log)
	if err != nil {
		return err
	}
	defer st.close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	// Requests run under base, which is canceled if draining them takes too
	// long, so a stuck store cannot hold shutdown.
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	srv := &http.Server{
		BaseContext: func(net.Listener) context.Context { return base },
		Handler: server.New(server.Config{
			Limiter: countlimit.New(st.store),
			Rules:   rf,
			Ping:    st.ping,
			Logger:  log,
		}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	fmt.Fprintf(stdout, "countlimit: serving http://%s (store %s, rules %s: %d)\n", ln.Addr(), st.desc, rf.Name, len(rf.Names()))
	log.Info("serving", "addr", ln.Addr().String(), "store", st.desc, "rules", rf.Name)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		cancelBase()
		srv.Close()
		return fmt.Errorf("serve: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintln(stdout, "countlimit: stopped")
	return nil
}
