package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem/store"
)

// batchStatements are the statements of ClaimBatch, CompleteBatch and
// ExtendBatch: one each for a whole batch, its rows passed as arrays
// (unnest).
type batchStatements struct{ claim, complete, extend string }

func newBatchStatements(t string) batchStatements {
	// The claim is the upsert of claimUpsert for every row at once, the
	// proposed row's columns (EXCLUDED) standing for the parameters:
	// created_at is the claim's now. Rows go in key order, so that
	// concurrent batches lock common rows in one order.
	// $8 is ClaimParams.NoTakeover, one for the whole batch: no
	// IN_PROGRESS row is then replaced, whatever its lease and expiry.
	// A held row (column hold) is not claimable past its lease.
	claimable := "(NOT ($8::boolean AND cur.status = 1) AND (cur.expires_at <= EXCLUDED.created_at OR (cur.status = 1 AND NOT cur.hold AND cur.lease_until <= EXCLUDED.created_at)))"
	set := ""
	for _, c := range []struct{ col, claimed string }{
		{"status", "1"}, {"fence", "cur.fence + 1"}, {"owner", "EXCLUDED.owner"}, {"lease_until", "EXCLUDED.lease_until"},
		{"expires_at", "EXCLUDED.expires_at"}, {"fingerprint", "EXCLUDED.fingerprint"}, {"result", "NULL"}, {"err_code", "NULL"},
		{"err_message", "NULL"}, {"err_body", "NULL"}, {"ref", "NULL"}, {"created_at", "EXCLUDED.created_at"},
		{"completed_at", "NULL"}, {"version", "EXCLUDED.version"}, {"takeover", "cur.expires_at > EXCLUDED.created_at"},
		{"hold", "EXCLUDED.hold"}, {"steps", carried("EXCLUDED.created_at", "EXCLUDED.fingerprint")},
	} {
		if set != "" {
			set += ", "
		}
		set += c.col + " = CASE WHEN " + claimable + " THEN " + c.claimed + " ELSE cur." + c.col + " END"
	}
	claim := "INSERT INTO " + t + " AS cur (key, status, fence, owner, lease_until, expires_at, fingerprint, created_at, version, takeover, hold) " +
		"SELECT v.key, 1, 1, v.owner, v.lease_until, v.expires_at, v.fingerprint, v.now, $7, false, v.hold " +
		"FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[], $9::boolean[]) AS v(key, owner, lease_until, expires_at, fingerprint, now, hold) " +
		"ORDER BY v.key ON CONFLICT (key) DO UPDATE SET " + set + " RETURNING " + columns
	// The complete is the fenced UPDATE of every row at once; each row of
	// the batch answers whether it was written and, when it was not, the
	// row as the statement's snapshot had it, to explain the refusal.
	// The extend is the same with Extend's SET: the lease kept where the
	// row's lease_until is 0, the ref where its ref is empty. Both take
	// the fence condition of the single write (fenced in newStatements).
	fenced := func(unnest, set string) string {
		return "WITH v AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::smallint[], " + unnest + ")), " +
			"up AS (UPDATE " + t + " AS cur SET " + set + " FROM v WHERE cur.key = v.key AND cur.fence = v.fence AND cur.owner = v.owner " +
			"AND cur.status = v.from_status AND cur.expires_at > v.now RETURNING cur.key) " +
			"SELECT v.key, up.key IS NOT NULL, cur.fence, cur.owner, cur.status, cur.expires_at FROM v " +
			"LEFT JOIN up ON up.key = v.key LEFT JOIN " + t + " AS cur ON cur.key = v.key AND up.key IS NULL"
	}
	complete := fenced("$6::bigint[], $7::bytea[]) AS v(key, fence, owner, now, from_status, expires_at, result",
		"status = 2, result = v.result, err_code = NULL, err_message = NULL, err_body = NULL, steps = NULL, expires_at = v.expires_at, completed_at = v.now")
	extend := fenced("$6::bigint[], $7::text[]) AS v(key, fence, owner, now, from_status, lease_until, ref",
		"lease_until = COALESCE(NULLIF(v.lease_until, 0), cur.lease_until), ref = COALESCE(NULLIF(v.ref, ''), cur.ref)")
	return batchStatements{claim: claim, complete: complete, extend: extend}
}

