// Package dynamostore is the idem store on Amazon DynamoDB.
//
// # One request per decision
//
// Claim is one conditional PutItem: a new key is written with fence 1, and
// on conflict DynamoDB returns the existing item with the failure
// (ReturnValuesOnConditionCheckFailure=ALL_OLD), so a duplicate costs one
// request and no read. An item that is expired, or IN_PROGRESS past its
// lease, is taken over by an UpdateItem conditional on its being claimable
// at the caller's Now, which adds 1 to the fence of the item it finds: a
// takeover costs two requests, and of racing claimers exactly one wins.
// (A takeover that keeps the item's steps is conditioned on the item's
// still being such a takeover; if the item changed between the two
// requests into one claimable otherwise, a third request takes it over
// without them. Steps, below.) Complete, Fail, Release and Extend are
// single writes conditional on the fence and on the status they expect;
// Get is a strongly consistent GetItem. A new call therefore costs two
// requests (claim + complete) and a duplicate one.
//
// The store has no batch powers (store.BatchClaimer, BatchCompleter,
// BatchExtender): DynamoDB has no conditional batch write with an answer
// per item (BatchWriteItem takes no conditions, TransactWriteItems is all
// or nothing), so the engine claims, completes and renews a batch's items
// one conditional request each (docs/dynamodb.md).
//
// A claim whose write was applied but whose reply was lost (and which the
// SDK's retryer sends again) meets its own item: the store recognises its
// owner and fingerprint in the returned item and answers "acquired",
// instead of reporting a conflict with itself.
//
// # Table layout
//
// Attribute names default to those of the Powertools idempotency table
// (id, expiration in epoch seconds for DynamoDB TTL, in_progress_expiration
// in epoch milliseconds, status, data, validation), so idem can share an
// existing Powertools table; composite keys (a sort key holding the
// idempotency key under a static partition value) are supported. idem adds
// its own attributes for what Powertools does not have (fence, owner,
// expiration_ms, created_ms, completed_ms, error_code, error_message,
// error_body, ref, data_ref, v, hold, steps, steps_bytes; open_status with
// Config.OpenIndex).
// Status values are idem's (IN_PROGRESS, COMPLETED, FAILED); items idem
// did not write (no "v" attribute) are skipped by listings and never
// replayed.
//
// # Global tables
//
// Every decision is a conditional write, evaluated by the Region that
// receives it. Under multi-Region eventual consistency (a global table's
// default) that Region checks the condition against its own copy of the
// item, and replication settles conflicting writes by last writer wins:
// two Regions can both claim one key. The safe configurations are one
// writing Region (every idem process sends its writes to the same Region;
// a Region failover then loses what had not yet replicated, as an
// asynchronous standby does), or multi-Region strong consistency, whose
// conditional writes are evaluated against the latest version of the item
// whatever the Region. The engine's calls use no transactions
// ([Store.CompleteInTx], which idemdynamo.DoTx calls, is one: its
// TransactWriteItems is evaluated in one Region too, and DynamoDB does not
// make a transaction atomic across Regions). It uses TTL only to
// reclaim storage (expiry is decided from the item's expiration_ms), so a
// table without TTL answers correctly and keeps expired items until they
// are deleted. docs/failover.md has the details.
//
// # Listing and the open index
//
// With Config.OpenIndex, IN_PROGRESS and FAILED items also carry
// open_status ("IN_PROGRESS#3": the status and the key's shard among
// Config.StatusShards), the partition key of a sparse global secondary
// index sorted by lease. Every write keeps it in the request it makes:
// claims and takeovers set it, Fail sets it to FAILED, Complete removes
// it, Release deletes the item. Completed records, nearly all of a table,
// are not in the index, and the writes of one status spread over its
// shards. Listing open or stuck records Queries every shard and merges
// them by lease; completed records are listed from the partition (composite
// key) or a Scan. The legacy Config.StatusIndex (keyed on status, holding
// every record) keeps working; docs/dynamodb-status-index.md explains the
// move from one to the other, with [Store.MigrateStatusIndex].
//
// # Steps
//
// The store is a [store.Stepper]: idem.Step records each finished step of
// an operation in its item, and a claim that takes the key over after a
// crash gets them back in its answer and resumes after the last one.
// A step costs one conditional UpdateItem, fenced as Complete is, which
// appends a map (name, at, and data or error_code, error_message,
// error_body) to the list attribute steps and adds the step's size to
// steps_bytes; its condition also holds the number of steps to the step's
// index and steps_bytes to Config.MaxResultBytes. A refused step is
// answered from the item DynamoDB returns with the failure, with no read:
// a retried step whose first reply was lost is recognised there. DynamoDB
// bills an UpdateItem by the size of the whole item (a write unit per
// KB), so each step costs the write units of the item as it grows, and
// the claim that resumes reads the steps for nothing (they come back with
// the takeover's ALL_OLD). A takeover under the same fingerprint keeps
// them; every other claim, Complete and Fail remove them. Steps are never
// spilled: together they are bounded by Config.MaxResultBytes, and a step
// that would pass it fails with a [*store.TooLargeError].
//
// Results are stored as one binary attribute, never as a map of
// attributes. DynamoDB items are limited to 400 KB: a result over
// Config.MaxResultBytes fails before any write with an [*store.TooLargeError]
// (the engine then stores a terminal "result too large" error, so retries
// never re-run), unless a [Spiller] is configured to keep large results
// elsewhere.
package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/seed-a1b882c0/idem/store"
)

