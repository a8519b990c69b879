// Command countlimit runs the countlimit service and its operator tools.
// Run "countlimit help" for the commands.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	// Rule files name IANA time zones; embed the database so the binary
	// finds them on hosts without /usr/share/zoneinfo.
	_ "time/tzdata"

	"github.com/countlimit/countlimit/internal/service/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process at once
	}()
	code := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
