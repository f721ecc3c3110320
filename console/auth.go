package console

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Credential lets one operator sign in: a user and a password, or a token
// (User empty).
type Credential struct {
	User, Secret string
}

// ParseCredentials reads credentials, one a line: USER:PASSWORD, or a
// token alone (a line without a colon). Blank lines and lines starting
// with # are skipped. Give them in a file or an environment variable,
// never in a URL or on a command line.
func ParseCredentials(r io.Reader) ([]Credential, error) {
	var out []Credential
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, secret, ok := strings.Cut(line, ":")
		if !ok {
			user, secret = "", line
		}
		switch {
		case ok && user == "":
			return nil, fmt.Errorf("credentials line %d: empty user before the colon (a token is a line without a colon)", n)
		case secret == "":
			return nil, fmt.Errorf("credentials line %d: empty password for user %q", n, user)
		case len(secret) < 12:
			return nil, fmt.Errorf("credentials line %d: the secret is %d characters; use at least 12", n, len(secret))
		}
		out = append(out, Credential{User: user, Secret: secret})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no credentials: want USER:PASSWORD or a token, one a line")
	}
	return out, nil
}

// who is a credential's name in logs and pages.
func (cr Credential) who() string {
	if cr.User == "" {
		return "token"
	}
	return cr.User
}

// match finds the credential user and secret name, comparing in constant
// time (over SHA-256 digests, so lengths do not leak either).
func (c *Console) match(user, secret string) (Credential, bool) {
	sh := sha256.Sum256([]byte(secret))
	var found Credential
	ok := false
	for _, cr := range c.cfg.Credentials {
		h := sha256.Sum256([]byte(cr.Secret))
		same := subtle.ConstantTimeCompare(h[:], sh[:]) == 1 && subtle.ConstantTimeCompare([]byte(cr.User), []byte(user)) == 1
		if same && !ok {
			found, ok = cr, true
		}
	}
	return found, ok
}

// knownUser is how a sign-in's user is named in logs and throttled: the
// user of a credential, "token" for a sign-in without one, and
// "(unknown)" for any other name, which is never logged (it may be a
// password typed into the wrong field).
func (c *Console) knownUser(user string) string {
	if user == "" {
		return "token"
	}
	for _, cr := range c.cfg.Credentials {
		if cr.User != "" && subtle.ConstantTimeCompare([]byte(cr.User), []byte(user)) == 1 {
			return cr.User
		}
	}
	return "(unknown)"
}

// session is one sign-in.
type session struct {
	user    string
	csrf    string
	expires time.Time
}

type sessions struct {
	mu sync.Mutex
	m  map[string]*session
}

const sessionCookie = "idem_console"

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// cookie is a cookie of the console: HttpOnly, SameSite=Strict, Secure
// when the browser reached the console over TLS (see [Console.secure]),
// scoped to the base path.
func (c *Console) cookie(r *http.Request, name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: c.cfg.BasePath, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.secure(r)}
}

// current returns the request's live session, or nil.
func (c *Console) current(r *http.Request) *session {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	c.sess.mu.Lock()
	defer c.sess.mu.Unlock()
	s := c.sess.m[ck.Value]
	if s == nil || !c.now().Before(s.expires) {
		delete(c.sess.m, ck.Value)
		return nil
	}
	return s
}

// signedIn runs h with the request's session. With credentials, a request
// without one is sent to sign in (GET) or refused with 401 (POST); every
// POST must carry the session's CSRF token, or gets 403. (Cross-origin
// POSTs are refused before, by http.CrossOriginProtection in ServeHTTP;
// the session's token still guards a browser that sends neither
// Sec-Fetch-Site nor Origin.)
func (c *Console) signedIn(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := c.current(r)
		if len(c.cfg.Credentials) > 0 && s == nil {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, c.cfg.BasePath+"login", http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, http.StatusUnauthorized, "Sign in first: this console needs credentials, and the request carried no live session.")
			return
		}
		if r.Method == http.MethodPost {
			if err := r.ParseForm(); err != nil {
				c.fail(w, r, s, http.StatusBadRequest, "The form cannot be read: "+err.Error())
				return
			}
			if s == nil || subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(s.csrf)) != 1 {
				c.fail(w, r, s, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
				return
			}
		}
		h(w, r, s)
	}
}