// MaxItemBytes is DynamoDB's item size limit (400 KB).
const MaxItemBytes = 400 * 1024

// DefaultStatusShards is the default of Config.StatusShards. One index
// partition takes about 1,000 writes a second, and an idem call writes its
// open-index entry twice (the claim adds it, the completion removes it),
// with lease renewals on top: 8 shards carry some 4,000 new calls a second
// before the index throttles (and a throttled index throttles the table's
// writes), while a listing page costs 8 small Queries.
const DefaultStatusShards = 8

// MaxStatusShards bounds Config.StatusShards, and so the Queries of one
// listing page.
const MaxStatusShards = 64

// API is the part of *dynamodb.Client the store uses.
type API interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	Scan(ctx context.Context, in *dynamodb.ScanInput, opts ...func(*dynamodb.Options)) (*dynamodb.ScanOutput, error)
}

// Spiller keeps results too large for a DynamoDB item somewhere else (an
// S3 bucket, a blob store). The item then holds only the reference Spill
// returns. Spilled objects are the spiller's to expire (for S3, a lifecycle
// rule of at least the idem expiry); a result whose object is gone fails
// closed with store.ErrCorrupt, never a replay of something else: Load
// returns an error that is store.ErrCorrupt for that, and any other error
// for a fault a retry may mend (reported as store.ErrUnavailable), or one
// that wraps store.ErrMisconfigured for a refusal no retry mends
// (credentials refused, the bucket gone): the engine then does not retry
// the write. A Spiller with a Check(context.Context) error method is
// checked by [Store.Check]. Package s3spill is a Spiller on S3.
type Spiller interface {
	// Spill stores p.Data for the claim p names, kept at least until
	// p.ExpiresAt (ms), and returns a reference to it. Fence and owner
	// together name the claim: a fence alone can repeat after the record
	// was deleted and claimed afresh, so a spiller that names objects
	// after the claim must use both. Spill runs before the write it is
	// for, which may then be refused, and one claim may complete more
	// than once (a settled record corrected through
	// store.CompleteParams.From), so each Spill of other data needs an
	// object of its own (a random suffix, or a hash of the data): one that
	// replaced the object of a stored result would change that result.
	Spill(ctx context.Context, p SpillParams) (ref string, err error)
	// Load returns the data stored under ref.
	Load(ctx context.Context, ref string) ([]byte, error)
}

// SpillParams are the arguments of [Spiller.Spill].
type SpillParams struct {
	Key       string
	Fence     uint64
	Owner     string
	ExpiresAt int64
	Data      []byte
}

