package boltstore

import bolt "go.etcd.io/bbolt"

// CommitStats returns how many group commits the store ran and how many
// writes they carried.
func (s *Store) CommitStats() (commits, writes int64) {
	return s.commits.commits.Load(), s.commits.writes.Load()
}

// GroupCommit is the store's committer over a raw bbolt file, for the raw
// baseline benchmark.
type GroupCommit struct{ c *committer }

func NewGroupCommit(db *bolt.DB) GroupCommit {
	g := GroupCommit{&committer{}}
	g.c.start(db, 0)
	return g
}

func (g GroupCommit) Do(fn func(*bolt.Tx) error) error { return g.c.do(fn) }
func (g GroupCommit) Close()                           { g.c.close() }
