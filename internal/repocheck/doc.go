// Package repocheck holds the repository's own checks, as tests: the import
// rules of every module (deps_test.go), the docs' links, go blocks and
// index (markdown_test.go, codeblocks_test.go, doclinks_test.go), the
// operations files (the Grafana dashboard and the Prometheus rules,
// ops_test.go), the fuzz target list (fuzz_test.go), and the one identity
// path: no adapter builds an idem.Identity itself, and every adapter has a
// find test (identity_test.go). It has no code of
// its own: the tests run from the repository's root, whatever folder
// `go test` starts them in.
package repocheck