// Config configures a [Store]. Table is required; every other field has a
// default.
type Config struct {
	// Table is the DynamoDB table name.
	Table string
	// KeyAttr is the partition key attribute. Default "id".
	KeyAttr string
	// SortKeyAttr, when set, makes the key composite: the idempotency key
	// goes in this attribute and the partition key holds PartitionValue.
	SortKeyAttr string
	// PartitionValue is the static partition key value of a composite key.
	// Default "idem".
	PartitionValue string
	// ExpiryAttr holds the expiry in epoch seconds, for DynamoDB TTL.
	// Default "expiration".
	ExpiryAttr string
	// LeaseAttr holds the lease end in epoch ms. Default
	// "in_progress_expiration".
	LeaseAttr string
	// StatusAttr default "status"; DataAttr (the result) default "data";
	// ValidationAttr (the payload fingerprint) default "validation".
	StatusAttr, DataAttr, ValidationAttr string
	// OpenIndex names the open-records index, an optional global secondary
	// index with partition key OpenAttr (S) and sort key LeaseAttr (N),
	// which makes listing IN_PROGRESS, FAILED and stuck records a Query
	// per shard instead of a Scan. It is sparse: only IN_PROGRESS and
	// FAILED items carry OpenAttr, so completed records, nearly all of a
	// table, are not in it. Its partition key value is the status and the
	// key's shard ("IN_PROGRESS#3"), so the writes of one status spread
	// over StatusShards index partitions. Every write sets or removes
	// OpenAttr in the request it already makes. See [CreateTable], and
	// docs/dynamodb-status-index.md for adding it to an existing table.
	OpenIndex string
	// OpenAttr is the open index's partition key attribute, written only
	// when OpenIndex is set. Default "open_status".
	OpenAttr string
	// StatusShards is the number of OpenIndex partition key values per
	// status: a key's shard is a hash of the key modulo StatusShards. A
	// listing queries every shard, so a page costs StatusShards queries at
	// least. Default 8, at most [MaxStatusShards]. Raising it keeps every
	// record listable (old values are among the new ones); lowering it
	// hides records in the shards dropped until MigrateStatusIndex
	// rewrites them.
	StatusShards int
	// StatusIndex names the legacy status index: a global secondary index
	// with partition key StatusAttr (S) and sort key LeaseAttr (N). Every
	// record is in it, completed ones included, and all writes of one
	// status land in one of its partitions; OpenIndex replaces it. Tables
	// that have it keep working with it. With both set, writes maintain
	// OpenIndex and listings keep reading StatusIndex, which is complete
	// while OpenIndex is being backfilled (the migration,
	// docs/dynamodb-status-index.md).
	StatusIndex string
	// MaxResultBytes bounds a stored result or error. Default 384 KiB,
	// which leaves room in the 400 KB item for the key and the other
	// attributes; at most MaxItemBytes.
	MaxResultBytes int
	// Spiller, when set, receives results over MaxResultBytes.
	Spiller Spiller
}

func (c Config) withDefaults() (Config, error) {
	if c.Table == "" {
		return c, fmt.Errorf("dynamostore: Config.Table is required: %w", store.ErrInvalidConfig)
	}
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.KeyAttr, "id")
	def(&c.PartitionValue, "idem")
	def(&c.ExpiryAttr, "expiration")
	def(&c.LeaseAttr, "in_progress_expiration")
	def(&c.StatusAttr, "status")
	def(&c.DataAttr, "data")
	def(&c.ValidationAttr, "validation")
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = 384 << 10
	}
	if c.MaxResultBytes < 0 || c.MaxResultBytes > MaxItemBytes {
		return c, fmt.Errorf("dynamostore: Config.MaxResultBytes %d outside 1..%d: %w", c.MaxResultBytes, MaxItemBytes, store.ErrInvalidConfig)
	}
	if c.StatusShards == 0 {
		c.StatusShards = DefaultStatusShards
	}
	if c.StatusShards < 0 || c.StatusShards > MaxStatusShards {
		return c, fmt.Errorf("dynamostore: Config.StatusShards %d outside 1..%d: %w", c.StatusShards, MaxStatusShards, store.ErrInvalidConfig)
	}
	var openAttr string
	if c.OpenIndex != "" {
		def(&c.OpenAttr, defaultOpenAttr)
		openAttr = c.OpenAttr
		if c.OpenIndex == c.StatusIndex {
			return c, fmt.Errorf("dynamostore: Config.OpenIndex and Config.StatusIndex both name index %q: they are two indexes with different keys: %w", c.OpenIndex, store.ErrInvalidConfig)
		}
	}
	names := map[string]bool{}
	for _, n := range []string{c.KeyAttr, c.SortKeyAttr, c.ExpiryAttr, c.LeaseAttr, c.StatusAttr, c.DataAttr, c.ValidationAttr, openAttr,
		attrFence, attrOwner, attrExpMs, attrCreated, attrCompleted, attrErrCode, attrErrMsg, attrErrBody, attrRef, attrDataRef, attrVersion, attrHold, attrSteps, attrStepBytes} {
		if n == "" {
			continue
		}
		if names[n] {
			return c, fmt.Errorf("dynamostore: attribute name %q used twice: %w", n, store.ErrInvalidConfig)
		}
		names[n] = true
	}
	return c, nil
}

// defaultOpenAttr is the default of Config.OpenAttr.
const defaultOpenAttr = "open_status"

