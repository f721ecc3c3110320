// Package s3spill is a [dynamostore.Spiller] on Amazon S3: results too
// large for a DynamoDB item (400 KB) are written to an S3 object and the
// item keeps a reference to it.
//
// # Objects
//
// Each Spill writes a new object, named after the claim and the data:
//
//	PREFIX/<url-escaped store key>/<fence>-<owner hash>-<SHA-256 of data, hex>
//
// A claim may settle its record more than once (Complete From FAILED), and
// a write the store refuses still spilled first: naming objects by their
// content means a refused write can never overwrite the object a settled
// record points to, and a retried write of the same data reuses its object.
//
// The reference kept in the item is
//
//	s3://BUCKET/KEY?len=N&sha256=HEX
//
// and Load checks both: an object that is gone, shorter, longer or altered
// fails closed with a [*LoadError], which wraps store.ErrCorrupt, so the
// engine neither replays wrong bytes nor runs the operation again. Network
// and service failures are not corruption: they are returned as they are,
// and dynamostore reports them as store.ErrUnavailable.
//
// # Refusals
//
// [Spiller.Check] (storeurl.Open calls it, through dynamostore's
// Store.Check) asks S3 whether the bucket is usable before the first
// request: credentials refused, access denied, no such bucket, bucket in
// another region — each a [*BucketError] with its own cause (errors.Is:
// [ErrCredentials], [ErrAccessDenied], [ErrNoBucket], [ErrWrongRegion])
// that says what to fix, and matches store.ErrInvalidConfig.
//
// The same refusals at run time (403, 301, 404 NoSuchBucket to a
// PutObject or GetObject: a key rotated, a policy changed, the bucket
// deleted) are a *BucketError that wraps store.ErrMisconfigured, not
// store.ErrUnavailable: no retry mends them, so the engine does not retry
// the outcome write for Config.WriteTimeout. It fails at once, and is
// logged and counted once (OutcomeStoreError and OutcomeCompleteFailed).
// What the caller sees: Do returns the operation's result with no error,
// as for any outcome that could not be recorded (Result.Recorded is zero);
// the key stays IN_PROGRESS until its lease ends, then a retry runs the
// operation again (and fails to record it the same way until the bucket
// is fixed). A replay whose object cannot be read for such a refusal fails
// with the *BucketError (store.ErrMisconfigured), never with a replay of
// something else.
//
// # Write order and expiry
//
// dynamostore spills before the conditional write that stores the
// reference. An object whose record write never lands (refused, or the
// process died in between) is an orphan. Every object is tagged with the
// expiry of the record it was written for:
//
//	idem-expiry-days = whole days from the write to the record's expiry, rounded up
//	idem-expires-at  = the record's expiry, RFC 3339 (UTC)
//
// so a bucket lifecycle rule per idem-expiry-days value expires objects,
// orphans included, no earlier than their records (docs/dynamodb.md has
// the lifecycle JSON). Tags are sent with the PutObject (the x-amz-tagging
// header), which needs s3:PutObjectTagging besides s3:PutObject.
package s3spill

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/seed-a1b882c0/idem/store"
	"github.com/seed-a1b882c0/idem/store/dynamostore"
)

// Tag keys written on every object.
const (
	TagExpiryDays = "idem-expiry-days"
	TagExpiresAt  = "idem-expires-at"
)

// API is the part of *s3.Client the spiller uses.
type API interface {
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
	GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error)
}

// Config configures a [Spiller]. Bucket is required.
type Config struct {
	// Bucket is the S3 bucket.
	Bucket string
	// Prefix is prepended to every object key, with a "/" between them
	// when it lacks one. Default "" (keys start with the store key).
	Prefix string
	// SSE is the server-side encryption asked for each object: "" (the
	// bucket's default), "AES256" (SSE-S3) or "aws:kms" (SSE-KMS).
	SSE string
	// KMSKeyID is the KMS key of SSE "aws:kms"; empty means the account's
	// AWS-managed key. Only with SSE "aws:kms".
	KMSKeyID string
	// Now returns the time; default time.Now. Used only for the
	// idem-expiry-days tag.
	Now func() time.Time
	// Probe makes [Spiller.Check] also write a small tagged object under
	// Prefix and delete it, proving the write permissions (and needing
	// s3:DeleteObject). Default false: Check makes one HeadBucket.
	Probe bool
}

// Spiller is a [dynamostore.Spiller] on one S3 bucket. It is safe for
// concurrent use and holds no goroutines.
type Spiller struct {
	api API
	cfg Config
}

var _ dynamostore.Spiller = (*Spiller)(nil)

