package clientkey

import (
	"fmt"
	"strings"

	"github.com/seed-a1b882c0/idem"
)

// Kind names the adapter whose rule turns a [Material] into a store key.
type Kind string

// The kinds of client-side material.
const (
	// KindHTTP: idemhttp and idemlambda's HTTP adapters ([HTTP]).
	KindHTTP Kind = "http"
	// KindGateway: the gateway, [HTTP] under [GatewayOperation].
	KindGateway Kind = "gateway"
	// KindRPC: idemgrpc and idemconnect ([RPC]).
	KindRPC Kind = "grpc"
	// KindKey: an explicit key or message id ([Key]).
	KindKey Kind = "key"
	// KindJSON: a JSON value, such as a KeyJMESPath selection ([JSON]).
	KindJSON Kind = "json"
	// KindPayload: a message's payload, the key of idemkafka and
	// idemwatermill by default ([Payload]).
	KindPayload Kind = "payload"
)

// Kinds lists every kind, in the order forms offer them.
var Kinds = []Kind{KindHTTP, KindGateway, KindRPC, KindKey, KindJSON, KindPayload}

// Material is what a client sent, as an operator finds it in a request
// log or a support ticket.
type Material struct {
	Kind Kind
	// Operation is the adapter's operation name: required for Key and
	// JSON; for HTTP it defaults to [DefaultHTTPOperation] (idemhttp's
	// default), for RPC to [RPCOperation] of Method; the gateway's is
	// always [GatewayOperation].
	Operation string
	// Method is the HTTP method (HTTP, gateway; upper case) or the full
	// RPC method name ("/shop.v1.Orders/Create").
	Method string
	// Route is the HTTP route: the URL path unless the service sets
	// idemhttp's Config.Route; under idemlambda the event's route (REST
	// API: the resource, "/orders/{id}"; HTTP API: the route key,
	// "POST /orders/{id}"; Function URL: the path).
	Route string
	// Principal is who called (HTTP, gateway, RPC): what the service's
	// Config.Principal returns, the gateway's -principal-header value.
	Principal string
	// Tenant is the tenant of an explicit key or JSON value (Key, JSON).
	Tenant string
	// Topic is the topic a message was consumed from, which scopes its
	// key ([TopicTenant]): required for Payload unless the message was
	// handled outside a router (idemwatermill); for Key, a Kafka record
	// key under idemkafka's KeyFromRecordKey. Not with Tenant.
	Topic string
	// Key is the idempotency key the client sent: the Idempotency-Key
	// header's value as sent (HTTP, gateway: quoted or not, read by
	// [ParseHeader]), the key or message id as it is (RPC, Key), the
	// JSON value (JSON), or the message's payload, byte for byte as the
	// producer sent it (Payload).
	Key string
}

// MaterialError is a [Material] that names no store key; Field says which
// part is wrong. It matches [idem.ErrInvalidKey].
type MaterialError struct {
	Kind   Kind
	Field  string
	Reason string
}

// Is reports whether target is [idem.ErrInvalidKey].
func (e *MaterialError) Is(target error) bool { return target == idem.ErrInvalidKey }

func (e *MaterialError) Error() string {
	return fmt.Sprintf("clientkey: %s: %s: %s", e.Kind, e.Field, e.Reason)
}

// StoreKey returns the store key the adapter of m.Kind keeps m's record
// under. Missing or malformed parts fail with a *[MaterialError], a key
// the adapter would refuse with the adapter's error (an *[idem.KeyError],
// an *[idem.PayloadError]).
func (m Material) StoreKey() (idem.StoreKey, error) {
	bad := func(field, reason string) (idem.StoreKey, error) {
		return idem.StoreKey{}, &MaterialError{Kind: m.Kind, Field: field, Reason: reason}
	}
	need := func(fields ...string) error {
		for i := 0; i+1 < len(fields); i += 2 {
			if fields[i+1] == "" {
				return &MaterialError{Kind: m.Kind, Field: fields[i], Reason: "missing"}
			}
		}
		return nil
	}
	switch m.Kind {
	case KindHTTP, KindGateway:
		op := m.Operation
		if op == "" && m.Kind == KindHTTP {
			op = DefaultHTTPOperation
		}
		if m.Kind == KindGateway {
			if op != "" && op != GatewayOperation {
				return bad("operation", "the gateway's operation is always "+GatewayOperation)
			}
			op = GatewayOperation
		}
		if err := need("operation", op, "method", m.Method, "route", m.Route, "key", m.Key); err != nil {
			return idem.StoreKey{}, err
		}
		if m.Method != strings.ToUpper(m.Method) {
			return bad("method", fmt.Sprintf("%q: HTTP methods are upper case (%s)", m.Method, strings.ToUpper(m.Method)))
		}
		key, err := ParseHeader(m.Key)
		if err != nil {
			return idem.StoreKey{}, err
		}
		return HTTP(op, m.Principal, m.Method, m.Route, key)
	case KindRPC:
		op := m.Operation
		if op == "" {
			if m.Method == "" {
				return bad("method", "missing; give the full method name (/pkg.Service/Method) or the operation")
			}
			var ok bool
			if op, ok = RPCOperation(m.Method); !ok {
				return bad("method", fmt.Sprintf("%q is not a full method name such as /shop.v1.Orders/Create", m.Method))
			}
		}
		if err := need("key", m.Key); err != nil {
			return idem.StoreKey{}, err
		}
		return RPC(op, m.Principal, m.Key)
	case KindKey:
		if err := need("operation", m.Operation, "key", m.Key); err != nil {
			return idem.StoreKey{}, err
		}
		if m.Topic != "" {
			if m.Tenant != "" {
				return bad("topic", "a key is scoped by a tenant or by a topic, not both")
			}
			return Key(m.Operation, TopicTenant(m.Topic), m.Key)
		}
		return Key(m.Operation, m.Tenant, m.Key)
	case KindPayload:
		if err := need("operation", m.Operation, "key", m.Key); err != nil {
			return idem.StoreKey{}, err
		}
		if m.Tenant != "" {
			return bad("tenant", "a payload's key is scoped by its topic; give the topic instead")
		}
		return Payload(m.Operation, m.Topic, []byte(m.Key))
	case KindJSON:
		if err := need("operation", m.Operation, "key", m.Key); err != nil {
			return idem.StoreKey{}, err
		}
		return JSON(m.Operation, m.Tenant, []byte(m.Key))
	}
	return bad("kind", fmt.Sprintf("%q is none of http, gateway, grpc, key, json, payload", m.Kind))
}