// writer refuses h when writes are off.
func (c *Console) writer(h func(http.ResponseWriter, *http.Request, *session)) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		if !c.cfg.Write {
			c.fail(w, r, s, http.StatusForbidden, "This console is read-only: start it with writes enabled to settle records.")
			return
		}
		h(w, r, s)
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if len(c.cfg.Credentials) == 0 {
		http.Redirect(w, r, c.cfg.BasePath, http.StatusSeeOther)
		return
	}
	c.showLogin(w, r, http.StatusOK, "")
}

func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, code int, msg string) {
	c.render(w, r, nil, code, "login", "Sign in", map[string]any{"Message": msg})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if len(c.cfg.Credentials) == 0 {
		c.fail(w, r, nil, http.StatusNotFound, "This console has no sign-in.")
		return
	}
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, nil, http.StatusBadRequest, "The form cannot be read: "+err.Error())
		return
	}
	// A cross-origin sign-in (login CSRF) was refused in ServeHTTP.
	user, secret := r.PostForm.Get("user"), r.PostForm.Get("secret")
	now, client, who := c.now(), c.client(r), c.knownUser(user)
	keys := keysOf(client, who)
	if d := c.throttle.wait(now, keys.closing()...); d > 0 {
		secs := int64((d + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		c.showLogin(w, r, http.StatusTooManyRequests, fmt.Sprintf("Too many failed sign-ins: try again in %v.", time.Duration(secs)*time.Second))
		return
	}
	if d := c.throttle.hold(now, keys.user); d > 0 {
		// The user's sign-ins fail from many clients: hold this one,
		// whatever it carries, then check it. Slower, never refused.
		c.held.Add(1)
		select {
		case <-c.cfg.Clock.After(d):
			c.held.Add(-1)
		case <-r.Context().Done():
			c.held.Add(-1)
			return
		}
		now = c.now()
	}
	cr, ok := c.match(user, secret)
	if !ok {
		// One line at a burst's first failure, one each time its delay
		// grows (for the client and the user together): a summary, not
		// a line per guess.
		var by []string
		var worst failure
		for _, f := range c.throttle.fail(now, keys) {
			switch {
			case f.kind == "first" && f.key == keys.client:
				c.cfg.Logger.Warn("idem console: sign-in refused; further failures of this burst are summarised",
					"client", client, "user", who)
			case f.kind == "slowed":
				c.cfg.Logger.Warn("idem console: sign-in slowed for a user: failures from all clients passed the limit; each sign-in as the user is held, none refused",
					"user", who, "failures", f.burst.failures, "since", f.burst.first, "held_for", f.delay)
			case f.kind == "throttled":
				by = append(by, f.key)
				if f.burst.failures > worst.burst.failures {
					worst = f
				}
			}
		}
		if len(by) > 0 {
			c.cfg.Logger.Warn("idem console: sign-in throttled", "by", strings.Join(by, ", "), "client", client, "user", who,
				"failures", worst.burst.failures, "refused", worst.burst.refused, "since", worst.burst.first, "closed_for", worst.delay)
		}
		c.showLogin(w, r, http.StatusUnauthorized, "Wrong user, password or token.")
		return
	}
	failed := c.throttle.succeed(keys.closing()...)
	id := randomToken()
	c.sess.mu.Lock()
	for k, s := range c.sess.m {
		if !now.Before(s.expires) {
			delete(c.sess.m, k)
		}
	}
	c.sess.m[id] = &session{user: cr.who(), csrf: randomToken(), expires: now.Add(c.cfg.SessionTTL)}
	c.sess.mu.Unlock()
	http.SetCookie(w, c.cookie(r, sessionCookie, id, int(c.cfg.SessionTTL/time.Second)))
	c.cfg.Logger.Info("idem console: signed in", "user", cr.who(), "client", client, "failures_before", failed)
	http.Redirect(w, r, c.cfg.BasePath, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s *session) {
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.sess.mu.Lock()
		delete(c.sess.m, ck.Value)
		c.sess.mu.Unlock()
	}
	http.SetCookie(w, c.cookie(r, sessionCookie, "", -1))
	http.Redirect(w, r, c.cfg.BasePath+"login", http.StatusSeeOther)
}