// New returns a spiller writing to cfg.Bucket through api (usually an
// *s3.Client).
func New(api API, cfg Config) (*Spiller, error) {
	if api == nil {
		return nil, fmt.Errorf("s3spill: nil client: %w", store.ErrInvalidConfig)
	}
	if cfg.Bucket == "" {
		return nil, fmt.Errorf("s3spill: Config.Bucket is required: %w", store.ErrInvalidConfig)
	}
	switch cfg.SSE {
	case "", string(types.ServerSideEncryptionAes256), string(types.ServerSideEncryptionAwsKms):
	default:
		return nil, fmt.Errorf("s3spill: Config.SSE %q: use \"\", \"AES256\" or \"aws:kms\": %w", cfg.SSE, store.ErrInvalidConfig)
	}
	if cfg.KMSKeyID != "" && cfg.SSE != string(types.ServerSideEncryptionAwsKms) {
		return nil, fmt.Errorf("s3spill: Config.KMSKeyID needs Config.SSE \"aws:kms\": %w", store.ErrInvalidConfig)
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Spiller{api: api, cfg: cfg}, nil
}

// ObjectKey is the key of the object Spill writes for p.
func (s *Spiller) ObjectKey(p dynamostore.SpillParams) string {
	owner := sha256.Sum256([]byte(p.Owner))
	data := sha256.Sum256(p.Data)
	return fmt.Sprintf("%s%s/%d-%s-%s", s.cfg.Prefix, url.PathEscape(p.Key), p.Fence, hex.EncodeToString(owner[:4]), hex.EncodeToString(data[:]))
}

// Spill implements [dynamostore.Spiller] with one PutObject.
func (s *Spiller) Spill(ctx context.Context, p dynamostore.SpillParams) (string, error) {
	key := s.ObjectKey(p)
	sum := sha256.Sum256(p.Data)
	exp := time.UnixMilli(p.ExpiresAt).UTC()
	const day = 24 * time.Hour
	days := max(int64((exp.Sub(s.cfg.Now())+day-1)/day), 1)
	tags := url.Values{TagExpiryDays: {strconv.FormatInt(days, 10)}, TagExpiresAt: {exp.Format(time.RFC3339)}}
	in := &s3.PutObjectInput{
		Bucket:        aws.String(s.cfg.Bucket),
		Key:           aws.String(key),
		Body:          bytes.NewReader(p.Data),
		ContentLength: aws.Int64(int64(len(p.Data))),
		ContentType:   aws.String("application/octet-stream"),
		Tagging:       aws.String(tags.Encode()),
	}
	if s.cfg.SSE != "" {
		in.ServerSideEncryption = types.ServerSideEncryption(s.cfg.SSE)
	}
	if s.cfg.KMSKeyID != "" {
		in.SSEKMSKeyId = aws.String(s.cfg.KMSKeyID)
	}
	if _, err := s.api.PutObject(ctx, in); err != nil {
		if be := s.refusal(err); be != nil {
			return "", be // no retry mends it
		}
		return "", fmt.Errorf("s3spill: put s3://%s/%s: %w", s.cfg.Bucket, key, err)
	}
	return Ref{Bucket: s.cfg.Bucket, Key: key, Len: int64(len(p.Data)), SHA256: sum}.String(), nil
}

// Load implements [dynamostore.Spiller] with one GetObject, checking the
// length and SHA-256 the reference carries.
func (s *Spiller) Load(ctx context.Context, ref string) ([]byte, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	out, err := s.api.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(r.Bucket), Key: aws.String(r.Key)})
	if err != nil {
		var nk *types.NoSuchKey
		var nb *types.NoSuchBucket
		if errors.As(err, &nk) || errors.As(err, &nb) {
			return nil, &LoadError{Ref: ref, Reason: "object not found", Err: err}
		}
		if be := s.refusal(err); be != nil {
			return nil, be
		}
		return nil, fmt.Errorf("s3spill: get %s: %w", ref, err)
	}
	defer out.Body.Close()
	// One byte more than expected tells a longer object from a right one.
	data, err := io.ReadAll(io.LimitReader(out.Body, r.Len+1))
	if err != nil {
		return nil, fmt.Errorf("s3spill: read %s: %w", ref, err)
	}
	if int64(len(data)) != r.Len {
		return nil, &LoadError{Ref: ref, Reason: fmt.Sprintf("object holds %d bytes or more, not %d", len(data), r.Len)}
	}
	if sha256.Sum256(data) != r.SHA256 {
		return nil, &LoadError{Ref: ref, Reason: "object bytes do not match the SHA-256 of the stored result"}
	}
	return data, nil
}

// Ref is a parsed spill reference.
type Ref struct {
	Bucket, Key string
	Len         int64
	SHA256      [sha256.Size]byte
}

// String is the reference as stored: s3://BUCKET/KEY?len=N&sha256=HEX.
func (r Ref) String() string {
	u := url.URL{Scheme: "s3", Host: r.Bucket, Path: "/" + r.Key, RawQuery: "len=" + strconv.FormatInt(r.Len, 10) + "&sha256=" + hex.EncodeToString(r.SHA256[:])}
	return u.String()
}

// ParseRef parses a reference written by Spill; one it cannot read is a
// *LoadError.
func ParseRef(ref string) (Ref, error) {
	bad := func(why string) (Ref, error) { return Ref{}, &LoadError{Ref: ref, Reason: "reference " + why} }
	u, err := url.Parse(ref)
	if err != nil || u.Scheme != "s3" || u.Host == "" || len(u.Path) < 2 {
		return bad("is not s3://BUCKET/KEY")
	}
	q := u.Query()
	n, err := strconv.ParseInt(q.Get("len"), 10, 64)
	if err != nil || n < 0 {
		return bad("has no length")
	}
	sum, err := hex.DecodeString(q.Get("sha256"))
	if err != nil || len(sum) != sha256.Size {
		return bad("has no SHA-256")
	}
	r := Ref{Bucket: u.Host, Key: u.Path[1:], Len: n}
	copy(r.SHA256[:], sum)
	return r, nil
}

// LoadError reports a spilled result that cannot be vouched for: its
// object is gone, or its bytes are not the ones stored. It wraps
// store.ErrCorrupt (errors.Is), so the engine fails closed.
type LoadError struct {
	Ref    string
	Reason string
	// Err is the S3 error, if any.
	Err error
}

func (e *LoadError) Error() string {
	return "s3spill: spilled result " + e.Ref + ": " + e.Reason
}

// Is makes errors.Is(err, store.ErrCorrupt) true.
func (e *LoadError) Is(target error) bool { return target == store.ErrCorrupt }

// Unwrap returns the S3 error.
func (e *LoadError) Unwrap() error { return e.Err }
