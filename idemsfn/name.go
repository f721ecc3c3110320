package idemsfn

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/seed-a1b882c0/idem"
)

// MaxExecutionNameLen is the longest execution name Step Functions accepts.
const MaxExecutionNameLen = 80

// maxNamePrefix is the longest part of an execution name taken from the
// operation; the rest, at least 48 hex digits (192 bits), is the hash.
const maxNamePrefix = 31

// ExecutionName returns the execution name of key: the operation name with
// every character Step Functions might refuse ('.' and ':') made '_', cut
// to 31 characters, then "-" and the hex SHA-256 of the whole store key
// (operation, tenant and digest), cut to fit 80 characters. It is
// deterministic — every process derives the same name for a key, which is
// what makes a restarted start adopt the execution an earlier claim
// started — and two keys share a name only if their hashes collide in at
// least 192 bits. Only the characters A-Z a-z 0-9 - _ appear in it.
func ExecutionName(key idem.StoreKey) string {
	sum := sha256.Sum256([]byte(key.String()))
	var b [MaxExecutionNameLen]byte
	n := 0
	for i := 0; i < len(key.Operation) && n < maxNamePrefix; i++ {
		c := key.Operation[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			c = '_'
		}
		b[n] = c
		n++
	}
	if n == 0 {
		n = copy(b[:], "idem")
	}
	b[n] = '-'
	n++
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	n += copy(b[n:], hx[:])
	return string(b[:n])
}
