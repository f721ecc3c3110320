package s3spill

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/seed-a1b882c0/idem/store"
)

// Why S3 refuses the spiller, each a cause of a [*BucketError] (errors.Is
// tells them apart).
var (
	// ErrCredentials: S3 does not know the access key (InvalidAccessKeyId)
	// or the signature does not match its secret (SignatureDoesNotMatch).
	ErrCredentials = errors.New("s3spill: credentials refused")
	// ErrAccessDenied: the credentials are valid but lack a permission
	// (AccessDenied, or a 403 without a reason).
	ErrAccessDenied = errors.New("s3spill: access denied")
	// ErrNoBucket: the bucket does not exist (NoSuchBucket, or 404 to
	// HeadBucket).
	ErrNoBucket = errors.New("s3spill: no such bucket")
	// ErrWrongRegion: the bucket is in another region than the client's
	// (301 PermanentRedirect, or AuthorizationHeaderMalformed naming the
	// region).
	ErrWrongRegion = errors.New("s3spill: bucket in another region")
)

// BucketError is S3 refusing the spiller for a reason no retry mends:
// Cause is one of ErrCredentials, ErrAccessDenied, ErrNoBucket and
// ErrWrongRegion, and the message says what to fix. It matches its cause
// and store.ErrMisconfigured (errors.Is), and, when [Spiller.Check] found
// it (at open), store.ErrInvalidConfig too. At run time Spill and Load
// return it, and neither dynamostore nor the engine retries it: the
// outcome write fails at once (see the package comment).
type BucketError struct {
	Bucket string
	Cause  error
	// Status and Code are S3's answer: HTTP status and error code.
	Status int
	Code   string
	// Region is the bucket's region, when S3 named it (ErrWrongRegion).
	Region string
	// AtOpen is set when Check found it.
	AtOpen bool
	// Err is the S3 error.
	Err error
}

func (e *BucketError) Error() string {
	var fix string
	switch e.Cause {
	case ErrCredentials:
		fix = "S3 does not accept the credentials: check the access key and its secret (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, the AWS profile or role; with storeurl, the same as DynamoDB's)"
	case ErrAccessDenied:
		fix = "grant the credentials s3:PutObject, s3:PutObjectTagging and s3:GetObject on the bucket's objects under the prefix (and s3:ListBucket for this check's HeadBucket, s3:DeleteObject for the probe)"
	case ErrNoBucket:
		fix = "create the bucket, with the lifecycle rules of docs/dynamodb.md, or fix the bucket name (storeurl: spill=s3://BUCKET/PREFIX)"
	case ErrWrongRegion:
		in := "another region"
		if e.Region != "" {
			in = "region " + e.Region
		}
		fix = "the bucket is in " + in + ": give the S3 client that region (storeurl: region=, which the table shares; a bucket in the table's region avoids cross-region traffic)"
	}
	return fmt.Sprintf("s3spill: bucket %s: S3 answered %d %s: %s", e.Bucket, e.Status, e.Code, fix)
}

// Is matches e.Cause, store.ErrMisconfigured, and store.ErrInvalidConfig
// when found at open.
func (e *BucketError) Is(target error) bool {
	return target == e.Cause || target == store.ErrMisconfigured || e.AtOpen && target == store.ErrInvalidConfig
}

// Unwrap returns the S3 error.
func (e *BucketError) Unwrap() error { return e.Err }

