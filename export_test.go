package idem

// Canonicalize is canonicalize, for the canonical form's tests in package
// idem_test: the form Request.Identity fingerprints a payload in.
var Canonicalize = canonicalize
