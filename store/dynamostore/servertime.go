package dynamostore

import (
	"context"
	"errors"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// serverTimeKey is the key ServerTime reads. It is never written; reading
// an absent item costs half a read capacity unit.
const serverTimeKey = "idem:server-time"

// ServerTime implements [store.ServerTimer]: the Date header of the
// response to an eventually consistent GetItem of a key that is never
// written (the header the SDK already reads to correct its signing clock).
// Date tells whole seconds, so ServerTime returns the middle of the second
// it names: its error is half a second, plus half the round trip.
func (s *Store) ServerTime(ctx context.Context) (time.Time, error) {
	out, err := s.api.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:            aws.String(s.cfg.Table),
		Key:                  s.itemKey(serverTimeKey),
		ProjectionExpression: aws.String("#pk"),
		ExpressionAttributeNames: map[string]string{
			"#pk": s.cfg.KeyAttr,
		},
	})
	if err != nil {
		return time.Time{}, s.translate("time", "", err)
	}
	t, ok := awsmiddleware.GetServerTime(out.ResultMetadata)
	if !ok || t.IsZero() {
		return time.Time{}, errDateMissing
	}
	return t.Add(500 * time.Millisecond), nil
}

var errDateMissing = errors.New("dynamostore: time: the response carried no Date header (a proxy in between removes it?)")
