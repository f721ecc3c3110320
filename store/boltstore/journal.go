package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/seed-a1b882c0/idem/store"
)

// The claim journal: an append-only file beside the bbolt file (its path
// plus ".claims") holding the Local claims kept in memory, so that they
// outlive a crash of the process. It is written with write(2) and never
// synced: what it holds is in the page cache once the write returned, and
// survives SIGKILL; power loss can take its tail, with the holders of the
// claims in it (see the package doc).
//
// An entry is its payload's length (uint32, little-endian), the payload's
// CRC-32C (uint32), then the payload: entryClaim and a record
// (store.MarshalRecord), or entryDrop and a key (the held claim is gone:
// settled, released or forgotten). Reading stops at the first entry that is
// short or fails its CRC: the torn or unsynced tail of a power loss.

const (
	entryClaim = 1
	entryDrop  = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func journalPath(dbPath string) string { return dbPath + ".claims" }

// appendEntry appends one journal entry to b.
func appendEntry(b []byte, kind byte, payload []byte) []byte {
	n := len(b)
	b = append(b, make([]byte, 8)...)
	b = append(b, kind)
	b = append(b, payload...)
	binary.LittleEndian.PutUint32(b[n:], uint32(len(b)-n-8))
	binary.LittleEndian.PutUint32(b[n+4:], crc32.Checksum(b[n+8:], castagnoli))
	return b
}

func claimEntry(r *store.Record) []byte { return appendEntry(nil, entryClaim, store.MarshalRecord(r)) }
func dropEntry(key string) []byte       { return appendEntry(nil, entryDrop, []byte(key)) }

// parseJournal returns the last entry of each key, in order: a claim, or
// nil for a drop. It stops at the first short or damaged entry.
func parseJournal(b []byte) map[string]*store.Record {
	last := map[string]*store.Record{}
	for len(b) >= 8 {
		n := int(binary.LittleEndian.Uint32(b))
		if n < 1 || n > len(b)-8 {
			break
		}
		p := b[8 : 8+n]
		if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
			break
		}
		b = b[8+n:]
		switch p[0] {
		case entryClaim:
			r, err := store.UnmarshalRecord(p[1:])
			if err != nil || r.Status != store.StatusInProgress {
				return last
			}
			last[r.Key] = r
		case entryDrop:
			last[string(p[1:])] = nil
		default:
			return last
		}
	}
	return last
}

// journal is the open claim journal, written by the committer only.
type journal struct {
	f    *os.File
	size int64
	max  int64
}

func (j *journal) append(b []byte) error {
	n, err := j.f.Write(b)
	j.size += int64(n)
	return err
}

func (j *journal) truncate() error {
	if err := j.f.Truncate(0); err != nil {
		return err
	}
	j.size = 0
	return nil
}

// restore writes the claims in journal file path into the bbolt file (one
// synced commit) and empties the journal. A claim is restored only where it
// is newer than the file's record: none, or one of a lower fence; a record
// with its fence (the claim settled or extended) or a higher one (a later
// claim) is a later state. A damaged record in the file is left alone for
// an operator. It returns how many claims it restored.
func (s *Store) restore(path string) (int, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("boltstore: read claim journal: %w", err)
	}
	n := 0
	if claims := parseJournal(b); len(claims) > 0 {
		err = s.db.Update(func(tx *bolt.Tx) error {
			n = 0
			for _, j := range claims {
				if j == nil {
					continue
				}
				r, err := s.read(tx, j.Key)
				if err != nil {
					continue
				}
				if r == nil || r.Fence < j.Fence {
					if err := s.write(tx, j); err != nil {
						return err
					}
					n++
				}
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("boltstore: restore claim journal: %w", err)
		}
	}
	if len(b) > 0 {
		if err := os.Truncate(path, 0); err != nil {
			return n, fmt.Errorf("boltstore: truncate claim journal: %w", err)
		}
	}
	return n, nil
}

// checkpoint writes every held claim into the file where it is newer than
// the file's record (one synced commit) and empties the journal. The
// committer runs it between batches, so no journal write interleaves.
func (s *Store) checkpoint() error {
	var held []*store.Record
	s.mu.Lock()
	for _, sl := range s.slots {
		if r := sl.held.Load(); r != nil {
			held = append(held, r)
		}
	}
	s.mu.Unlock()
	if len(held) > 0 {
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, h := range held {
				r, err := s.read(tx, h.Key)
				if err != nil {
					continue
				}
				if r == nil || r.Fence < h.Fence {
					if err := s.write(tx, h); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	s.commits.rotations.Add(1)
	return s.commits.j.truncate()
}
