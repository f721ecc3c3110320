// Package clientkey turns what a client sent into the store key an adapter
// keeps its record under: the one function per adapter that the adapter
// itself calls, and that idemctl's find command and the console's search
// form call, so that an operator reaches a record from what the customer
// has (the Idempotency-Key they sent, the message id) and the two can
// never drift apart.
//
// Every adapter scopes the client's key before hashing it:
//
//	adapter                                   function  client-side material
//	idemhttp, the gateway, idemlambda's       HTTP      operation (the gateway's is "gateway"), method,
//	API Gateway and Function URL adapters               route (the URL path by default), principal, Idempotency-Key
//	idemgrpc, idemconnect                     RPC       operation (by default from the full method name), principal, key
//	idemnats, idemamqp, idemlambda's          Key       operation, the message id (Nats-Msg-Id, MessageId) or
//	FuncConfig.Key, idem.Request.Key                    what Config.Key returned
//	(idem.Do, Begin, idemsfn's Starter.Start),
//	idemkafka's KeyHeader and Key,                      the header's value, what Config.Key returned,
//	idemwatermill's KeyFromUUID,                        the message's UUID or metadata field
//	MetadataKey and Key
//	idemkafka's KeyFromRecordKey              Key       operation, the topic ([TopicTenant]), the record key
//	idemlambda's KeyJMESPath (SQS, EventBridge, JSON      operation, the selected value as JSON: SQS's
//	streams, any event), idem.Request without           messageId "\"…\"", EventBridge's id, a Kinesis
//	a Key (the payload; idemsfn's input)                record's ["eventSourceARN", "eventID"]
//	idemkafka, idemwatermill by default;      Payload   operation, the topic ([TopicTenant]; none for
//	idemnats when Config.Key returns ""                 idemnats), the payload (the record's value, the
//	                                                    message's data) as sent, byte for byte
//
// An adapter's identity (store key and fingerprint) comes from the
// function's Identity form ([HTTPIdentity], [RPCIdentity], [KeyIdentity],
// [JSONIdentity], [PayloadIdentity]), never from an [idem.Identity]
// literal of its own.
//
// An idemsfn execution's input carries its store key as it is ($.idem.key):
// no derivation is needed there.
//
// The package is in the core module and depends on the standard library
// and the root package only, so idemctl and the console use it without
// the transports' modules.
package clientkey

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/seed-a1b882c0/idem"
)

// GatewayOperation is the operation of every store key of the gateway
// (cmd/idem-gateway), which runs idemhttp with it.
const GatewayOperation = "gateway"

// DefaultHTTPOperation is idemhttp's operation when its Config.Operation
// is empty.
const DefaultHTTPOperation = "http"

// HTTPTenant returns the tenant of idemhttp's store keys for principal
// (Config.Principal's answer): "" for none, otherwise the principal
// hashed, so that no principal is stored in the clear.
func HTTPTenant(principal string) string { return principalTenant("idemhttp-principal\x00", principal) }

// RPCTenant returns the tenant of idemrpc's store keys (idemgrpc,
// idemconnect) for principal, as [HTTPTenant] does for idemhttp.
func RPCTenant(principal string) string { return principalTenant("idemrpc-principal\x00", principal) }

func principalTenant(label, p string) string {
	if p == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(label + p))
	return hex.EncodeToString(sum[:16])
}

// HTTP returns the store key of an Idempotency-Key under idemhttp: the
// key scoped by the operation, the principal (hashed, [HTTPTenant]), the
// request's method and its route (the URL path unless Config.Route says
// otherwise). The gateway's operation is [GatewayOperation] and its route
// the URL path.
func HTTP(operation, principal, method, route, key string) (idem.StoreKey, error) {
	return HTTPWithTenant(operation, HTTPTenant(principal), method, route, key)
}

// HTTPWithTenant is [HTTP] for a tenant already derived from the
// principal ([HTTPTenant]).
func HTTPWithTenant(operation, tenant, method, route, key string) (idem.StoreKey, error) {
	var buf [512]byte // the key material, on the stack unless it is long
	material := append(buf[:0], method...)
	material = append(append(append(material, 0), route...), 0)
	material = append(material, key...)
	return idem.NewStoreKey(operation, tenant, material)
}

// RPCOperation returns the default operation of a covered gRPC or Connect
// method: its full name ("/shop.v1.Orders/Create") without the leading
// slash, the other slash a dot ("shop.v1.Orders.Create"). ok is false
// when name is not a full method name.
func RPCOperation(name string) (op string, ok bool) {
	svc, meth, ok := SplitMethod(name)
	if !ok {
		return "", false
	}
	return svc + "." + meth, true
}

