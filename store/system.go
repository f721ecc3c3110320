package store

// SystemNamer is an optional power of a [Store]: the name of its backend
// as the OpenTelemetry database semantic conventions spell
// db.system.name ("redis", "postgresql", "aws.dynamodb"), or a name of the
// same shape for a backend they do not list ("memory", "bbolt"). A tracer
// labels the spans of the store's calls with it.
type SystemNamer interface {
	SystemName() string
}