// idem's own attributes.
const (
	attrFence     = "fence"
	attrOwner     = "owner"
	attrExpMs     = "expiration_ms"
	attrCreated   = "created_ms"
	attrCompleted = "completed_ms"
	attrErrCode   = "error_code"
	attrErrMsg    = "error_message"
	attrErrBody   = "error_body"
	attrRef       = "ref"
	attrDataRef   = "data_ref"
	attrVersion   = "v"
	// attrHold is true on a claim made with ClaimParams.Hold (Record.Hold),
	// absent otherwise: such an item is not taken over past its lease.
	attrHold = "hold"
	// attrSteps is the list of an IN_PROGRESS record's finished steps
	// (Record.Steps), one map each (step.go); absent when there are none.
	// attrStepBytes is their Step.Size taken together, which RecordStep's
	// condition holds to MaxResultBytes.
	attrSteps     = "steps"
	attrStepBytes = "steps_bytes"
)

// Store is an [store.Store] on one DynamoDB table. It also implements
// [store.Lister], [store.Deleter] and [store.Stepper]. It holds no goroutines: expired items
// are removed by the table's TTL.
type Store struct {
	api API
	cfg Config
	// names maps the expression placeholders to attribute names, shared by
	// every request.
	names map[string]string
}

// SystemName implements store.SystemNamer: the backend's db.system.name in
// the OpenTelemetry database semantic conventions, "aws.dynamodb".
func (s *Store) SystemName() string { return "aws.dynamodb" }

var (
	_ store.Store   = (*Store)(nil)
	_ store.Lister  = (*Store)(nil)
	_ store.Deleter = (*Store)(nil)
)

// New returns a store on cfg.Table through api (usually a *dynamodb.Client).
func New(api API, cfg Config) (*Store, error) {
	if api == nil {
		return nil, fmt.Errorf("dynamostore: nil client: %w", store.ErrInvalidConfig)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Store{api: api, cfg: c, names: c.placeholders()}, nil
}

// placeholders maps the expression placeholders to the attribute names of
// c, defaults applied.
func (c Config) placeholders() map[string]string {
	return map[string]string{
		"#pk": c.KeyAttr, "#st": c.StatusAttr, "#lease": c.LeaseAttr, "#exp": c.ExpiryAttr,
		"#data": c.DataAttr, "#val": c.ValidationAttr, "#fence": attrFence, "#owner": attrOwner,
		"#expms": attrExpMs, "#created": attrCreated, "#completed": attrCompleted,
		"#ecode": attrErrCode, "#emsg": attrErrMsg, "#ebody": attrErrBody, "#ref": attrRef,
		"#dref": attrDataRef, "#v": attrVersion, "#hold": attrHold, "#open": c.OpenAttr, "#sk": c.SortKeyAttr,
		"#steps": attrSteps, "#sbytes": attrStepBytes,
	}
}

// Config returns the store's configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// itemKey is the primary key of the item for key.
func (s *Store) itemKey(key string) map[string]types.AttributeValue {
	if s.cfg.SortKeyAttr == "" {
		return map[string]types.AttributeValue{s.cfg.KeyAttr: str(key)}
	}
	return map[string]types.AttributeValue{s.cfg.KeyAttr: str(s.cfg.PartitionValue), s.cfg.SortKeyAttr: str(key)}
}

func str(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func num(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

func unum(v uint64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatUint(v, 10)}
}

func bin(v []byte) types.AttributeValue {
	if v == nil {
		v = []byte{}
	}
	return &types.AttributeValueMemberB{Value: v}
}

// seconds is ms rounded up to whole seconds, for the TTL attribute: DynamoDB
// may then delete the item only after idem already counts it as expired.
func seconds(ms int64) int64 { return (ms + 999) / 1000 }

// names returns the placeholders used by an expression, so DynamoDB does
// not reject unused ones.
func (s *Store) pick(ph ...string) map[string]string {
	m := make(map[string]string, len(ph))
	for _, p := range ph {
		m[p] = s.names[p]
	}
	return m
}

// takeoverCond is the condition of a claim over an item seen claimable:
// the key is absent, or its item is claimable at :now, whatever its fence
// (an IN_PROGRESS item past its lease only when it is not held).
const takeoverCond = "attribute_not_exists(#pk) OR #expms <= :now OR (#st = :ip AND #lease <= :now AND attribute_not_exists(#hold))"

// resumeCond is the condition of a takeover that keeps the item's steps
// ([store.Stepper]): the item is IN_PROGRESS past its lease, not held, not
// expired, under the claim's fingerprint (:fp), whatever its fence.
const resumeCond = "#st = :ip AND #lease <= :now AND attribute_not_exists(#hold) AND #expms > :now AND #val = :fp"

// noTakeoverCond is takeoverCond for a claim with ClaimParams.NoTakeover: no
// IN_PROGRESS item is claimable, only an absent or expired settled one.
const noTakeoverCond = "attribute_not_exists(#pk) OR (#expms <= :now AND #st <> :ip)"

// takeoverSet and takeoverRest write a new claim over the item they find
// (its open-index entry between them), adding 1 to that item's fence (an
// absent fence counts as 0), and remove what the old item held. The
// claim's hold is set, or removed, by takeoverHold.
const (
	takeoverSet  = "SET #st = :ip, #owner = :owner, #lease = :lease, #exp = :exp, #expms = :expms, #val = :fp, #created = :now, #v = :v"
	takeoverRest = " REMOVE #data, #dref, #completed, #ecode, #emsg, #ebody, #ref ADD #fence :one"
)

// Claim implements [store.Store] in one conditional PutItem for a new key
// or a duplicate (DynamoDB returns the live item with the failed
// condition), and at most one more request, which always decides: a
// contended claim never loops, so it cannot run out of attempts. (The one
// exception is bounded: a takeover that keeps the item's steps, refused
// because the item changed into one whose steps are not the claim's, makes
// one more request, the plain takeover, which decides.)
//
// An item that is expired or past its lease is taken over by an
// UpdateItem whose condition is claimability at Now, not the fence seen:
// DynamoDB evaluates it on the current item and adds 1 to that item's
// fence. If another claimer took the item over in between and its claim is
// claimable at Now too, this claim takes it over in turn; if not, the
// condition fails and DynamoDB returns that claimer's item, a conflict.
// (Conditioning the write on the fence seen instead fails whenever the item
// changed in between, and under contention it can fail that way every
// round.) An item seen IN_PROGRESS past its lease under the claim's
// fingerprint is taken over keeping its steps ([store.Stepper]), under the
// condition that it still is one (resumeCond); every other takeover
// removes them.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	res, write := store.ApplyClaim(nil, p)
	_, err := s.api.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.cfg.Table),
		Item:                                s.claimItem(write),
		ConditionExpression:                 aws.String("attribute_not_exists(#pk)"),
		ExpressionAttributeNames:            s.pick("#pk"),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return res, nil
	}
	item, failed := conditionFailed(err)
	if !failed {
		return store.ClaimResult{}, s.translate("claim", p.Key, err)
	}
	res, resume, done, err := s.claimAnswer(ctx, p, item)
	if done || err != nil {
		return res, err
	}
	if resume {
		if res, done, err := s.takeover(ctx, p, true); done || err != nil {
			return res, err
		}
		// Between the two requests the item became claimable otherwise
		// (expired, or another fingerprint's claim past its lease): its
		// steps are not this claim's, and a third request drops them.
	}
	res, done, err = s.takeover(ctx, p, false)
	if err == nil && !done {
		err = &store.CorruptError{Key: p.Key, Reason: "takeover condition refused a claimable item"}
	}
	return res, err
}

