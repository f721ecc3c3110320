package clientkey

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/seed-a1b882c0/idem"
)

// HTTPIdentity is the identity of a request under idemhttp: the store key
// of [HTTPWithTenant] and the fingerprint, the hex of fingerprint (the
// SHA-256 idemhttp computes over the request), built in one allocation.
func HTTPIdentity(operation, tenant, method, route, key string, fingerprint [sha256.Size]byte) (idem.Identity, error) {
	var buf [512]byte // the key material, on the stack unless it is long
	material := append(buf[:0], method...)
	material = append(append(append(material, 0), route...), 0)
	material = append(material, key...)
	return idem.NewIdentity(operation, tenant, material, fingerprint)
}

// KeyIdentity is the identity of an explicit key (a message id, what an
// adapter's Config.Key returned, a Kafka record key): the store key of
// [Key] and, unless fingerprint is nil, the hex of *fingerprint (the
// SHA-256 of the message's payload, as the adapter defines it). Without
// a fingerprint no payload is compared. It fails as [Key] does.
func KeyIdentity(operation, tenant, key string, fingerprint *[sha256.Size]byte) (idem.Identity, error) {
	if key == "" || len(key) > idem.MaxKeyLen || fingerprint == nil {
		k, err := Key(operation, tenant, key)
		if err != nil {
			return idem.Identity{}, err
		}
		return idem.Identity{StoreKey: k}, nil
	}
	var buf [256]byte // the key material, on the stack unless it is long
	return idem.NewIdentity(operation, tenant, append(buf[:0], key...), *fingerprint)
}

// JSONIdentity is the identity of a JSON value (idemlambda's KeyJMESPath
// selection): the store key of [JSON] and, unless fingerprint is nil, the
// hex of *fingerprint.
func JSONIdentity(operation, tenant string, value []byte, fingerprint *[sha256.Size]byte) (idem.Identity, error) {
	k, err := JSON(operation, tenant, value)
	if err != nil {
		return idem.Identity{}, err
	}
	id := idem.Identity{StoreKey: k}
	if fingerprint != nil {
		id.Fingerprint = hex.EncodeToString(fingerprint[:])
	}
	return id, nil
}

// PayloadIdentity is the identity of a message keyed by its payload
// (idemkafka's and idemwatermill's default): the store key of [Payload],
// and the same digest as the fingerprint, so two messages with one key
// always carry one payload. The payload is hashed once.
func PayloadIdentity(operation, topic string, payload []byte) (idem.Identity, error) {
	if len(payload) == 0 {
		return idem.Identity{}, &idem.KeyError{Field: "payload", Value: "", Reason: "empty; there is nothing to derive the key from"}
	}
	return (&idem.Request{Operation: operation, Tenant: TopicTenant(topic), Payload: payload, RawPayload: true}).Identity()
}
