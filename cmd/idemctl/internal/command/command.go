// Package command is idemctl's command tree, one file per command; main
// only calls [Run]. Everything a command touches outside itself (streams,
// environment, terminal, clock, how a store is opened) comes through
// [Env], so tests run every command in process.
package command

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// Exit codes.
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitError: it failed (store unreachable, record changed underneath,
	// confirmation refused); the reason is on stderr.
	ExitError = 1
	// ExitUsage: the command line is wrong; the reason and usage are on
	// stderr.
	ExitUsage = 2
	// ExitNotFound: the key has no live record.
	ExitNotFound = 3
)

// EnvStore is the environment variable -store defaults to.
const EnvStore = "IDEM_STORE"

// Env is the world a command runs in.
type Env struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Getenv reads an environment variable.
	Getenv func(string) string
	// StdinIsTerminal reports whether a person can answer a prompt.
	StdinIsTerminal func() bool
	// Clock is the time commands judge ages and leases by, and the clock
	// of the engine that writes, corrected to the store's clock when the
	// store tells its time and Clock is real time (store.ServerClock):
	// "stuck" is decided on the store's clock, as leases are. doctor
	// compares it with the store's as it is.
	Clock store.Clock
	// Open opens the store a -store URL names for inspection and manual
	// writes: passively (nothing migrated, created or swept). The closer
	// releases it.
	Open func(ctx context.Context, url string) (store.Store, func() error, error)
	// OpenReadOnly opens it for the commands that only read (list, show,
	// watch): as Open, and a bolt file read-only, so that they never change
	// it. Nil means Open.
	OpenReadOnly func(ctx context.Context, url string) (store.Store, func() error, error)
	// OpenWait opens it as Open does, retrying with backoff for as long as
	// wait (a store that is still starting, a blip), for serve. Nil means
	// Open, once.
	OpenWait func(ctx context.Context, url string, wait time.Duration, logf func(format string, args ...any)) (store.Store, func() error, error)
	// Listen opens serve's and watch's listeners. Default net.Listen.
	Listen func(network, addr string) (net.Listener, error)
}

// System is the Env of the real process.
func System() Env {
	return Env{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Getenv:          os.Getenv,
		StdinIsTerminal: stdinIsTerminal,
		Clock:           store.SystemClock{},
		Listen:          net.Listen,
		Open:            openStore(false),
		OpenReadOnly:    openStore(true),
		OpenWait: func(ctx context.Context, url string, wait time.Duration, logf func(string, ...any)) (store.Store, func() error, error) {
			s, err := storeurl.OpenWait(ctx, url, &storeurl.Options{Passive: true}, storeurl.WaitOptions{Wait: wait, OnRetry: func(r storeurl.Retry) {
				logf("idemctl: store not open yet (attempt %d: %v); again in %v, %v left of -store-wait", r.Attempt, r.Err, r.Next.Round(time.Millisecond), r.Left.Round(time.Second))
			}})
			if err != nil {
				return nil, nil, err
			}
			return s.Store, s.Close, nil
		},
	}
}

func openStore(readOnly bool) func(ctx context.Context, url string) (store.Store, func() error, error) {
	return func(ctx context.Context, url string) (store.Store, func() error, error) {
		s, err := storeurl.Open(ctx, url, &storeurl.Options{Passive: true, ReadOnly: readOnly})
		if err != nil {
			return nil, nil, err
		}
		return s.Store, s.Close, nil
	}
}

// stdinIsTerminal reports whether stdin is a character device (a
// terminal), without a dependency on a terminal package.
func stdinIsTerminal() bool {
	fi, err := os.Stdin.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// command is one subcommand.
type command struct {
	name, args, summary string
	// flags defines the command's flags on fs and returns the function
	// that runs it with the positional arguments.
	flags func(fs *flag.FlagSet, c *ctl) func(ctx context.Context, args []string) error
}

func commands() []command {
	return []command{listCommand, showCommand, findCommand, releaseCommand, resolveCommand, deleteCommand, migrateCommand, createTableCommand, watchCommand, serveCommand, doctorCommand}
}

// ctl is one run of idemctl: its environment and global flags.
type ctl struct {
	env   Env
	store string
}

// usageError is a wrong command line: exit 2, with usage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// Run runs idemctl with args (without the program name) and returns its
// exit code.
func Run(ctx context.Context, args []string, env Env) int {
	c := &ctl{env: env}
	global := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	global.StringVar(&c.store, "store", "", "the store URL (default $"+EnvStore+")")
	global.Usage = func() {}
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(env.Stdout)
			return ExitOK
		}
		return c.fail(usagef("%v", err), nil)
	}
	rest := global.Args()
	if len(rest) == 0 {
		c.usage(env.Stderr)
		return ExitUsage
	}
	name := rest[0]
	if name == "help" {
		c.usage(env.Stdout)
		return ExitOK
	}
	for _, cmd := range commands() {
		if cmd.name != name {
			continue
		}
		fs := flag.NewFlagSet("idemctl "+cmd.name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.StringVar(&c.store, "store", c.store, "the store URL (default $"+EnvStore+")")
		run := cmd.flags(fs, c)
		pos, err := parseInterleaved(fs, rest[1:])
		if errors.Is(err, flag.ErrHelp) {
			cmdUsage(env.Stdout, cmd, fs)
			return ExitOK
		}
		if err != nil {
			return c.fail(usagef("%v", err), func(w io.Writer) { cmdUsage(w, cmd, fs) })
		}
		if err := run(ctx, pos); err != nil {
			return c.fail(err, func(w io.Writer) { cmdUsage(w, cmd, fs) })
		}
		return ExitOK
	}
	return c.fail(usagef("unknown command %q", name), c.usage)
}