// takeover writes the claim p over its key's item, seen claimable, in one
// UpdateItem. With resume (the item seen was IN_PROGRESS past its lease
// under p's fingerprint) the condition is that the item still is such a
// takeover, and the item's steps are kept ([store.Stepper]); without, the
// condition is claimability and the steps are removed. done is false, with
// no error, when the condition failed on an item that is claimable
// nonetheless (only with resume: the item is no longer one whose steps the
// claim keeps).
func (s *Store) takeover(ctx context.Context, p store.ClaimParams, resume bool) (res store.ClaimResult, done bool, err error) {
	vals := map[string]types.AttributeValue{
		":now": num(p.Now), ":ip": str(store.StatusInProgress.String()), ":owner": str(p.Owner), ":lease": num(p.LeaseUntil),
		":exp": num(seconds(p.ExpiresAt)), ":expms": num(p.ExpiresAt), ":fp": str(p.Fingerprint),
		":v": num(int64(store.RecordVersion)), ":one": num(1),
	}
	open, openPh := s.openSet(vals, store.StatusInProgress, p.Key)
	names := append(openPh, "#st", "#owner", "#lease", "#exp", "#expms", "#val", "#created", "#v",
		"#data", "#dref", "#completed", "#ecode", "#emsg", "#ebody", "#ref", "#fence", "#hold")
	set, rest := takeoverSet+open, takeoverRest
	if p.Hold {
		set, vals[":hold"] = set+", #hold = :hold", &types.AttributeValueMemberBOOL{Value: true}
	} else {
		rest = " REMOVE #hold," + rest[len(" REMOVE"):]
	}
	cond := resumeCond
	if !resume {
		cond = takeoverCond
		if p.NoTakeover {
			cond = noTakeoverCond
		}
		rest = " REMOVE #steps, #sbytes," + rest[len(" REMOVE"):]
		names = append(names, "#pk", "#steps", "#sbytes")
	}
	out, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.cfg.Table),
		Key:                                 s.itemKey(p.Key),
		ConditionExpression:                 aws.String(cond),
		UpdateExpression:                    aws.String(set + rest),
		ExpressionAttributeNames:            s.pick(names...),
		ExpressionAttributeValues:           vals,
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err != nil {
		item, failed := conditionFailed(err)
		if !failed {
			return store.ClaimResult{}, true, s.translate("claim", p.Key, err)
		}
		res, _, done, err := s.claimAnswer(ctx, p, item)
		return res, done, err
	}
	// The old item, as the update found it, decides the answer.
	old, _, err := s.decodeMeta(p.Key, out.Attributes)
	if err != nil {
		return store.ClaimResult{}, true, err
	}
	res, write := store.ApplyClaim(old, p)
	if write == nil {
		return store.ClaimResult{}, true, &store.CorruptError{Key: p.Key, Reason: "takeover replaced an item that was not claimable"}
	}
	if !resume {
		// Removed by the update, even if the item had become a takeover
		// under p's fingerprint since it was seen.
		res.Record.Steps = nil
	}
	return res, true, nil
}