// ClaimBatch implements [store.BatchClaimer] in one statement: the
// claim's last statement (an INSERT … ON CONFLICT DO UPDATE that decides
// on each row's newest version, under its lock) for every key of the batch
// at once, which returns every row. A conflicting row gets a new version
// with its own values, as with that statement alone. A key named again in
// the batch is decided from the answer to its earlier claim, as Claim
// would decide it on the row that claim left; should it be claimable
// there (it could only be at another now), it is claimed by Claim after
// the statement. Results and errors are per key, in the order of ps.
func (s *Store) ClaimBatch(ctx context.Context, ps []store.ClaimParams) ([]store.ClaimResult, []error) {
	res := make([]store.ClaimResult, len(ps))
	errs := make([]error, len(ps))
	if len(ps) == 0 {
		return res, errs
	}
	if slices.ContainsFunc(ps, func(p store.ClaimParams) bool { return p.NoTakeover != ps[0].NoTakeover }) {
		// The statement takes one NoTakeover for every row; a batch that
		// mixes them (no caller of ours makes one) is claimed key by key.
		for i, p := range ps {
			res[i], errs[i] = s.Claim(ctx, p)
		}
		return res, errs
	}
	first := make(map[string]int, len(ps)) // key → its first claim in ps
	var (
		keys, owners, fps  []string
		leases, exps, nows []int64
		holds              []bool
		later              []int // claims of a key named before
	)
	for i, p := range ps {
		if _, ok := first[p.Key]; ok {
			later = append(later, i)
			continue
		}
		first[p.Key] = i
		keys, owners, fps = append(keys, p.Key), append(owners, p.Owner), append(fps, p.Fingerprint)
		leases, exps, nows = append(leases, p.LeaseUntil), append(exps, p.ExpiresAt), append(nows, p.Now)
		holds = append(holds, p.Hold)
	}
	rows, err := s.db.Query(ctx, s.bsql.claim, keys, owners, leases, exps, fps, nows, store.RecordVersion, ps[0].NoTakeover, holds)
	if err == nil {
		for rows.Next() {
			rec, takeover, serr := scanRecord(rows, nil)
			if serr != nil {
				var ce *store.CorruptError
				if errors.As(serr, &ce) {
					if i, ok := first[ce.Key]; ok {
						errs[i] = serr // that row alone
						continue
					}
				}
				err = serr
				break
			}
			i, ok := first[rec.Key]
			if !ok {
				continue
			}
			p := ps[i]
			acquired := rec.Status == store.StatusInProgress && rec.Owner == p.Owner && rec.Fingerprint == p.Fingerprint
			res[i] = store.ClaimResult{Acquired: acquired, Takeover: acquired && takeover, Record: rec}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for key, i := range first {
		switch {
		case err != nil:
			errs[i] = s.translate("claim", key, err)
		case errs[i] == nil && res[i].Record == nil:
			// Not an outcome of INSERT … ON CONFLICT DO UPDATE without a
			// WHERE, which inserts or updates every row.
			errs[i] = fmt.Errorf("pgstore: claim %s: the batch statement returned no row for it: %w", key, store.ErrUnavailable)
		}
	}
	// The later claims of a key, each against the row its key's claim
	// before it left.
	cur := make(map[string]int, len(later)) // key → the claim that last decided it
	for _, i := range later {
		p := ps[i]
		j, ok := cur[p.Key]
		if !ok {
			j = first[p.Key]
		}
		cur[p.Key] = i
		if errs[j] != nil {
			errs[i] = errs[j]
			continue
		}
		if r, write := store.ApplyClaim(res[j].Record, p); write == nil {
			res[i] = r
			continue
		}
		res[i], errs[i] = s.Claim(ctx, p)
	}
	return res, errs
}

// CompleteBatch implements [store.BatchCompleter] in one statement: the
// fenced UPDATE of Complete for every write of the batch at once (UPDATE …
// FROM the batch's rows), which answers for each write whether it was
// made and, for one refused, the row as the statement saw it, which
// explains the refusal (ErrFenced, ErrNotFound). A refusal the row does
// not explain (the claim changed between the statement's snapshot and its
// lock) and a key named again in the batch are made by Complete after the
// statement, in order, so each keeps Complete's answer. A result over
// MaxResultBytes is refused alone.
func (s *Store) CompleteBatch(ctx context.Context, ps []store.CompleteParams) []error {
	errs := make([]error, len(ps))
	at := make(map[string]int, len(ps)) // key → its write in the statement
	var (
		keys, owners       []string
		fences, nows, exps []int64
		froms              []int16
		results            [][]byte
		again              []int // made one by one after the statement
	)
	for i, p := range ps {
		if len(p.Result) > s.cfg.MaxResultBytes {
			errs[i] = &store.TooLargeError{Key: p.Key, Size: len(p.Result), Limit: s.cfg.MaxResultBytes}
			continue
		}
		if _, ok := at[p.Key]; ok {
			again = append(again, i)
			continue
		}
		at[p.Key] = i
		result := p.Result
		if result == nil {
			result = []byte{}
		}
		keys, owners, results = append(keys, p.Key), append(owners, p.Owner), append(results, result)
		fences, nows, exps = append(fences, int64(p.Fence)), append(nows, p.Now), append(exps, p.ExpiresAt)
		froms = append(froms, int16(p.From.OrInProgress()))
	}
	if len(keys) == 0 {
		return errs
	}
	rows, err := s.db.Query(ctx, s.bsql.complete, keys, fences, owners, nows, froms, exps, results)
	s.fencedBatch("complete", rows, err, errs, at, again, func(i int) store.ClaimRef { return ps[i].ClaimRef }, func(i int) error {
		return s.complete(ctx, s.db, ps[i])
	})
	return errs
}

// ExtendBatch implements [store.BatchExtender] in one statement: the
// fenced UPDATE of Extend for every renewal of the batch at once (UPDATE
// … FROM the batch's rows), each with its own lease end and ref, which
// answers for each renewal whether it was made and, for one refused, the
// row as the statement saw it, which explains the refusal (ErrFenced,
// ErrNotFound), as CompleteBatch does. A refusal the row does not explain
// and a key named again in the batch are made by Extend after the
// statement, in order. An Extend that [store.ExtendParams.Check] refuses
// is not sent.
func (s *Store) ExtendBatch(ctx context.Context, ps []store.ExtendParams) []error {
	errs := make([]error, len(ps))
	at := make(map[string]int, len(ps)) // key → its renewal in the statement
	var (
		keys, owners, refs   []string
		fences, nows, leases []int64
		froms                []int16
		again                []int // made one by one after the statement
	)
	for i, p := range ps {
		if err := p.Check(); err != nil {
			errs[i] = err
			continue
		}
		if _, ok := at[p.Key]; ok {
			again = append(again, i)
			continue
		}
		at[p.Key] = i
		keys, owners, refs = append(keys, p.Key), append(owners, p.Owner), append(refs, p.Ref)
		fences, nows, leases = append(fences, int64(p.Fence)), append(nows, p.Now), append(leases, p.LeaseUntil)
		froms = append(froms, int16(p.From.OrInProgress()))
	}
	if len(keys) == 0 {
		return errs
	}
	rows, err := s.db.Query(ctx, s.bsql.extend, keys, fences, owners, nows, froms, leases, refs)
	s.fencedBatch("extend", rows, err, errs, at, again, func(i int) store.ClaimRef { return ps[i].ClaimRef }, func(i int) error {
		return s.Extend(ctx, ps[i])
	})
	return errs
}

// fencedBatch reads the answer of a batch of fenced writes' statement
// (rows, or its error err): per write, whether it was made and, for one
// refused, the row the statement saw (fence, owner, status, expires_at).
// at maps each key to the write of ps (ref(i) its claim) that the
// statement made for it; errs gets each write's answer. A refusal the row
// does not explain (the claim changed between the statement's snapshot
// and its lock: see Store.fenced) joins again, the writes made one by one
// with one(i) after the statement, in order.
func (s *Store) fencedBatch(op string, rows pgx.Rows, err error, errs []error, at map[string]int, again []int, ref func(i int) store.ClaimRef, one func(i int) error) {
	answered := make(map[string]bool, len(at))
	if err == nil {
		for rows.Next() {
			var (
				key            string
				written        bool
				fence, expires *int64
				owner          *string
				status         *int16
			)
			if err = rows.Scan(&key, &written, &fence, &owner, &status, &expires); err != nil {
				break
			}
			i, ok := at[key]
			if !ok {
				continue
			}
			answered[key] = true
			c := ref(i)
			switch {
			case written:
			case fence == nil || *expires <= c.Now:
				errs[i] = store.ErrNotFound
			default:
				fe := c.Fenced(uint64(*fence), *owner, store.Status(*status))
				if fe.Own() && fe.Status == c.From.OrInProgress() {
					again = append(again, i) // out of date: see fenced
					continue
				}
				errs[i] = fe
			}
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	for key, i := range at {
		if err != nil {
			errs[i] = s.translate(op, key, err)
		} else if !answered[key] {
			errs[i] = fmt.Errorf("pgstore: %s %s: the batch statement returned no row for it: %w", op, key, store.ErrUnavailable)
		}
	}
	if err != nil {
		for _, i := range again {
			if errs[i] == nil {
				errs[i] = s.translate(op, ref(i).Key, err)
			}
		}
		return
	}
	slices.Sort(again)
	for _, i := range again {
		errs[i] = one(i)
	}
}
