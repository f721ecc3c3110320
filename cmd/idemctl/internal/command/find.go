package command

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/seed-a1b882c0/idem/clientkey"
)

// messageHelp is find's -message flag's help: every adapter whose keys it finds.
const messageHelp = "a message id or explicit key (idemnats' Nats-Msg-Id, idemamqp's MessageId, idemwatermill's message UUID, " +
	"idemkafka's KeyHeader value, a Config.Key's value, idemlambda's FuncConfig.Key, " +
	"an idem.Request's Key as idemsfn's Start takes it): -operation, [-tenant], -key"

var findCommand = command{
	name: "find",
	args: "-http [-operation OP] | -gateway | -grpc | -message -operation OP | -json -operation OP  [-method M] [-route R] [-principal P] [-tenant T] -key KEY",
	summary: "Find a record from what the client sent (its Idempotency-Key, a message id), derived as the adapter derives its store key " +
		"(package clientkey); then show it as show does. Read-only; exit 3 when absent.",
	flags: func(fs *flag.FlagSet, c *ctl) func(context.Context, []string) error {
		kinds := map[clientkey.Kind]*bool{
			clientkey.KindHTTP:    fs.Bool("http", false, "idemhttp, or idemlambda's API Gateway and Function URL adapters: [-operation], -method, -route, [-principal], -key"),
			clientkey.KindGateway: fs.Bool("gateway", false, "the gateway (its operation is \""+clientkey.GatewayOperation+"\"): -method, -route (the URL path), [-principal: the -principal-header value], -key"),
			clientkey.KindRPC:     fs.Bool("grpc", false, "idemgrpc or idemconnect: -method (full name, /pkg.Service/Method) or -operation, [-principal], -key"),
			clientkey.KindKey:     fs.Bool("message", false, messageHelp),
			clientkey.KindJSON:    fs.Bool("json", false, "a JSON value: what idemlambda's KeyJMESPath selects (an SQS record's messageId is the JSON string '\"ID\"'), or an idem.Request's payload without a Key: -operation, [-tenant], -key JSON"),
			clientkey.KindPayload: fs.Bool("payload", false, "a message's payload, byte for byte (idemkafka's record value, idemwatermill's payload: their default key): -operation, -topic, -key PAYLOAD, or -key - to read it from stdin"),
		}
		var m clientkey.Material
		fs.StringVar(&m.Operation, "operation", "", "the adapter's operation `NAME` (Config.Operation; for -http by default idemhttp's \""+clientkey.DefaultHTTPOperation+"\", for -grpc from -method)")
		fs.StringVar(&m.Method, "method", "", "the HTTP `METHOD` (POST), or the full gRPC method name (/shop.v1.Orders/Create)")
		fs.StringVar(&m.Route, "route", "", "the HTTP `ROUTE`: the URL path the client called (/orders), unless the service sets idemhttp's Config.Route")
		fs.StringVar(&m.Principal, "principal", "", "who called: the `PRINCIPAL` the service's Config.Principal returns (the gateway's -principal-header value)")
		fs.StringVar(&m.Tenant, "tenant", "", "the `TENANT` of an explicit key (-message, -json)")
		fs.StringVar(&m.Topic, "topic", "", "the `TOPIC` the message was consumed from (-payload; -message for idemkafka's KeyFromRecordKey)")
		fs.StringVar(&m.Key, "key", "", "what the client sent: the Idempotency-Key header's value (quoted as sent, or the key in it), the message id or key, or the JSON value")
		out := outputFlag("table")
		fs.Var(&out, "o", "output `FORMAT`: table or json")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("find takes flags only, not %q (to open a store key, use show)", args[0])
			}
			for _, k := range clientkey.Kinds {
				if *kinds[k] {
					if m.Kind != "" {
						return usagef("give one of -http, -gateway, -grpc, -message, -json, -payload, not -%s and -%s", m.Kind, k)
					}
					m.Kind = k
				}
			}
			if m.Kind == "" {
				return usagef("which adapter made the key? give one of -http, -gateway, -grpc, -message, -json, -payload")
			}
			if m.Kind == clientkey.KindPayload && m.Key == "-" {
				b, err := io.ReadAll(io.LimitReader(c.env.Stdin, maxPayload+1))
				if err != nil {
					return fmt.Errorf("reading the payload from stdin: %w", err)
				}
				if len(b) > maxPayload {
					return usagef("the payload on stdin is over %d bytes", maxPayload)
				}
				m.Key = string(b)
			}
			key, err := m.StoreKey()
			if err != nil {
				return usagef("%v", err)
			}
			// The record, as show prints it.
			show := flag.NewFlagSet("show", flag.ContinueOnError)
			show.SetOutput(io.Discard)
			run := showCommand.flags(show, c)
			if err := show.Parse([]string{"-o", string(out)}); err != nil {
				return err
			}
			return run(ctx, []string{key.String()}) // absent: "KEY: no such record", exit 3
		}
	},
}

// maxPayload is the largest payload find reads from stdin (-payload -key -).
const maxPayload = 64 << 20
