// Keys: a request's identity (store key: scope, tenant, digest) and its
// payload's fingerprint.

package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Limits on what a call names.
const (
	// MaxOperationLen is the longest operation name accepted.
	MaxOperationLen = 128
	// MaxTenantLen is the longest tenant accepted.
	MaxTenantLen = 256
	// MaxKeyLen is the longest explicit key material accepted.
	MaxKeyLen = 4096
	// MaxTokenLen is the longest token string [ParseToken] reads.
	MaxTokenLen = 4096
	// MaxRefLen is the longest execution reference [Engine.Attach]
	// accepts: room for any AWS ARN (2,048 characters) and a URL.
	MaxRefLen = 2048
	// MaxOwnerLabelLen is the longest label [WithOwnerLabel] keeps.
	MaxOwnerLabelLen = 128
	// MaxStepNameLen is the longest name a [Step] may have, in bytes.
	MaxStepNameLen = 200
)

// StoreKey is a parsed store key, "<scope>#<digest>" where the scope is the
// operation name, optionally followed by "/" and a tenant, and digest is the hex SHA-256
// of the key material.
type StoreKey struct {
	// Operation is the operation name: 1 to 128 characters of A-Z a-z 0-9 . _ : -
	Operation string
	// Tenant is optional: up to 256 printable ASCII characters, no '#'.
	Tenant string
	// Digest is the lowercase hex SHA-256 of the key material.
	Digest string

	s string // the store key, when already built
}

// String returns the store key.
func (k StoreKey) String() string {
	if k.s != "" {
		return k.s
	}
	if k.Tenant == "" {
		return k.Operation + "#" + k.Digest
	}
	return k.Operation + "/" + k.Tenant + "#" + k.Digest
}

// Scope returns the scope part of the key: the name, and the tenant if any.
func (k StoreKey) Scope() string {
	if k.Tenant == "" {
		return k.Operation
	}
	return k.Operation + "/" + k.Tenant
}

// NewStoreKey derives a store key from an operation name, an optional tenant and the
// key material, which is hashed.
func NewStoreKey(name, tenant string, material []byte) (StoreKey, error) {
	if err := validateName(name); err != nil {
		return StoreKey{}, err
	}
	if err := validateTenant(tenant); err != nil {
		return StoreKey{}, err
	}
	return makeKey(name, tenant, sha256.Sum256(material)), nil
}

// makeKey builds the store key in one allocation; Digest is a slice of it.
func makeKey(name, tenant string, sum [sha256.Size]byte) StoreKey {
	k, _, _ := makeIdentity(name, tenant, sum, nil)
	return k
}

// makeIdentity builds the store key and, when fp is not nil, the hex of
// *fp after it, preceded by the fingerprint rules' version, in one
// allocation: Digest, the fingerprint and its stored form
// (storedFingerprint) are slices of it.
func makeIdentity(name, tenant string, sum [sha256.Size]byte, fp *[sha256.Size]byte) (StoreKey, string, string) {
	var hx [2 * sha256.Size]byte
	n := 2 * sha256.Size
	hex.Encode(hx[:], sum[:])
	var b strings.Builder
	size := len(name) + 1 + len(tenant) + 1 + n
	if fp != nil {
		size += len(fingerprintPrefix) + n
	}
	b.Grow(size)
	b.WriteString(name)
	if tenant != "" {
		b.WriteByte('/')
		b.WriteString(tenant)
	}
	b.WriteByte('#')
	b.Write(hx[:])
	if fp != nil {
		b.WriteString(fingerprintPrefix)
		hex.Encode(hx[:], fp[:])
		b.Write(hx[:])
	}
	s := b.String()
	fingerprint, stored := "", ""
	if fp != nil {
		stored = s[len(s)-len(fingerprintPrefix)-n:]
		s, fingerprint = s[:len(s)-len(stored)], s[len(s)-n:]
	}
	return StoreKey{Operation: name, Tenant: tenant, Digest: s[len(s)-n:], s: s}, fingerprint, stored
}

// NewIdentity derives the identity of a call whose fingerprint the caller
// hashed itself (an RPC adapter's request encoding): the store key from the
// operation name, an optional tenant and the key material, hashed, as
// [NewStoreKey] derives it, and the fingerprint, the hex of fingerprint.
// Both are built in one allocation. It fails with a [*KeyError] as
// NewStoreKey does.
func NewIdentity(name, tenant string, material []byte, fingerprint [sha256.Size]byte) (Identity, error) {
	if err := validateName(name); err != nil {
		return Identity{}, err
	}
	if err := validateTenant(tenant); err != nil {
		return Identity{}, err
	}
	k, fp, stored := makeIdentity(name, tenant, sha256.Sum256(material), &fingerprint)
	return Identity{StoreKey: k, Fingerprint: fp, stored: stored}, nil
}

// ParseStoreKey parses a store key as produced by [StoreKey.String].
func ParseStoreKey(s string) (StoreKey, error) {
	i := strings.LastIndexByte(s, '#')
	if i < 0 {
		return StoreKey{}, &KeyError{Field: "store key", Value: s, Reason: `missing "#" before the digest`}
	}
	scope, digest := s[:i], s[i+1:]
	if !isHexDigest(digest) {
		return StoreKey{}, &KeyError{Field: "store key", Value: s, Reason: "digest is not 64 lowercase hex characters"}
	}
	name, tenant, _ := strings.Cut(scope, "/")
	if err := validateName(name); err != nil {
		return StoreKey{}, err
	}
	if strings.Contains(scope, "/") && tenant == "" {
		return StoreKey{}, &KeyError{Field: "store key", Value: s, Reason: `empty tenant after "/"`}
	}
	if err := validateTenant(tenant); err != nil {
		return StoreKey{}, err
	}
	return StoreKey{Operation: name, Tenant: tenant, Digest: digest, s: s}, nil
}

