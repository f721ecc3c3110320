// Package storeurl opens an idem store named by a URL, the one form the
// repository's commands (idem-gateway, idemctl) take their -store flag in:
//
//	memory:                                   in-process, lost on exit
//	bolt:///abs/path.db, bolt:rel/path.db     embedded file (bolt:// alone: Options.DefaultBoltPath)
//	redis://host:port/db?prefix=idem:         (rediss:// for TLS)
//	redis+cluster://host:port?addr=host:port&prefix=…    Redis Cluster, from seed nodes
//	redis+sentinel://host:port?master_name=NAME&addr=…   the primary Sentinel names
//	redis…?waitreplicas=1&waittimeout=1000    every write waits for a replica (Config.WaitReplicas)
//	redis…?alloweviction=true                 accept a Redis that may evict keys (Config.AllowEviction):
//	                                          records may be forgotten; operations may run again
//	postgres://user@host/db?table=idem_records
//	dynamodb://TABLE?region=…&endpoint=…&index=…&openindex=…&create=true
//	dynamodb://TABLE?spill=s3://BUCKET/PREFIX&spillendpoint=…&spillsse=aws:kms&spillkmskey=…&spillover=BYTES
//
// With spill=, results over the item limit (or over spillover= bytes) are
// kept in S3 by dynamostore/s3spill; spillendpoint= points the S3 client
// elsewhere (s3rver, MinIO) and turns on path-style addressing, which
// spillpathstyle= sets on its own; spillsse= is AES256 or aws:kms, with
// spillkmskey= the KMS key; spillprobe=true makes Open write and delete a
// small object to prove the bucket takes writes.
//
// [Open] checks the store against its server (check.go says what), and
// [OpenWait] and [StartOpen] retry an open that failed for a reason that
// may heal, for commands that start before their store.
//
// Query parameters the store takes (prefix, table, index, openindex, region,
// endpoint, create, spill…) are removed before the rest of the URL is handed to
// the backend's client, so a PostgreSQL URL keeps its own parameters
// (sslmode, …). The module carries every backend's client; a program that
// uses one store only imports that store's module instead.
package storeurl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/dynamostore/s3spill"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// Kinds of store a URL names: [URL.Kind].
const (
	Memory   = "memory"
	Bolt     = "bolt"
	Redis    = "redis"
	Postgres = "postgres"
	DynamoDB = "dynamodb"
)

const schemes = "use memory:, bolt://, redis:// (redis+cluster://, redis+sentinel://), postgres:// or dynamodb://"

// Error says what is wrong with a store URL.
type Error struct {
	URL    string
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("store URL %q: %s", e.URL, e.Reason)
}

// Is makes an *Error match store.ErrInvalidConfig.
func (e *Error) Is(target error) bool { return target == store.ErrInvalidConfig }

