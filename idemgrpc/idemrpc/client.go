package idemrpc

import (
	"context"
	"fmt"
	"strings"

	"github.com/seed-a1b882c0/idem"
)

// ClientConfig configures a [Client]. A nil *ClientConfig means all
// defaults; every field documents its default.
type ClientConfig struct {
	// KeyMetadata is the metadata entry the key is sent in, lower case.
	// Default [DefaultKeyMetadata].
	KeyMetadata string

	// Methods are the full method names whose calls get a key. Default:
	// every unary call (a server ignores the key of a method it does not
	// cover).
	Methods []string

	// NewKey returns a new key. Default [NewKey] (128 random bits, hex).
	NewKey func() string
}

// Client chooses the idempotency key of outgoing calls, for the client
// interceptors of packages idemgrpc and idemconnect.
type Client struct {
	cfg  ClientConfig
	only map[string]bool
}

// NewClient returns a Client. It fails with [idem.ErrInvalidConfig] naming
// a bad field.
func NewClient(cfg *ClientConfig) (*Client, error) {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	if c.KeyMetadata == "" {
		c.KeyMetadata = DefaultKeyMetadata
	}
	if c.NewKey == nil {
		c.NewKey = NewKey
	}
	if c.KeyMetadata != strings.ToLower(c.KeyMetadata) || !validMetadataName(c.KeyMetadata) || strings.HasSuffix(c.KeyMetadata, "-bin") {
		return nil, fmt.Errorf("%w: idemrpc: KeyMetadata %q must be a lower-case text metadata name (a-z 0-9 - _ .)", idem.ErrInvalidConfig, c.KeyMetadata)
	}
	cl := &Client{cfg: c}
	if c.Methods != nil {
		cl.only = make(map[string]bool, len(c.Methods))
		for _, m := range c.Methods {
			if _, _, ok := splitMethod(m); !ok {
				return nil, fmt.Errorf("%w: idemrpc: method %q is not a full method name such as /shop.v1.Orders/Create", idem.ErrInvalidConfig, m)
			}
			cl.only[m] = true
		}
	}
	return cl, nil
}

// KeyMetadata returns the metadata entry the key is sent in.
func (c *Client) KeyMetadata() string { return c.cfg.KeyMetadata }

// Key returns the key for a call of method that has none yet, and false
// when method gets no key (ClientConfig.Methods). Inside an operation run
// by an idem engine (idem.FromContext finds its claim) it is the claim's
// DownstreamKey for method, which stays the same when that operation is
// retried or taken over, so the effect downstream happens once too;
// otherwise a new key (ClientConfig.NewKey).
func (c *Client) Key(ctx context.Context, method string) (string, bool) {
	if c.only != nil && !c.only[method] {
		return "", false
	}
	if cl, ok := idem.FromContext(ctx); ok {
		return cl.DownstreamKey(method), true
	}
	return c.cfg.NewKey(), true
}
