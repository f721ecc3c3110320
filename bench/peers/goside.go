package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/redis/go-redis/v9"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// env holds the clients both sides share the servers through, and the
// tables and key prefixes of this run.
type env struct {
	endpoint  string
	redisAddr string
	suffix    string // makes this run's tables and keys its own

	ddb       *dynamodb.Client // counted
	transport *http.Transport
	rdb       *redis.Client // counted
	admin     *redis.Client // INFO, CONFIG RESETSTAT; not counted

	requests atomic.Int64

	idemTable, goRawTable, powertoolsTable, nodeRawTable string
	ddbStore                                             *dynamostore.Store
	redisStore                                           *redisstore.Store
}

func newEnv(ctx context.Context, endpoint, redisAddr string) (*env, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &env{endpoint: endpoint, redisAddr: redisAddr, suffix: hex.EncodeToString(b[:])}
	e.transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	e.ddb = dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		HTTPClient:   &http.Client{Transport: e.transport},
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local", Source: "bench/peers"}, nil
		}),
		APIOptions: []func(*middleware.Stack) error{e.countRequests},
	})
	e.rdb = redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 32})
	e.rdb.AddHook(countingHook{&e.requests})
	e.admin = redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 1})

	e.idemTable = "peers_idem_" + e.suffix
	e.goRawTable = "peers_go_raw_" + e.suffix
	e.powertoolsTable = "peers_powertools_" + e.suffix
	e.nodeRawTable = "peers_node_raw_" + e.suffix
	cfg := dynamostore.Config{Table: e.idemTable}
	if err := dynamostore.CreateTable(ctx, e.ddb, cfg, time.Minute); err != nil {
		return nil, fmt.Errorf("create %s: %w", e.idemTable, err)
	}
	for _, t := range []string{e.goRawTable, e.powertoolsTable, e.nodeRawTable} {
		if err := e.createIDTable(ctx, t); err != nil {
			return nil, err
		}
	}
	var err error
	if e.ddbStore, err = dynamostore.New(e.ddb, cfg); err != nil {
		return nil, err
	}
	if e.redisStore, err = redisstore.New(e.rdb, &redisstore.Config{Prefix: "peers:idem:" + e.suffix + ":"}); err != nil {
		return nil, err
	}
	return e, nil
}

// createIDTable makes a table keyed by the string attribute id, the layout
// Powertools' DynamoDB persistence layer expects by default (and the raw
// baselines use).
func (e *env) createIDTable(ctx context.Context, name string) error {
	_, err := e.ddb.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	return nil
}

func (e *env) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, t := range []string{e.idemTable, e.goRawTable, e.powertoolsTable, e.nodeRawTable} {
		_, _ = e.ddb.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(t)})
	}
	e.rdb.Close()
	e.admin.Close()
	e.transport.CloseIdleConnections()
}

// countRequests counts every DynamoDB request the client sends.
func (e *env) countRequests(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("peersCountRequests",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			e.requests.Add(1)
			return next.HandleInitialize(ctx, in)
		}), middleware.Before)
}

// countingHook counts go-redis round trips: one per command, one per
// pipeline.
type countingHook struct{ n *atomic.Int64 }

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// serverStats is what the Redis server reports: commands executed (INFO
// commandstats, summed over every command but the admin client's own info
// and config; commands a script runs count too) and the server process's
// CPU time (INFO cpu, used_cpu_user + used_cpu_sys, in µs).
type serverStats struct{ calls, cpuUs int64 }

func (e *env) resetStats(ctx context.Context) (serverStats, error) {
	if err := e.admin.ConfigResetStat(ctx).Err(); err != nil {
		return serverStats{}, err
	}
	return e.serverStats(ctx)
}

func (e *env) serverStats(ctx context.Context) (serverStats, error) {
	s, err := e.admin.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return serverStats{}, err
	}
	return parseInfo(s), nil
}

// parseInfo reads serverStats from INFO commandstats and cpu.
func parseInfo(s string) serverStats {
	var out serverStats
	for line := range strings.SplitSeq(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			sec, _ := strconv.ParseFloat(v, 64)
			out.cpuUs += int64(sec * 1e6)
		}
	}
	for line := range strings.SplitSeq(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		if c := strings.TrimPrefix(name, "cmdstat_"); c == "info" || strings.HasPrefix(c, "config") {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			if k == "calls" {
				out.calls += n
			}
		}
	}
	return out
}

// receipt is the operation's result on both sides: {"id":"r-1","amount":1000}.
type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func charge(context.Context) (receipt, error) { return receipt{ID: "r-1", Amount: 1000}, nil }

