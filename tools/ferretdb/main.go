// Command ferretdb runs FerretDB v1 with its SQLite backend for the Fibers local stack.
//
// It goes through FerretDB's embeddable package on purpose: FerretDB's own command, built from
// the module proxy, panics at start because its version files are not part of the module zip.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listen := flag.String("listen-addr", "127.0.0.1:27017", "TCP address to listen on")
	sqliteURL := flag.String("sqlite-url", "file:data/", "SQLite directory URL (must end with a slash)")
	debug := flag.Bool("debug", false, "log at debug level")
	flag.Parse()

	level := slog.LevelWarn
	if *debug {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	server, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: *listen},
		Logger:    logger,
		Handler:   "sqlite",
		SQLiteURL: *sqliteURL,
	})
	if err != nil {
		logger.Error("cannot start", "error", err)
		os.Exit(1)
	}
	logger.Warn("ferretdb listening", "address", *listen)
	if err := server.Run(ctx); err != nil {
		logger.Error("stopped", "error", err)
		os.Exit(1)
	}
}
