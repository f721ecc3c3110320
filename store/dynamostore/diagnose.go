package dynamostore

import (
	"context"
	"errors"
	"fmt"

	"github.com/seed-a1b882c0/idem/store"
)

var _ store.Diagnoser = (*Store)(nil)

// Diagnose implements [store.Diagnoser] with one finding,
// "configuration": [Store.Check] (the table's key schema, time to live
// and indexes, and the spill bucket), read-only. A [*TableError] is a
// problem with its Fix.
func (s *Store) Diagnose(ctx context.Context) []store.Finding {
	err := s.Check(ctx)
	var te *TableError
	switch {
	case errors.As(err, &te):
		return []store.Finding{{Check: "configuration", Severity: store.SeverityProblem,
			What: fmt.Sprintf("table %s: %s", te.Table, te.Reason), Fix: te.Fix}}
	case err != nil:
		return []store.Finding{store.FindingOf("configuration", err)}
	}
	if _, ok := s.api.(DescribeAPI); !ok {
		return []store.Finding{{Check: "configuration", What: "not checked: the store's client cannot describe tables (DescribeAPI)"}}
	}
	return []store.Finding{{Check: "configuration", What: fmt.Sprintf("table %s has the store's key schema, time to live on %s and the indexes it names", s.cfg.Table, s.cfg.ExpiryAttr)}}
}