// SplitMethod splits a full method name, "/pkg.Service/Method", into its
// service and method.
func SplitMethod(name string) (svc, meth string, ok bool) {
	rest, ok := strings.CutPrefix(name, "/")
	if !ok {
		return "", "", false
	}
	svc, meth, ok = strings.Cut(rest, "/")
	if !ok || svc == "" || meth == "" || strings.Contains(meth, "/") {
		return "", "", false
	}
	return svc, meth, true
}

// RPC returns the store key of a call's idempotency key under idemrpc
// (idemgrpc and idemconnect): the key scoped by the method's operation
// ([RPCOperation] unless Method.Operation is set) and the principal
// (hashed, [RPCTenant]).
func RPC(operation, principal, key string) (idem.StoreKey, error) {
	return RPCWithTenant(operation, RPCTenant(principal), key)
}

// RPCWithTenant is [RPC] for a tenant already derived from the principal
// ([RPCTenant]).
func RPCWithTenant(operation, tenant, key string) (idem.StoreKey, error) {
	return idem.NewStoreKey(operation, tenant, []byte(key))
}

// RPCIdentity is the identity of a call under idemrpc: the store key of
// [RPCWithTenant] and the fingerprint, the hex of fingerprint (the SHA-256
// of the call's request material, which idemrpc hashes itself), built in
// one allocation ([idem.NewIdentity]).
func RPCIdentity(operation, tenant, key string, fingerprint [sha256.Size]byte) (idem.Identity, error) {
	var buf [256]byte // the key material, on the stack unless it is long
	return idem.NewIdentity(operation, tenant, append(buf[:0], key...), fingerprint)
}

// Key returns the store key of an explicit key: an [idem.Request]'s Key
// (idem.Do, Begin, idemsfn's Starter.Start), a message id (idemnats'
// Nats-Msg-Id, idemamqp's MessageId, idemwatermill's message UUID with
// KeyFromUUID, idemkafka's KeyHeader value) or what an
// adapter's Config.Key returned (idemnats, idemamqp, idemkafka,
// idemwatermill, idemlambda's FuncConfig.Key). It fails as
// [idem.Request.Identity] does, on a key longer than [idem.MaxKeyLen]
// among others.
func Key(operation, tenant, key string) (idem.StoreKey, error) {
	if key == "" {
		return idem.StoreKey{}, &idem.KeyError{Field: "key", Value: key, Reason: "empty"}
	}
	id, err := (&idem.Request{Operation: operation, Tenant: tenant, Key: key}).Identity()
	return id.StoreKey, err
}

// JSON returns the store key of a JSON value: what idemlambda's
// KeyJMESPath selected from an event (an SQS record's messageId is the
// JSON string "\"…\""), or an [idem.Request]'s Payload when it has no Key
// (idemsfn's input then). The value is canonicalised first
// (canonical JSON, as Request.Identity makes it), so key order and white
// space do not matter.
//
// It is the store key [idem.Request.Identity] derives from a Payload
// without a Key (a test holds the two together), without the fingerprint.
func JSON(operation, tenant string, value []byte) (idem.StoreKey, error) {
	req := idem.Request{Operation: operation, Tenant: tenant, Payload: value}
	id, err := req.Identity()
	if err != nil {
		return idem.StoreKey{}, err
	}
	return id.StoreKey, nil
}

// TopicTenant returns the tenant that scopes a message's key to the topic
// it was consumed from (idemkafka's and idemwatermill's default key, and
// idemkafka's KeyFromRecordKey): the topic itself when it may be a tenant
// (up to 256 printable ASCII characters without spaces or '#', as every
// Kafka topic name is), otherwise "sha256:" and the hex of the first 16
// bytes of its SHA-256. An empty topic (a message handled outside a
// router) scopes nothing: "".
func TopicTenant(topic string) string {
	if topic == "" {
		return ""
	}
	if len(topic) <= idem.MaxTenantLen && !strings.ContainsFunc(topic, func(r rune) bool { return r < 0x21 || r > 0x7e || r == '#' }) {
		return topic
	}
	sum := sha256.Sum256([]byte(topic))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// Payload returns the store key of a message keyed by its payload, the
// bytes as the producer sent them (not canonicalised): idemkafka's record
// value and idemwatermill's message payload, by default, scoped to the
// topic ([TopicTenant]). The key is the payload's SHA-256, so a copy of
// the message finds its record whichever partition or delivery it came
// by.
func Payload(operation, topic string, payload []byte) (idem.StoreKey, error) {
	id, err := PayloadIdentity(operation, topic, payload)
	return id.StoreKey, err
}
