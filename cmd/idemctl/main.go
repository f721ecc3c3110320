// Command idemctl inspects and settles the records of an idem store: it
// lists stuck and failed work, shows a key's record, resolves or releases
// it by hand (refusing if the record changed underneath), applies the
// PostgreSQL schema, creates the DynamoDB table, watches a store for
// Prometheus, serves the operator console in the browser (serve), and
// checks a live store's settings (doctor). See docs/idemctl.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/seed-a1b882c0/idem/cmd/idemctl/internal/command"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := command.Run(ctx, os.Args[1:], command.System())
	stop()
	os.Exit(code)
}
