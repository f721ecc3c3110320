package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/seed-a1b882c0/idem"
	"github.com/seed-a1b882c0/idem/store"
)

// Query selects records for an operator's listing. The store applies
// Status and Stuck; Scope and OlderThan are applied to what it returns,
// so a listing with them reads pages until its page is full, at most
// MaxScan records per call.
type Query struct {
	// Status, when valid, keeps only records with that status.
	Status store.Status
	// Stuck keeps only IN_PROGRESS records past their expected completion.
	Stuck bool
	// Scope keeps only keys of an operation ("charge", any tenant) or of
	// an operation and tenant ("charge/acme").
	Scope string
	// OlderThan keeps only records claimed more than this long ago.
	OlderThan time.Duration
	// Limit is the page size. Default 100, at most MaxLimit.
	Limit int
	// Cursor continues the listing from a previous page's Next.
	Cursor string
	// MaxScan bounds the records one call reads. Default 5,000.
	MaxScan int
}

// MaxLimit is the largest page a Query asks for.
const MaxLimit = 1000

// Validate reports what is wrong with q, naming the field.
func (q Query) Validate() error {
	switch {
	case q.Limit < 0 || q.Limit > MaxLimit:
		return fmt.Errorf("limit %d: want 1 to %d", q.Limit, MaxLimit)
	case q.MaxScan < 0:
		return fmt.Errorf("max scan %d: want a positive number", q.MaxScan)
	case q.OlderThan < 0:
		return fmt.Errorf("older than %v: want a positive duration", q.OlderThan)
	case q.Status != 0 && !q.Status.Valid():
		return fmt.Errorf("status %v: want IN_PROGRESS, COMPLETED or FAILED", q.Status)
	case q.Stuck && q.Status.Valid() && q.Status != store.StatusInProgress:
		return fmt.Errorf("stuck with status %s: only IN_PROGRESS records are stuck", q.Status)
	case len(q.Cursor) > 4096:
		return errors.New("cursor: longer than any cursor a listing hands out")
	}
	return CheckScope(q.Scope)
}

// CheckScope reports whether scope is empty, an operation name, or
// NAME/TENANT.
func CheckScope(scope string) error {
	if scope == "" {
		return nil
	}
	op, tenant, hasTenant := strings.Cut(scope, "/")
	if _, err := idem.NewStoreKey(op, tenant, nil); err != nil || (hasTenant && tenant == "") {
		return fmt.Errorf("scope %q: want an operation name, or NAME/TENANT", scope)
	}
	return nil
}

// Filtered reports whether q has filters the store does not apply.
func (q Query) Filtered() bool { return q.Scope != "" || q.OlderThan > 0 }

// Matches applies the filters the store does not: scope and age, at now.
func (q Query) Matches(r *store.Record, now time.Time) bool {
	if q.Scope != "" {
		sk, err := idem.ParseStoreKey(r.Key)
		if err != nil || (sk.Scope() != q.Scope && (strings.Contains(q.Scope, "/") || sk.Operation != q.Scope)) {
			return false
		}
	}
	return q.OlderThan == 0 || now.Sub(store.FromMillis(r.CreatedAt)) > q.OlderThan
}

// Page is one page of a listing.
type Page struct {
	Records []*store.Record
	// Next continues the listing ("" at its end).
	Next string
	// Scanned is how many records were read for the page.
	Scanned int
	// Short is true when the page ended early at Query.MaxScan, with
	// more to read after Next.
	Short bool
}

// List reads one page of q from l at now. Without filters the store is
// asked for exactly what is missing, so a page holds at most Limit
// records and Next continues right after the last one. With Scope or
// OlderThan, full pages are read and every match of a page read is kept
// (none is skipped: Next follows the last record read), so a page may
// hold up to 2×Limit−1 records; and at most MaxScan records are read,
// the page then ending Short.
func List(ctx context.Context, l store.Lister, q Query, now time.Time) (Page, error) {
	if err := q.Validate(); err != nil {
		return Page{}, err
	}
	if q.Limit == 0 {
		q.Limit = 100
	}
	if q.MaxScan == 0 {
		q.MaxScan = 5000
	}
	var p Page
	cursor := q.Cursor
	for {
		want := q.Limit - len(p.Records)
		if q.Filtered() {
			want = min(q.Limit, q.MaxScan-p.Scanned)
		}
		res, err := l.List(ctx, store.ListParams{Status: q.Status, Stuck: q.Stuck, Now: store.Millis(now), Limit: want, Cursor: cursor})
		if err != nil {
			return p, fmt.Errorf("listing: %w", err)
		}
		p.Scanned += len(res.Records)
		for _, r := range res.Records {
			if q.Matches(r, now) {
				p.Records = append(p.Records, r)
			}
		}
		if res.Next == cursor && cursor != "" {
			return p, errors.New("listing: the store returned the same cursor again")
		}
		cursor = res.Next
		if cursor == "" || len(p.Records) >= q.Limit {
			break
		}
		if p.Scanned >= q.MaxScan {
			p.Short = true
			break
		}
	}
	p.Next = cursor
	return p, nil
}
