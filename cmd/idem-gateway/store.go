package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/boltstore"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
	"github.com/seed-a1b882c0/idem/store/memstore"
	"github.com/seed-a1b882c0/idem/store/pgstore"
	"github.com/seed-a1b882c0/idem/store/redisstore"
)

// StoreURLError says what is wrong with a -store URL.
type StoreURLError struct {
	URL    string
	Reason string
}

func (e *StoreURLError) Error() string {
	return fmt.Sprintf("-store %q: %s", e.URL, e.Reason)
}

// defaultStorePath is the embedded store's file when -store is not given:
// gateway.db next to the library's default file ($IDEM_STATE_DIR, else the
// user's state directory).
func defaultStorePath() string {
	return filepath.Join(filepath.Dir(boltstore.DefaultPath()), "gateway.db")
}

// openStore opens the store a -store URL names. The returned closer is
// nil-safe to call and releases what the store holds.
//
//	memory:                                   in-process, lost on exit
//	bolt:///abs/path.db, bolt:rel/path.db     embedded file (bolt:// alone: the default path)
//	redis://host:port/db?prefix=idem:         (rediss:// for TLS)
//	postgres://user@host/db?table=idem_records
//	dynamodb://TABLE?region=…&endpoint=…&create=true
func openStore(ctx context.Context, raw string) (store.Store, func() error, error) {
	scheme, _, ok := strings.Cut(raw, ":")
	if !ok {
		return nil, nil, &StoreURLError{URL: raw, Reason: "no scheme; use memory:, bolt://, redis://, postgres:// or dynamodb://"}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, &StoreURLError{URL: raw, Reason: err.Error()}
	}
	q := u.Query()
	take := func(name string) string {
		v := q.Get(name)
		q.Del(name)
		u.RawQuery = q.Encode()
		return v
	}
	switch strings.ToLower(scheme) {
	case "memory", "mem":
		s := memstore.New(nil)
		return s, s.Close, nil
	case "bolt", "file":
		path := u.Path
		if u.Opaque != "" {
			path = u.Opaque
		}
		if u.Host != "" {
			return nil, nil, &StoreURLError{URL: raw, Reason: fmt.Sprintf("host %q given; write bolt:///absolute/path or bolt:relative/path", u.Host)}
		}
		if path == "" {
			path = defaultStorePath()
		}
		s, err := boltstore.Open(path, nil)
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	case "redis", "rediss":
		prefix := take("prefix")
		s, err := redisstore.Open(u.String(), &redisstore.Config{Prefix: prefix})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	case "postgres", "postgresql":
		table := take("table")
		s, err := pgstore.Open(ctx, u.String(), &pgstore.Config{Table: table})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	case "dynamodb":
		table := u.Host
		if table == "" {
			table = u.Opaque
		}
		if table == "" {
			return nil, nil, &StoreURLError{URL: raw, Reason: "no table; write dynamodb://TABLE"}
		}
		region, endpoint := q.Get("region"), q.Get("endpoint")
		create := false
		if v := q.Get("create"); v != "" {
			if create, err = strconv.ParseBool(v); err != nil {
				return nil, nil, &StoreURLError{URL: raw, Reason: "create: " + err.Error()}
			}
		}
		// The store's own transport, so that closing the store drops its
		// idle connections.
		var opts []func(*config.LoadOptions) error
		if region != "" {
			opts = append(opts, config.WithRegion(region))
		}
		awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("dynamodb: loading the AWS configuration: %w", err)
		}
		// The store gets a transport of its own (with what the
		// configuration set on the SDK's, such as a CA bundle), so that
		// closing the store drops its idle connections.
		var tr *http.Transport
		if bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient); ok {
			tr = bc.GetTransport()
		} else {
			tr = http.DefaultTransport.(*http.Transport).Clone()
		}
		tr.MaxIdleConnsPerHost = 64
		awsCfg.HTTPClient = &http.Client{Transport: tr}
		client := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
			if endpoint != "" {
				o.BaseEndpoint = aws.String(endpoint)
			}
		})
		cfg := dynamostore.Config{Table: table}
		if create {
			if err := dynamostore.CreateTable(ctx, client, cfg, time.Minute); err != nil {
				return nil, nil, err
			}
		}
		s, err := dynamostore.New(client, cfg)
		if err != nil {
			return nil, nil, err
		}
		return s, func() error { tr.CloseIdleConnections(); return nil }, nil
	}
	return nil, nil, &StoreURLError{URL: raw, Reason: fmt.Sprintf("unknown scheme %q; use memory:, bolt://, redis://, postgres:// or dynamodb://", scheme)}
}

// healthKey is a key no request can produce (a scope with no operation
// behind it); reading it proves the store answers.
const healthKey = "idem-gateway:healthz#0000000000000000000000000000000000000000000000000000000000000000"

// checkStore reads healthKey: absent or present, the store answered.
func checkStore(ctx context.Context, s store.Store) error {
	_, err := s.Get(ctx, healthKey)
	if err == nil || errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}