// claimAnswer answers a claim from the item a failed condition returned,
// when that item is not claimable (a conflict, or this owner's own claim
// whose reply was lost); done is false when the item is claimable, and
// resume then says whether the claim takes it over under its fingerprint,
// keeping its steps.
func (s *Store) claimAnswer(ctx context.Context, p store.ClaimParams, item map[string]types.AttributeValue) (res store.ClaimResult, resume, done bool, err error) {
	seen, ref, err := s.decodeMeta(p.Key, item)
	if err != nil {
		return store.ClaimResult{}, false, true, err
	}
	res, write := store.ApplyClaim(seen, p)
	if write != nil {
		return store.ClaimResult{}, res.Takeover && seen.Fingerprint == p.Fingerprint, false, nil
	}
	if err := s.loadSpilled(ctx, res.Record, ref); err != nil {
		return store.ClaimResult{}, false, true, err
	}
	return res, false, true, nil
}

// claimItem is the whole item of a new claim.
func (s *Store) claimItem(r *store.Record) map[string]types.AttributeValue {
	it := s.itemKey(r.Key)
	it[s.cfg.StatusAttr] = str(r.Status.String())
	it[attrFence] = unum(r.Fence)
	it[attrOwner] = str(r.Owner)
	it[s.cfg.LeaseAttr] = num(r.LeaseUntil)
	it[s.cfg.ExpiryAttr] = num(seconds(r.ExpiresAt))
	it[attrExpMs] = num(r.ExpiresAt)
	it[s.cfg.ValidationAttr] = str(r.Fingerprint)
	it[attrCreated] = num(r.CreatedAt)
	it[attrVersion] = num(int64(r.Version))
	if r.Hold {
		it[attrHold] = &types.AttributeValueMemberBOOL{Value: true}
	}
	if s.cfg.OpenIndex != "" {
		it[s.cfg.OpenAttr] = str(s.openValue(r.Status, r.Key))
	}
	return it
}

// fenced is the condition of the four fenced writes: :from is the status
// the write expects.
const fencedCond = "#fence = :fence AND #owner = :owner AND #st = :from AND #expms > :now"

// fencedValues adds the values fencedCond compares, for the claim c, to
// vals (a new map when nil) and returns it.
func fencedValues(vals map[string]types.AttributeValue, c store.ClaimRef) map[string]types.AttributeValue {
	if vals == nil {
		vals = make(map[string]types.AttributeValue, 4)
	}
	vals[":now"], vals[":from"], vals[":fence"], vals[":owner"] = num(c.Now), str(c.From.OrInProgress().String()), unum(c.Fence), str(c.Owner)
	return vals
}

// Complete implements [store.Store]. It removes a stored error and the
// other form of a stored result (inline or spilled), which a settled item
// corrected by its claim (From) may hold, the item's steps
// ([store.Stepper]) and its open-index entry.
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	set, vals, ph, err := s.completeUpdate(ctx, p)
	if err != nil {
		return err
	}
	return s.fencedUpdate(ctx, "complete", p.ClaimRef, set, vals, ph)
}