// URL is a parsed store URL: which backend, and its settings.
type URL struct {
	// Raw is the URL as given.
	Raw string
	// Kind is the backend: Memory, Bolt, Redis, Postgres or DynamoDB.
	Kind string
	// Path is the bolt file; empty for bolt:// alone.
	Path string
	// Prefix is the Redis key prefix (prefix=).
	Prefix string
	// WaitReplicas and WaitTimeout are redisstore's Config.WaitReplicas and
	// WaitTimeout (waitreplicas=, waittimeout= in ms).
	WaitReplicas, WaitTimeout int
	// AllowEviction is redisstore's Config.AllowEviction
	// (alloweviction=true): Open accepts a Redis that may evict keys, and
	// warns that records may be forgotten and operations may run again.
	AllowEviction bool
	// Table is the PostgreSQL table (table=, default idem_records) or
	// the DynamoDB table (the URL's host).
	Table string
	// Index is the DynamoDB status index (index=), empty for none.
	Index string
	// OpenIndex is the DynamoDB sparse, sharded open index
	// (openindex=, dynamostore's Config.OpenIndex), empty for none.
	OpenIndex string
	// Region and Endpoint configure the DynamoDB client (region=,
	// endpoint=); empty means the AWS configuration's.
	Region, Endpoint string
	// Create asks for the DynamoDB table to be created when missing
	// (create=true).
	Create bool
	// SpillBucket and SpillPrefix name where DynamoDB results too large
	// for an item go (spill=s3://BUCKET/PREFIX); empty for none.
	SpillBucket, SpillPrefix string
	// SpillEndpoint overrides the S3 endpoint (spillendpoint=).
	SpillEndpoint string
	// SpillPathStyle asks for path-style S3 addressing (spillpathstyle=;
	// default true with SpillEndpoint, else false).
	SpillPathStyle bool
	// SpillSSE and SpillKMSKey are s3spill's Config.SSE and KMSKeyID
	// (spillsse=, spillkmskey=).
	SpillSSE, SpillKMSKey string
	// SpillProbe makes Open write and delete a small object in the spill
	// bucket (spillprobe=true; s3spill's Config.Probe).
	SpillProbe bool
	// SpillOver is dynamostore's Config.MaxResultBytes (spillover=): results
	// over it are spilled. Zero means dynamostore's default.
	SpillOver int
	// Conn is the URL handed to the Redis or PostgreSQL client: Raw
	// without the parameters above.
	Conn string
}

// Parse checks raw and returns its parts, without connecting to anything.
// Errors are an [*Error].
func Parse(raw string) (*URL, error) {
	bad := func(format string, args ...any) (*URL, error) {
		return nil, &Error{URL: raw, Reason: fmt.Sprintf(format, args...)}
	}
	scheme, _, ok := strings.Cut(raw, ":")
	if !ok {
		return bad("no scheme; %s", schemes)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("%v", err)
	}
	q := u.Query()
	take := func(name string) string {
		v := q.Get(name)
		q.Del(name)
		u.RawQuery = q.Encode()
		return v
	}
	out := &URL{Raw: raw}
	switch strings.ToLower(scheme) {
	case "memory", "mem":
		out.Kind = Memory
	case "bolt", "file":
		out.Kind = Bolt
		out.Path = u.Path
		if u.Opaque != "" {
			out.Path = u.Opaque
		}
		if u.Host != "" {
			return bad("host %q given; write bolt:///absolute/path or bolt:relative/path", u.Host)
		}
	case "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel":
		out.Kind = Redis
		out.Prefix = take("prefix")
		for _, n := range []struct {
			name string
			dst  *int
		}{{"waitreplicas", &out.WaitReplicas}, {"waittimeout", &out.WaitTimeout}} {
			if v := take(n.name); v != "" {
				if *n.dst, err = strconv.Atoi(v); err != nil || *n.dst < 0 {
					return bad("%s=%q: a whole number, 0 or more", n.name, v)
				}
			}
		}
		if v := take("alloweviction"); v != "" {
			if out.AllowEviction, err = strconv.ParseBool(v); err != nil {
				return bad("alloweviction=%q: true or false", v)
			}
		}
		out.Conn = u.String()
	case "postgres", "postgresql":
		out.Kind = Postgres
		out.Table = take("table")
		if out.Table == "" {
			out.Table = "idem_records"
		}
		out.Conn = u.String()
	case "dynamodb":
		out.Kind = DynamoDB
		out.Table = u.Host
		if out.Table == "" {
			out.Table = u.Opaque
		}
		if out.Table == "" {
			return bad("no table; write dynamodb://TABLE")
		}
		out.Region, out.Endpoint, out.Index, out.OpenIndex = q.Get("region"), q.Get("endpoint"), q.Get("index"), q.Get("openindex")
		if v := q.Get("create"); v != "" {
			if out.Create, err = strconv.ParseBool(v); err != nil {
				return bad("create: %v", err)
			}
		}
		if err := parseSpill(out, q); err != nil {
			return bad("%v", err)
		}
	default:
		return bad("unknown scheme %q; %s", scheme, schemes)
	}
	return out, nil
}

