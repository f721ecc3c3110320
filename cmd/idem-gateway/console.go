package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/seed-a1b882c0/idem/console"
	"github.com/seed-a1b882c0/idem/idemhttp"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/storeurl"
)

// consolePath is where the admin listener serves the operator console.
const consolePath = "/console/"

// envConsoleAuth holds the console's sign-in credentials when
// -console-auth-file is not given (as for idemctl serve).
const envConsoleAuth = "IDEM_CONSOLE_AUTH"

// consoleOptions are the -console flags.
type consoleOptions struct {
	on, write bool
	authFile  string
	refLink   string
	creds     []console.Credential
	// signIn holds the sign-in and proxy flags (-console-secure-cookies,
	// -console-trusted-proxies, …), set by applySignIn.
	signIn      console.Config
	applySignIn func() error
}

func (c *consoleOptions) define(fs *flag.FlagSet) {
	fs.BoolVar(&c.on, "console", false, "serve the operator console for the gateway's store on -admin at "+consolePath+" (read-only unless -console-write)")
	fs.BoolVar(&c.write, "console-write", false, "let the console release, delete and resolve records; needs credentials (-console-auth-file or $"+envConsoleAuth+")")
	fs.StringVar(&c.authFile, "console-auth-file", "", "the console's sign-in credentials: USER:PASSWORD or a token, one a line (default $"+envConsoleAuth+")")
	fs.StringVar(&c.refLink, "console-ref-link", "", "link execution references that are not Step Functions ARNs through this URL, {ref} standing for the reference")
	c.applySignIn = c.signIn.DefineSignInFlags(fs, "console-")
}

// check validates the flags once parsed and reads the credentials.
func (c *consoleOptions) check(admin string, getenv func(string) string) error {
	if !c.on {
		if c.write || c.authFile != "" || c.refLink != "" {
			return errors.New("-console-write, -console-auth-file and -console-ref-link need -console")
		}
		return nil
	}
	if admin == "" {
		return errors.New("-console needs -admin: the console is served on the admin listener")
	}
	if err := c.applySignIn(); err != nil {
		return err
	}
	src, name := getenv(envConsoleAuth), "$"+envConsoleAuth
	if c.authFile != "" {
		b, err := os.ReadFile(c.authFile)
		if err != nil {
			return fmt.Errorf("-console-auth-file: %w", err)
		}
		src, name = string(b), "-console-auth-file"
	}
	if src != "" {
		creds, err := console.ParseCredentials(strings.NewReader(src))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		c.creds = creds
	}
	if c.write && len(c.creds) == 0 {
		return fmt.Errorf("-console-write needs credentials: -console-auth-file FILE or $%s", envConsoleAuth)
	}
	return nil
}

// openConsole makes the console of the gateway's store when -console is
// set (nil otherwise), once the store is open; closeConsole stops it.
func (g *gateway) openConsole(s store.Store) (*console.Console, error) {
	if !g.opts.console.on {
		return nil, nil
	}
	actions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_console_actions_total",
		Help: "Actions taken through the operator console, by action and outcome (done, refused, error)."}, []string{"action", "outcome"})
	g.metrics.reg.MustRegister(actions)
	cfg := g.opts.console.signIn
	cfg.Name, cfg.Write, cfg.Credentials = storeurl.Redact(g.opts.store), g.opts.console.write, g.opts.console.creds
	cfg.BasePath, cfg.RefLink, cfg.Logger, cfg.Owner = consolePath, g.opts.console.refLink, g.log, "idem-gateway-console"
	cfg.OnAction = func(ev console.ActionEvent) { actions.WithLabelValues(string(ev.Action), ev.Outcome).Inc() }
	return console.New(s, &cfg)
}

func (g *gateway) closeConsole() {
	if rd := g.ready.Load(); rd != nil && rd.console != nil {
		rd.console.Close()
	}
}

// mountConsole serves the console on the admin mux: 503 while the store is
// not open yet (-store-wait).
func (g *gateway) mountConsole(mux *http.ServeMux) {
	if !g.opts.console.on {
		return
	}
	mux.Handle(consolePath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rd := g.ready.Load()
		if rd == nil || rd.console == nil {
			idemhttp.WriteProblem(w, r, g.notOpen())
			return
		}
		rd.console.ServeHTTP(w, r)
	}))
}