// payload is the request both sides send: {"order":"<tag>-<i>","amount":1000}.
// Both derive the idempotency key from a hash of the whole payload.
func payload(tag string, i int) []byte {
	b := make([]byte, 0, 64)
	b = append(b, `{"order":"`...)
	b = append(b, tag...)
	b = append(b, '-')
	b = strconv.AppendInt(b, int64(i), 10)
	return append(b, `","amount":1000}`...)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runGo runs one scenario on the Go side: idem with its default
// configuration (plus Config.Cache for the cache kind), or the raw client.
// ready is called between the setup and the measured calls.
func (e *env) runGo(ctx context.Context, sc scenario, raw bool, calls, keys int, tag string, ready func() error) (measured, error) {
	var call func(ctx context.Context, p []byte, dup bool) error
	if raw {
		if sc.Store == "dynamodb" {
			call = e.rawDynamo
		} else {
			call = e.rawRedis
		}
	} else {
		cfg := &idem.Config{Logger: quiet}
		if sc.Kind == "cache" {
			cfg.CacheEntries = 10_000
		}
		var st store.Store = e.ddbStore
		if sc.Store == "redis" {
			st = e.redisStore
		}
		eng, err := idem.New(st, cfg)
		if err != nil {
			return measured{}, err
		}
		call = func(ctx context.Context, p []byte, dup bool) error {
			r, err := idem.Do(ctx, eng, idem.Request{Operation: "charge", Payload: p}, charge)
			switch {
			case err != nil:
				return err
			case r.Value.Amount != 1000:
				return fmt.Errorf("unexpected result %+v", r.Value)
			case r.Replayed != dup:
				return fmt.Errorf("replayed %v, want %v", r.Replayed, dup)
			}
			return nil
		}
	}
	if sc.Kind != "new" {
		for i := range keys {
			if err := call(ctx, payload(tag, i), false); err != nil {
				return measured{}, fmt.Errorf("completing key %d: %w", i, err)
			}
		}
	}
	if err := ready(); err != nil {
		return measured{}, err
	}
	return e.drive(ctx, sc.Conc, calls, func(i int) error {
		if sc.Kind == "new" {
			return call(ctx, payload(tag, i), false)
		}
		return call(ctx, payload(tag, i%keys), true)
	})
}

// drive runs op calls times from conc goroutines, timing each call.
func (e *env) drive(ctx context.Context, conc, calls int, op func(i int) error) (measured, error) {
	lat := make([]time.Duration, calls)
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	req0 := e.requests.Load()
	cpu0 := cpuTime()
	t0 := time.Now()
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= calls {
					return
				}
				s := time.Now()
				if err := op(i); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				lat[i] = time.Since(s)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	cpu := cpuTime() - cpu0
	reqs := e.requests.Load() - req0
	if err := failed.Load(); err != nil {
		return measured{}, *err
	}
	if err := ctx.Err(); err != nil {
		return measured{}, err
	}
	slices.Sort(lat)
	return measured{calls: calls, seconds: elapsed.Seconds(), p50: percentile(lat, 0.5), p99: percentile(lat, 0.99),
		cpu: float64(cpu) / 1e3, requests: reqs}, nil
}

var rawResult = []byte(`{"id":"r-1","amount":1000}`)

func decodeReceipt(b []byte, r *receipt) error {
	if err := json.Unmarshal(b, r); err != nil {
		return err
	}
	if r.Amount != 1000 {
		return fmt.Errorf("unexpected result %s", b)
	}
	return nil
}

func rawKey(p []byte) (string, error) {
	k, err := idem.NewStoreKey("charge", "", p)
	return k.String(), err
}

// rawDynamo: a new call is a conditional PutItem (attribute_not_exists)
// and an UpdateItem storing the result; a duplicate is the PutItem failing
// with the completed item returned (ALL_OLD).
func (e *env) rawDynamo(ctx context.Context, p []byte, dup bool) error {
	k, err := rawKey(p)
	if err != nil {
		return err
	}
	now := time.Now()
	_, err = e.ddb.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(e.goRawTable),
		Item: map[string]types.AttributeValue{
			"id":                     &types.AttributeValueMemberS{Value: k},
			"status":                 &types.AttributeValueMemberS{Value: "IN_PROGRESS"},
			"expiration":             &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(time.Hour).Unix(), 10)},
			"in_progress_expiration": &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(time.Minute).UnixMilli(), 10)},
		},
		ConditionExpression:                 aws.String("attribute_not_exists(id)"),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if dup {
		var cf *types.ConditionalCheckFailedException
		if !errors.As(err, &cf) || len(cf.Item) == 0 {
			return fmt.Errorf("raw duplicate %s: %v", k, err)
		}
		d, _ := cf.Item["data"].(*types.AttributeValueMemberS)
		if d == nil {
			return fmt.Errorf("raw duplicate %s: no data", k)
		}
		var r receipt
		return decodeReceipt([]byte(d.Value), &r)
	}
	if err != nil {
		return err
	}
	_, err = e.ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(e.goRawTable),
		Key:                       map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: k}},
		UpdateExpression:          aws.String("SET #s = :s, #d = :d"),
		ExpressionAttributeNames:  map[string]string{"#s": "status", "#d": "data"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":s": &types.AttributeValueMemberS{Value: "COMPLETED"}, ":d": &types.AttributeValueMemberS{Value: string(rawResult)}},
	})
	return err
}

// rawRedis: a new call is SET NX + SET; a duplicate is the SET NX failing
// and a GET of the stored result.
func (e *env) rawRedis(ctx context.Context, p []byte, dup bool) error {
	k, err := rawKey(p)
	if err != nil {
		return err
	}
	k = "peers:raw:" + e.suffix + ":" + k
	ok, err := e.rdb.SetNX(ctx, k, "IN_PROGRESS", time.Hour).Result()
	switch {
	case err != nil:
		return err
	case ok == dup:
		return fmt.Errorf("raw SET NX %s: set %v on a duplicate=%v call", k, ok, dup)
	case dup:
		b, err := e.rdb.Get(ctx, k).Bytes()
		if err != nil {
			return err
		}
		var r receipt
		return decodeReceipt(b, &r)
	}
	return e.rdb.Set(ctx, k, rawResult, time.Hour).Err()
}
