package idemhttp

import (
	"bytes"
	"errors"
	"hash"
	"io"
	"net"
	"os"
	"slices"
	"time"
)

// spool holds a request body read once to fingerprint it, for the handler
// to read again: the first memLimit bytes in memory, the rest in a
// temporary file, so a large body is hashed as it streams in and never
// held whole in memory.
type spool struct {
	mem  []byte
	file *os.File
	size int64
	rd   memReader // the handler's reader of mem, when there is no file
}

// memReader reads a body held in memory; Close does nothing.
type memReader struct{ bytes.Reader }

func (*memReader) Close() error { return nil }

// readBody streams body into h and into a spool. It fails with a
// *BodyTooLargeError past maxBytes and a *BodyError when reading fails.
func readBody(body io.Reader, h hash.Hash, sizeHint, maxBytes, memLimit int64, tempDir string) (*spool, error) {
	limited := io.LimitReader(body, maxBytes+1)
	initial := int64(512)
	if sizeHint > 0 {
		initial = sizeHint + 1 // room to see EOF without growing
	}
	buf := make([]byte, 0, min(initial, memLimit))
	for {
		end := min(int64(cap(buf)), memLimit)
		if int64(len(buf)) == end {
			if end == memLimit {
				break
			}
			buf = slices.Grow(buf, len(buf)) // double
			continue
		}
		n, err := limited.Read(buf[len(buf):end])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if int64(len(buf)) > maxBytes {
				return nil, &BodyTooLargeError{Limit: maxBytes, Size: -1}
			}
			h.Write(buf)
			return &spool{mem: buf, size: int64(len(buf))}, nil
		}
		if err != nil {
			return nil, &BodyError{Err: err}
		}
	}
	// Past memLimit: the rest goes to a temporary file, hashed as it is
	// written.
	h.Write(buf)
	f, err := os.CreateTemp(tempDir, "idemhttp-body-*")
	if err != nil {
		return nil, &BodyError{Err: err}
	}
	s := &spool{mem: buf, file: f}
	n, err := io.Copy(io.MultiWriter(f, h), limited)
	s.size = int64(len(buf)) + n
	switch {
	case err != nil:
		err = &BodyError{Err: err}
	case s.size > maxBytes:
		err = &BodyTooLargeError{Limit: maxBytes, Size: -1}
	default:
		if _, serr := f.Seek(0, io.SeekStart); serr != nil {
			err = &BodyError{Err: serr}
		}
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// reader returns the body for the handler.
func (s *spool) reader() io.ReadCloser {
	if s.file == nil {
		s.rd.Reset(s.mem)
		return &s.rd
	}
	return io.NopCloser(io.MultiReader(bytes.NewReader(s.mem), s.file))
}

// close removes the temporary file, if any.
func (s *spool) close() {
	if s == nil || s.file == nil {
		return
	}
	name := s.file.Name()
	err := s.file.Close()
	err = errors.Join(err, os.Remove(name))
	_ = err // a leftover temp file is not worth failing the request for
	s.file = nil
}

// deadlineReader fails the first read that returns after deadline (by now),
// so that a body trickling in is cut off even where the connection has no
// read deadline. A read that reaches the end in time is never failed.
type deadlineReader struct {
	r        io.Reader
	now      func() time.Time
	deadline time.Time
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err == nil && d.now().After(d.deadline) {
		return n, os.ErrDeadlineExceeded
	}
	return n, err
}

// isTimeout reports whether a body read failed on a deadline: the
// connection's (os.ErrDeadlineExceeded, also what HTTP/2 streams report) or
// a deadlineReader's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