// refusal returns the *BucketError err is, or nil for any other error (a
// network fault, a 5xx, throttling: for a retry).
func (s *Spiller) refusal(err error) *BucketError {
	var re *awshttp.ResponseError
	if !errors.As(err, &re) {
		return nil
	}
	be := &BucketError{Bucket: s.cfg.Bucket, Status: re.HTTPStatusCode(), Err: err}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		be.Code = ae.ErrorCode()
	}
	if resp := re.HTTPResponse(); resp != nil {
		be.Region = resp.Header.Get("X-Amz-Bucket-Region")
	}
	switch {
	case be.Status == http.StatusMovedPermanently || be.Code == "PermanentRedirect" ||
		be.Code == "AuthorizationHeaderMalformed" && be.Region != "":
		be.Cause = ErrWrongRegion
	case be.Code == "InvalidAccessKeyId" || be.Code == "SignatureDoesNotMatch":
		be.Cause = ErrCredentials
	case be.Status == http.StatusForbidden:
		be.Cause = ErrAccessDenied
	case be.Code == "NoSuchBucket":
		be.Cause = ErrNoBucket
	default:
		return nil
	}
	return be
}

// CheckAPI is the part of *s3.Client that [Spiller.Check] uses besides
// [API]: HeadBucket, and DeleteObject for Config.Probe.
type CheckAPI interface {
	HeadBucket(ctx context.Context, in *s3.HeadBucketInput, opts ...func(*s3.Options)) (*s3.HeadBucketOutput, error)
	DeleteObject(ctx context.Context, in *s3.DeleteObjectInput, opts ...func(*s3.Options)) (*s3.DeleteObjectOutput, error)
}

// Check asks S3 whether the spiller can use its bucket: one HeadBucket,
// and with Config.Probe a small tagged PutObject and a DeleteObject under
// the prefix. A refusal is a [*BucketError] that says what to fix:
// credentials refused, access denied, no such bucket, another region.
// HeadBucket answers a refusal with no body, so a 403 is explained by a
// GetObject of an absent key, whose answer names the reason — and when
// that GetObject is allowed, the 403 was only s3:ListBucket, which
// spilling does not need: Check passes. Other failures are
// store.ErrUnavailable. A client without HeadBucket ([CheckAPI]) is not
// checked. dynamostore's Store.Check calls it, and so storeurl.Open.
func (s *Spiller) Check(ctx context.Context) error {
	api, ok := s.api.(CheckAPI)
	if !ok {
		return nil
	}
	bucket := aws.String(s.cfg.Bucket)
	if _, err := api.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: bucket}); err != nil {
		be := s.refusal(err)
		if be == nil && isStatus(err, http.StatusNotFound) {
			be = &BucketError{Bucket: s.cfg.Bucket, Cause: ErrNoBucket, Status: http.StatusNotFound, Code: "NotFound", Err: err}
		}
		if be == nil {
			return fmt.Errorf("s3spill: check bucket %s: %w: %w", s.cfg.Bucket, store.ErrUnavailable, err)
		}
		if be.Cause == ErrAccessDenied {
			_, gerr := s.api.GetObject(ctx, &s3.GetObjectInput{Bucket: bucket, Key: aws.String(s.cfg.Prefix + ".idem-check-" + nonce())})
			switch why := s.refusal(gerr); {
			case gerr == nil || isStatus(gerr, http.StatusNotFound) && why == nil:
				be = nil // only HeadBucket (s3:ListBucket) is denied
			case why != nil:
				be = why
			}
		}
		if be != nil {
			be.AtOpen = true
			return be
		}
	}
	if !s.cfg.Probe {
		return nil
	}
	key := aws.String(s.cfg.Prefix + ".idem-probe-" + nonce())
	_, err := s.api.PutObject(ctx, &s3.PutObjectInput{Bucket: bucket, Key: key, Body: bytes.NewReader([]byte("idem probe")),
		ContentLength: aws.Int64(10), Tagging: aws.String(TagExpiryDays + "=1")})
	if err == nil {
		_, err = api.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: bucket, Key: key})
	}
	if err != nil {
		if be := s.refusal(err); be != nil {
			be.AtOpen = true
			return be
		}
		return fmt.Errorf("s3spill: probe of bucket %s: %w: %w", s.cfg.Bucket, store.ErrUnavailable, err)
	}
	return nil
}

func isStatus(err error, status int) bool {
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == status
}

func nonce() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