func validateName(name string) error {
	if name == "" {
		return &KeyError{Field: "operation", Value: name, Reason: "empty; every call needs an operation name"}
	}
	if len(name) > MaxOperationLen {
		return &KeyError{Field: "operation", Value: name, Reason: "longer than 128 characters"}
	}
	for i := 0; i < len(name); i++ {
		if !nameByte[name[i]] {
			return &KeyError{Field: "operation", Value: name, Reason: "only A-Z a-z 0-9 . _ : - are allowed"}
		}
	}
	return nil
}

// nameByte says which bytes an operation name may hold: A-Z a-z 0-9 . _ : -
// (a table: names are checked on every call).
var nameByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-'
	}
	return t
}()

func validateTenant(t string) error {
	if len(t) > MaxTenantLen {
		return &KeyError{Field: "tenant", Value: t, Reason: "longer than 256 characters"}
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c < 0x21 || c > 0x7e || c == '#' {
			return &KeyError{Field: "tenant", Value: t, Reason: "only printable ASCII without spaces or '#' is allowed"}
		}
	}
	return nil
}

func isHexDigest(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Request names one protected call: what operation, for whom, under which
// key, with which payload. The engine derives the store key and the payload
// fingerprint from it once, before the operation runs.
type Request struct {
	// Operation is the operation name (required), such as "charge".
	Operation string
	// Tenant optionally narrows the scope to a tenant or principal, so that
	// two tenants using the same key never share a record.
	Tenant string
	// Key is the explicit idempotency key material (for example a client's
	// Idempotency-Key). When empty the key is derived from the payload.
	Key string
	// Payload is the request payload. It is fingerprinted, and a later call
	// with the same key and another payload fails with [ErrMismatch]. By
	// default it must be JSON and is canonicalised first (see [canonical.JSON]),
	// so that key order and white space do not matter.
	Payload []byte
	// RawPayload fingerprints Payload as raw bytes instead of canonical JSON.
	RawPayload bool
	// HoldCrashed claims the key under the takeover policy Hold (see
	// Config.HoldCrashed); Identity carries it on.
	HoldCrashed bool
}

// Identity is what the engine derives from a [Request]: the store key and
// the payload fingerprint.
type Identity struct {
	StoreKey StoreKey
	// Fingerprint is the hex digest of the payload, made by this release's
	// fingerprint rules; empty for no payload. The engine stores it with
	// the rules' version ("v1:" and the digest: docs/state-machine.md).
	Fingerprint string
	// HoldCrashed claims the key under the takeover policy Hold (see
	// Config.HoldCrashed).
	HoldCrashed bool

	// stored is Fingerprint's stored form, built with it (storedForm).
	stored string
}

// storedForm is the fingerprint as the engine stores and compares it
// (storedFingerprint): the one built with it when Fingerprint is still the
// one built, else made now.
func (id *Identity) storedForm() string {
	if id.stored != "" && id.stored[len(fingerprintPrefix):] == id.Fingerprint {
		return id.stored
	}
	return storedFingerprint(id.Fingerprint)
}

// Identity derives the store key and fingerprint of r (and carries its
// HoldCrashed). It fails with a [*KeyError] or a [*PayloadError] naming
// what is wrong.
func (r *Request) Identity() (Identity, error) {
	id, err := r.identity()
	id.HoldCrashed = r.HoldCrashed && err == nil
	return id, err
}

func (r *Request) identity() (Identity, error) {
	var fpSum [sha256.Size]byte
	if r.Payload != nil {
		b := r.Payload
		if !r.RawPayload {
			c, err := canonicalize(r.Payload)
			if err != nil {
				return Identity{}, err
			}
			b = c
		}
		fpSum = sha256.Sum256(b)
	}
	if r.Key != "" {
		if len(r.Key) > MaxKeyLen {
			return Identity{}, &KeyError{Field: "key", Value: r.Key, Reason: "longer than 4096 bytes"}
		}
		if r.Payload != nil {
			return NewIdentity(r.Operation, r.Tenant, []byte(r.Key), fpSum)
		}
		k, err := NewStoreKey(r.Operation, r.Tenant, []byte(r.Key))
		if err != nil {
			return Identity{}, err
		}
		return Identity{StoreKey: k}, nil
	}
	if r.Payload == nil {
		return Identity{}, &KeyError{Field: "key", Value: "", Reason: "empty, and there is no payload to derive it from"}
	}
	if err := validateName(r.Operation); err != nil {
		return Identity{}, err
	}
	if err := validateTenant(r.Tenant); err != nil {
		return Identity{}, err
	}
	// The key is the payload's digest: the fingerprint is the same hex.
	k, fp, stored := makeIdentity(r.Operation, r.Tenant, fpSum, &fpSum)
	return Identity{StoreKey: k, Fingerprint: fp, stored: stored}, nil
}