// completeUpdate returns the update expression, values and attribute names
// of the Complete p (the values without the fence condition's): the one
// Complete of [Store.Complete] and [Store.CompleteInTx]. A result over
// MaxResultBytes is spilled first, or refused without a Spiller.
func (s *Store) completeUpdate(ctx context.Context, p store.CompleteParams) (string, map[string]types.AttributeValue, []string, error) {
	set := "SET #st = :done, #data = :data, #exp = :exp, #expms = :expms, #completed = :now REMOVE #dref, #ecode, #emsg, #ebody, #steps, #sbytes"
	vals := map[string]types.AttributeValue{":done": str(store.StatusCompleted.String()), ":data": bin(p.Result)}
	ph := []string{"#data", "#dref"}
	if len(p.Result) > s.cfg.MaxResultBytes {
		if s.cfg.Spiller == nil {
			return "", nil, nil, &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
		}
		ref, err := s.cfg.Spiller.Spill(ctx, SpillParams{Key: p.Key, Fence: p.Fence, Owner: p.Owner, ExpiresAt: p.ExpiresAt, Data: p.Result})
		if errors.Is(err, store.ErrMisconfigured) { // no retry mends it (s3spill: credentials refused, bucket gone)
			return "", nil, nil, fmt.Errorf("dynamostore: spill %d bytes of %s: %w", len(p.Result), p.Key, err)
		}
		if err != nil {
			return "", nil, nil, fmt.Errorf("dynamostore: spill %d bytes of %s: %w: %w", len(p.Result), p.Key, store.ErrUnavailable, err)
		}
		set = "SET #st = :done, #dref = :dref, #exp = :exp, #expms = :expms, #completed = :now REMOVE #data, #ecode, #emsg, #ebody, #steps, #sbytes"
		vals = map[string]types.AttributeValue{":done": str(store.StatusCompleted.String()), ":dref": str(ref)}
		ph = []string{"#dref", "#data"}
	}
	vals[":exp"], vals[":expms"] = num(seconds(p.ExpiresAt)), num(p.ExpiresAt)
	open, openPh := s.openRemove()
	return set + open, vals, append(append(ph, openPh...), "#exp", "#expms", "#completed", "#ecode", "#emsg", "#ebody", "#steps", "#sbytes"), nil
}

// Fail implements [store.Store]. It removes a stored result (inline or
// spilled), which a settled item corrected by its claim (From) may hold,
// and the item's steps, and puts the item in the open index under FAILED.
func (s *Store) Fail(ctx context.Context, p store.FailParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	if n := p.Err.Size(); n > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: n, Limit: s.cfg.MaxResultBytes}
	}
	vals := map[string]types.AttributeValue{
		":failed": str(store.StatusFailed.String()), ":code": str(p.Err.Code), ":msg": str(p.Err.Message),
		":body": bin(p.Err.Body), ":exp": num(seconds(p.ExpiresAt)), ":expms": num(p.ExpiresAt),
	}
	open, openPh := s.openSet(vals, store.StatusFailed, p.Key)
	set := "SET #st = :failed, #ecode = :code, #emsg = :msg, #ebody = :body, #exp = :exp, #expms = :expms, #completed = :now" + open + " REMOVE #data, #dref, #steps, #sbytes"
	return s.fencedUpdate(ctx, "fail", p.ClaimRef, set, vals, append(openPh, "#ecode", "#emsg", "#ebody", "#exp", "#expms", "#completed", "#data", "#dref", "#steps", "#sbytes"))
}

// Extend implements [store.Store]. With neither a lease nor a Ref it sets
// the lease to itself: a write that changes nothing, for its condition.
// With an open index it also sets the item's IN_PROGRESS entry, which the
// item has unless it was claimed before the index was added: a record
// older than the index is listed from its first renewal on.
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	var set, ph []string
	vals := map[string]types.AttributeValue{}
	if p.LeaseUntil != 0 {
		set, ph, vals[":lease"] = append(set, "#lease = :lease"), append(ph, "#lease"), num(p.LeaseUntil)
	}
	if p.Ref != "" {
		set, ph, vals[":ref"] = append(set, "#ref = :ref"), append(ph, "#ref"), str(p.Ref)
	}
	if len(set) == 0 {
		set, ph = []string{"#lease = #lease"}, []string{"#lease"}
	}
	open, openPh := s.openSet(vals, store.StatusInProgress, p.Key)
	return s.fencedUpdate(ctx, "extend", p.ClaimRef, "SET "+strings.Join(set, ", ")+open, vals, append(ph, openPh...))
}