// parseSpill reads the spill parameters of a dynamodb:// URL.
func parseSpill(out *URL, q url.Values) error {
	raw := q.Get("spill")
	rest := q.Get("spillendpoint") + q.Get("spillpathstyle") + q.Get("spillsse") + q.Get("spillkmskey") + q.Get("spillover") + q.Get("spillprobe")
	if raw == "" {
		if rest != "" {
			return errors.New("spillendpoint, spillpathstyle, spillsse, spillkmskey, spillover and spillprobe need spill=s3://BUCKET/PREFIX")
		}
		return nil
	}
	su, err := url.Parse(raw)
	if err != nil || su.Scheme != "s3" || su.Host == "" {
		return fmt.Errorf("spill=%q: write spill=s3://BUCKET/PREFIX", raw)
	}
	out.SpillBucket, out.SpillPrefix = su.Host, strings.TrimPrefix(su.Path, "/")
	out.SpillEndpoint, out.SpillSSE, out.SpillKMSKey = q.Get("spillendpoint"), q.Get("spillsse"), q.Get("spillkmskey")
	out.SpillPathStyle = out.SpillEndpoint != ""
	if v := q.Get("spillpathstyle"); v != "" {
		if out.SpillPathStyle, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("spillpathstyle: %v", err)
		}
	}
	if v := q.Get("spillprobe"); v != "" {
		if out.SpillProbe, err = strconv.ParseBool(v); err != nil {
			return fmt.Errorf("spillprobe: %v", err)
		}
	}
	if v := q.Get("spillover"); v != "" {
		if out.SpillOver, err = strconv.Atoi(v); err != nil || out.SpillOver <= 0 || out.SpillOver > dynamostore.MaxItemBytes {
			return fmt.Errorf("spillover=%q: a size in bytes, 1..%d", v, dynamostore.MaxItemBytes)
		}
	}
	return nil
}

// Options configure [Open]. A nil *Options means all defaults.
type Options struct {
	// DefaultBoltPath is the file of bolt:// with no path. Default
	// [DefaultBoltPath]().
	DefaultBoltPath string
	// Passive opens the store without changing anything by itself, for
	// tools that inspect a store other programs own: no schema migration
	// (PostgreSQL: the table must exist, and Open checks it does), no table creation (DynamoDB:
	// create=true is refused), no bolt file created (it must exist), and
	// no background reaper or sweeper deleting expired records.
	Passive bool
	// ReadOnly, with Passive, is for commands that only read: a bolt file
	// is opened read-only (boltstore's Config.ReadOnly: its claim journal is
	// read but not replayed, its bytes stay as they are, a file the user
	// may only read opens, and every write fails). Other stores are opened
	// as with Passive alone.
	ReadOnly bool
	// Clock drives the stores' reapers and sweepers. Default
	// store.SystemClock.
	Clock store.Clock
	// Logger receives the stores' warnings at open (alloweviction=true on
	// a Redis that may evict keys). Default slog.Default(). When set, a
	// Redis store also sends it go-redis's own log lines (a dial that
	// failed, a pool that ran dry), which go-redis writes to stderr in its
	// own format otherwise, at level WARN with the message "go-redis":
	// go-redis's logger is global, so this sets it for every Redis client
	// of the process.
	Logger *slog.Logger
}

// DefaultBoltPath returns the embedded store's default file, which bolt://
// with no path opens unless Options.DefaultBoltPath says otherwise:
// $IDEM_STATE_DIR/idem.db, else the user's state directory
// ($XDG_STATE_HOME, ~/.local/state)/idem/idem.db, else the temporary
// directory. A command keeping a file of its own puts it beside this one.
func DefaultBoltPath() string { return boltstore.DefaultPath() }

// Opened is an open store. Hand the engine its Store field
// (idem.New(o.Store, cfg)), not o itself: the engine finds a store's
// optional powers (batches, steps, listing, its clock) by type assertion on
// the store it is given, and Opened carries only the methods of
// store.Store.
type Opened struct {
	// Store is the store.
	store.Store
	// URL is the parsed URL it was opened from.
	URL    *URL
	closer func() error
}

