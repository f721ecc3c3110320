package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"sync"

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

// journal is the open claim journal. Appends are grouped: the first
// caller to find no write under way writes everything queued so far with
// one write(2) while the others wait for it; a checkpoint (run by the
// committer) holds the journal, so no append interleaves with it.
type journal struct {
	f   *os.File
	max int64

	mu       sync.Mutex
	cond     sync.Cond // on mu: a write finished
	buf      []byte    // queued for the next write
	next     uint64    // the group buf belongs to
	written  uint64    // groups written (or failed) so far
	writing  bool      // a write or a checkpoint is under way
	size     int64
	failed   uint64 // the last group whose write failed (0: none)
	failErr  error
	needsCut bool // a write failed: the journal may hold a torn entry
}

func newJournal(f *os.File, max int64) *journal {
	j := &journal{f: f, max: max, next: 1}
	j.cond.L = &j.mu
	return j
}

// append writes b (whole entries) to the journal, grouped with the
// appends queued meanwhile, and returns when the write returned.
func (j *journal) append(b []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.buf = append(j.buf, b...)
	my := j.next
	for j.written < my {
		if j.writing {
			j.cond.Wait()
			continue
		}
		j.writing = true
		buf, group := j.buf, j.next
		j.buf, j.next = nil, j.next+1
		j.mu.Unlock()
		n, err := j.f.Write(buf)
		j.mu.Lock()
		j.size += int64(n)
		if err != nil {
			j.failed, j.failErr, j.needsCut = group, err, true
		}
		j.written, j.writing = group, false
		j.cond.Broadcast()
	}
	if j.failed == my {
		return j.failErr
	}
	return nil
}

// due reports whether a checkpoint is due: the journal is over its size,
// or a write failed (it may have left a torn entry hiding every later one,
// or a drop unwritten).
func (j *journal) due() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.needsCut || j.size > j.max
}

// hold waits for the write under way and keeps appends out until the
// returned function is called.
func (j *journal) hold() (release func()) {
	j.mu.Lock()
	for j.writing {
		j.cond.Wait()
	}
	j.writing = true
	j.mu.Unlock()
	return func() {
		j.mu.Lock()
		j.writing = false
		j.cond.Broadcast()
		j.mu.Unlock()
	}
}

// truncate empties the journal; the caller holds it (or is Close).
func (j *journal) truncate() error {
	if err := j.f.Truncate(0); err != nil {
		return err
	}
	j.mu.Lock()
	j.size, j.needsCut = 0, false
	j.mu.Unlock()
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
// committer runs it between batches, holding the journal, so no other
// write interleaves.
func (s *Store) checkpoint() error {
	defer s.commits.j.hold()()
	held := s.heldClaims()
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