// fencedUpdate runs a fenced UpdateItem for the claim c.
func (s *Store) fencedUpdate(ctx context.Context, op string, c store.ClaimRef, set string, vals map[string]types.AttributeValue, ph []string) error {
	_, err := s.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.cfg.Table),
		Key:                                 s.itemKey(c.Key),
		UpdateExpression:                    aws.String(set),
		ConditionExpression:                 aws.String(fencedCond),
		ExpressionAttributeNames:            s.pick(append(ph, "#st", "#fence", "#owner", "#expms")...),
		ExpressionAttributeValues:           fencedValues(vals, c),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return s.fencedError(op, c, err)
}

// fencedError turns a failed fenced write into ErrNotFound or a
// *FencedError from the item returned with the failure.
func (s *Store) fencedError(op string, c store.ClaimRef, err error) error {
	if err == nil {
		return nil
	}
	old, failed := conditionFailed(err)
	if !failed {
		return s.translate(op, c.Key, err)
	}
	return s.refused(op, c, old)
}

// refused answers a fenced write for the claim c whose condition failed on
// the item old (as the failure returned it): ErrNotFound, or a
// *FencedError.
func (s *Store) refused(op string, c store.ClaimRef, old map[string]types.AttributeValue) error {
	rec, _, derr := s.decodeMeta(c.Key, old)
	if derr != nil {
		return derr
	}
	if ferr := store.CheckFence(rec, c); ferr != nil {
		return ferr
	}
	return &store.CorruptError{Key: c.Key, Reason: op + " condition failed on an item that satisfies it"}
}

// Release implements [store.Store] with a conditional DeleteItem.
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	_, err := s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:                           aws.String(s.cfg.Table),
		Key:                                 s.itemKey(p.Key),
		ConditionExpression:                 aws.String(fencedCond),
		ExpressionAttributeNames:            s.pick("#st", "#fence", "#owner", "#expms"),
		ExpressionAttributeValues:           fencedValues(nil, p.ClaimRef),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	return s.fencedError("release", p.ClaimRef, err)
}

// Get implements [store.Store] with a strongly consistent GetItem.
func (s *Store) Get(ctx context.Context, key string) (*store.Record, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.cfg.Table),
		Key:            s.itemKey(key),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, s.translate("get", key, err)
	}
	r, err := s.decode(ctx, key, out.Item)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, store.ErrNotFound
	}
	return r, nil
}

// Delete implements [store.Deleter].
func (s *Store) Delete(ctx context.Context, key string) error {
	out, err := s.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:    aws.String(s.cfg.Table),
		Key:          s.itemKey(key),
		ReturnValues: types.ReturnValueAllOld,
	})
	if err != nil {
		return s.translate("delete", key, err)
	}
	if len(out.Attributes) == 0 {
		return store.ErrNotFound
	}
	return nil
}

// conditionFailed reports whether err is a failed condition, with the item
// DynamoDB returned with it (nil when the key was absent).
func conditionFailed(err error) (map[string]types.AttributeValue, bool) {
	var cf *types.ConditionalCheckFailedException
	if errors.As(err, &cf) {
		return cf.Item, true
	}
	return nil, false
}

// translate maps SDK errors to idem's at the store boundary: everything
// that is not a decision of the store is "unavailable" (the call fails
// closed), throttling also store.ErrThrottled (the SDK's retryer has
// already retried it with backoff), an item over DynamoDB's limit is a
// *TooLargeError.
func (s *Store) translate(op, key string, err error) error {
	var ve *types.ResourceNotFoundException
	if errors.As(err, &ve) {
		return fmt.Errorf("dynamostore: %s %s: table %q not found: %w: %w", op, key, s.cfg.Table, store.ErrUnavailable, err)
	}
	if isItemTooLarge(err) {
		return &store.TooLargeError{Key: key, Size: MaxItemBytes + 1, Limit: MaxItemBytes}
	}
	if throttled(err) {
		return fmt.Errorf("dynamostore: %s %s: throttled on table %q (add capacity or use on-demand): %w: %w: %w", op, key, s.cfg.Table, store.ErrThrottled, store.ErrUnavailable, err)
	}
	return fmt.Errorf("dynamostore: %s %s: %w: %w", op, key, store.ErrUnavailable, err)
}

// throttled reports whether err is DynamoDB refusing a request for its
// rate: the table's or the account's capacity (ProvisionedThroughputExceeded,
// RequestLimitExceeded) or the service's own throttling.
func throttled(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded":
		return true
	}
	return false
}