// Close releases what the store holds: its connections, its file, its
// background goroutines. It is safe to call on a nil *Opened.
func (o *Opened) Close() error {
	if o == nil || o.closer == nil {
		return nil
	}
	return o.closer()
}

// Lister returns the store's listing power, or nil when it has none.
func (o *Opened) Lister() store.Lister {
	l, _ := o.Store.(store.Lister)
	return l
}

// open opens the store raw names, without [Open]'s checks.
func open(ctx context.Context, raw string, o *Options) (*Opened, error) {
	u, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	var opt Options
	if o != nil {
		opt = *o
	}
	if opt.Clock == nil {
		opt.Clock = store.SystemClock{}
	}
	// A negative interval turns a store's background sweeper off.
	sweep := time.Duration(0)
	if opt.Passive {
		sweep = -1
	}
	switch u.Kind {
	case Memory:
		s := memstore.New(&memstore.Config{SweepInterval: sweep, Clock: opt.Clock})
		return &Opened{Store: s, URL: u, closer: s.Close}, nil
	case Bolt:
		path := u.Path
		if path == "" {
			path = opt.DefaultBoltPath
		}
		if path == "" {
			path = boltstore.DefaultPath()
		}
		if opt.Passive || opt.ReadOnly {
			if _, err := os.Stat(path); err != nil {
				return nil, fmt.Errorf("bolt store %s: %w", path, err)
			}
		}
		s, err := boltstore.Open(path, &boltstore.Config{SweepInterval: sweep, Clock: opt.Clock, ReadOnly: opt.ReadOnly})
		if err != nil {
			return nil, err
		}
		return &Opened{Store: s, URL: u, closer: s.Close}, nil
	case Redis:
		if opt.Logger != nil {
			redisstore.SetLogger(opt.Logger)
		}
		s, err := redisstore.Open(u.Conn, &redisstore.Config{Prefix: u.Prefix, WaitReplicas: u.WaitReplicas, WaitTimeout: u.WaitTimeout,
			AllowEviction: u.AllowEviction, Logger: opt.Logger})
		if err != nil {
			return nil, err
		}
		return &Opened{Store: s, URL: u, closer: s.Close}, nil
	case Postgres:
		cfg := &pgstore.Config{Table: u.Table, ReapInterval: sweep, Clock: opt.Clock}
		if !opt.Passive {
			s, err := pgstore.Open(ctx, u.Conn, cfg)
			if err != nil {
				return nil, err
			}
			return &Opened{Store: s, URL: u, closer: s.Close}, nil
		}
		pool, err := pgxpool.New(ctx, u.Conn)
		if err != nil {
			return nil, &Error{URL: raw, Reason: err.Error()}
		}
		s, err := pgstore.New(pool, cfg)
		if err == nil {
			err = s.Ping(ctx) // says so when the table is missing
		}
		if err != nil {
			if s != nil {
				_ = s.Close()
			}
			pool.Close()
			return nil, err
		}
		return &Opened{Store: s, URL: u, closer: func() error { err := s.Close(); pool.Close(); return err }}, nil
	default: // DynamoDB
		if u.Create && opt.Passive {
			return nil, &Error{URL: raw, Reason: "create=true changes the account; this command opens stores read-only (use idemctl create-table)"}
		}
		client, awsCfg, tr, err := dynamoClient(ctx, u)
		if err != nil {
			return nil, err
		}
		cfg := dynamostore.Config{Table: u.Table, StatusIndex: u.Index, OpenIndex: u.OpenIndex, MaxResultBytes: u.SpillOver}
		if u.SpillBucket != "" {
			if cfg.Spiller, err = spiller(awsCfg, u); err != nil {
				tr.CloseIdleConnections()
				return nil, &Error{URL: raw, Reason: err.Error()}
			}
		}
		if u.Create {
			if err := dynamostore.CreateTable(ctx, client, cfg, time.Minute); err != nil {
				tr.CloseIdleConnections()
				return nil, err
			}
		}
		s, err := dynamostore.New(client, cfg)
		if err != nil {
			tr.CloseIdleConnections()
			return nil, err
		}
		return &Opened{Store: s, URL: u, closer: func() error { tr.CloseIdleConnections(); return nil }}, nil
	}
}