// fail prints err and returns its exit code; usage is printed after a
// usage error.
func (c *ctl) fail(err error, usage func(io.Writer)) int {
	fmt.Fprintln(c.env.Stderr, "idemctl:", err)
	var ue *usageError
	switch {
	case errors.As(err, &ue):
		if usage != nil {
			fmt.Fprintln(c.env.Stderr)
			usage(c.env.Stderr)
		}
		return ExitUsage
	case errors.Is(err, store.ErrNotFound):
		return ExitNotFound
	}
	return ExitError
}

func (c *ctl) usage(w io.Writer) {
	fmt.Fprintln(w, "usage: idemctl [-store URL] COMMAND [flags] [args]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Inspect and settle the records of an idem store. -store defaults to $"+EnvStore+":")
	fmt.Fprintln(w, "memory:, bolt:///path.db, redis://host:port/db?prefix=P, postgres://user@host/db?table=T,")
	fmt.Fprintln(w, "dynamodb://TABLE?region=R&endpoint=URL&index=I.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, cmd := range commands() {
		fmt.Fprintf(w, "  %-13s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "exit codes: 0 ok, 1 error, 2 bad command line, 3 no such record.")
	fmt.Fprintln(w, "idemctl COMMAND -h describes a command.")
}

func cmdUsage(w io.Writer, cmd command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: idemctl %s [flags] %s\n\n%s\n\nflags:\n", cmd.name, cmd.args, cmd.summary)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// parseInterleaved parses flags anywhere among the positional arguments
// ("show KEY -o json" as well as "show -o json KEY"); "--" ends the flags.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// open opens the store of -store, or $IDEM_STORE.
func (c *ctl) open(ctx context.Context) (store.Store, func() error, error) {
	return c.openWith(ctx, c.env.Open)
}

// openReadOnly opens the store of -store for a command that only reads.
func (c *ctl) openReadOnly(ctx context.Context) (store.Store, func() error, error) {
	if c.env.OpenReadOnly == nil {
		return c.open(ctx)
	}
	return c.openWith(ctx, c.env.OpenReadOnly)
}

// openWaiting opens the store of -store, retrying for as long as wait.
func (c *ctl) openWaiting(ctx context.Context, wait time.Duration) (store.Store, func() error, error) {
	if c.env.OpenWait == nil {
		return c.open(ctx)
	}
	st, closeStore, err := c.openWith(ctx, func(ctx context.Context, url string) (store.Store, func() error, error) {
		return c.env.OpenWait(ctx, url, wait, func(format string, args ...any) { fmt.Fprintf(c.env.Stderr, format+"\n", args...) })
	})
	var we *storeurl.WaitError
	if errors.As(err, &we) {
		err = fmt.Errorf("%w; start it again once the store answers, or raise -store-wait", err)
	}
	return st, closeStore, err
}

// openWith opens the store of -store with open.
func (c *ctl) openWith(ctx context.Context, open func(ctx context.Context, url string) (store.Store, func() error, error)) (store.Store, func() error, error) {
	url := c.storeURL()
	if url == "" {
		return nil, nil, usagef("no store: give -store URL or set $%s", EnvStore)
	}
	return open(ctx, url)
}

func (c *ctl) storeURL() string {
	if c.store != "" {
		return c.store
	}
	return c.env.Getenv(EnvStore)
}

// lister returns s's listing power, or an error saying it has none.
func lister(s store.Store) (store.Lister, error) {
	l, ok := s.(store.Lister)
	if !ok {
		return nil, fmt.Errorf("this store (%T) cannot list records", s)
	}
	return l, nil
}

// listen opens a listener on addr.
func (c *ctl) listen(addr string) (net.Listener, error) {
	if c.env.Listen == nil {
		return net.Listen("tcp", addr)
	}
	return c.env.Listen("tcp", addr)
}

// now is this machine's time, uncorrected (doctor compares it with the
// store's); records are judged at ops.Operator.Now, the store's.
func (c *ctl) now() time.Time { return c.env.Clock.Now() }

// logger writes to stderr.
func (c *ctl) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(c.env.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// confirm asks before a write: --yes answers for the operator; without it
// a person must answer y on a terminal, and a stdin that is not a terminal
// (a script, a pipe) is refused.
func (c *ctl) confirm(yes bool, question string) error {
	if yes {
		return nil
	}
	if c.env.StdinIsTerminal == nil || !c.env.StdinIsTerminal() {
		return errors.New("refusing to write without --yes: stdin is not a terminal, so no one can confirm")
	}
	fmt.Fprintf(c.env.Stderr, "%s [y/N] ", question)
	line, err := bufio.NewReader(c.env.Stdin).ReadString('\n')
	if err != nil && line == "" {
		return errors.New("not confirmed: no answer")
	}
	if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
		return errors.New("not confirmed; nothing was written")
	}
	return nil
}
