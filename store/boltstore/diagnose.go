package boltstore

import (
	"context"
	"fmt"

	"github.com/seed-a1b882c0/idem/store"
)

var _ store.Diagnoser = (*Store)(nil)

// Diagnose implements [store.Diagnoser] with one finding, "disk": the
// free space of the file system holding the store's file against
// Config.MinFreeBytes ([Store.DiskFree]); below it new claims fail as
// unavailable.
func (s *Store) Diagnose(context.Context) []store.Finding {
	free, min, ok, err := s.DiskFree()
	switch {
	case err != nil:
		return []store.Finding{{Check: "disk", Severity: store.SeverityProblem, What: "cannot read the free space: " + err.Error(),
			Fix: "check that the store's file and its folder can be read"}}
	case !ok:
		return []store.Finding{{Check: "disk", What: "free space not checked on this platform or with MinFreeBytes < 0"}}
	case free < min:
		return []store.Finding{{Check: "disk", Severity: store.SeverityProblem,
			What: fmt.Sprintf("%s free, under the %s new claims need (MinFreeBytes): new calls fail as unavailable", bytesOf(free), bytesOf(min)),
			Fix:  "free space on the file system of the store's file, or move it to a larger one"}}
	}
	return []store.Finding{{Check: "disk", What: fmt.Sprintf("%s free (new claims need %s)", bytesOf(free), bytesOf(min))}}
}

func bytesOf(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