// dynamoClient returns a DynamoDB client for u with a transport of its own
// (with what the AWS configuration set on the SDK's, such as a CA bundle),
// so that closing the store drops its idle connections; and the AWS
// configuration it was made from, for the S3 client of a spill.
func dynamoClient(ctx context.Context, u *URL) (*dynamodb.Client, aws.Config, *http.Transport, error) {
	var opts []func(*config.LoadOptions) error
	if u.Region != "" {
		opts = append(opts, config.WithRegion(u.Region))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, aws.Config{}, nil, fmt.Errorf("dynamodb: loading the AWS configuration: %w", err)
	}
	var tr *http.Transport
	if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
		tr = bc.GetTransport()
	} else {
		tr = http.DefaultTransport.(*http.Transport).Clone()
	}
	tr.MaxIdleConnsPerHost = 64
	awsCfg.HTTPClient = &http.Client{Transport: tr}
	client := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if u.Endpoint != "" {
			o.BaseEndpoint = aws.String(u.Endpoint)
		}
	})
	return client, awsCfg, tr, nil
}

// spiller is the S3 spiller of u, on the DynamoDB client's AWS
// configuration and transport.
func spiller(awsCfg aws.Config, u *URL) (*s3spill.Spiller, error) {
	s3c := s3.NewFromConfig(awsCfg, func(so *s3.Options) {
		if u.SpillEndpoint != "" {
			so.BaseEndpoint = aws.String(u.SpillEndpoint)
		}
		so.UsePathStyle = u.SpillPathStyle
	})
	return s3spill.New(s3c, s3spill.Config{Bucket: u.SpillBucket, Prefix: u.SpillPrefix, SSE: u.SpillSSE, KMSKeyID: u.SpillKMSKey, Probe: u.SpillProbe})
}

// ErrNotApplicable is returned by [Migrate] and [CreateTable] for a URL of
// another kind of store.
var ErrNotApplicable = errors.New("storeurl: not applicable to this kind of store")

// Migrate applies the PostgreSQL schema migrations of the table a
// postgres:// URL names (pgstore.Migrate), and returns the migrations the
// table has now. Other kinds fail with [ErrNotApplicable].
func Migrate(ctx context.Context, raw string) ([]pgstore.Migration, error) {
	u, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Kind != Postgres {
		return nil, fmt.Errorf("%w: %s stores have no schema to migrate", ErrNotApplicable, u.Kind)
	}
	pool, err := pgxpool.New(ctx, u.Conn)
	if err != nil {
		return nil, &Error{URL: raw, Reason: err.Error()}
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, u.Table); err != nil {
		return nil, err
	}
	return pgstore.Migrations(u.Table)
}

// CreateTable creates the DynamoDB table a dynamodb:// URL names, with its
// status index when the URL has index=, and waits for it to be ACTIVE (at
// most maxWait); an existing table is left as it is. Other kinds fail with
// [ErrNotApplicable].
func CreateTable(ctx context.Context, raw string, maxWait time.Duration) error {
	u, err := Parse(raw)
	if err != nil {
		return err
	}
	if u.Kind != DynamoDB {
		return fmt.Errorf("%w: only dynamodb:// stores have a table to create", ErrNotApplicable)
	}
	client, _, tr, err := dynamoClient(ctx, u)
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	return dynamostore.CreateTable(ctx, client, dynamostore.Config{Table: u.Table, StatusIndex: u.Index, OpenIndex: u.OpenIndex}, maxWait)
}
