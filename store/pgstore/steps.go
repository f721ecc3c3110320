package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/seed-a1b882c0/idem/store"
)

var _ store.Stepper = (*Store)(nil)

// jsonStep is one element of the steps column (migration 0003): Result
// and the error's Body base64, as encoding/json writes []byte; Result
// null for a step without one.
type jsonStep struct {
	Name   string       `json:"name"`
	At     int64        `json:"at"`
	Size   int          `json:"size"`
	Result []byte       `json:"result"`
	Err    *jsonStepErr `json:"err,omitempty"`
}

type jsonStepErr struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Body    []byte `json:"body,omitempty"`
}

func encodeStep(st store.Step) ([]byte, error) {
	j := jsonStep{Name: st.Name, At: st.At, Size: st.Size(), Result: st.Result}
	if st.Err != nil {
		j.Err = &jsonStepErr{Code: st.Err.Code, Message: st.Err.Message, Body: st.Err.Body}
	}
	return json.Marshal(j)
}

// decodeSteps reads the steps column of the row of key.
func decodeSteps(key string, b []byte) ([]store.Step, error) {
	var js []jsonStep
	if err := json.Unmarshal(b, &js); err != nil {
		return nil, &store.CorruptError{Key: key, Reason: "row steps: " + err.Error()}
	}
	if len(js) == 0 {
		return nil, nil
	}
	steps := make([]store.Step, len(js))
	for i, j := range js {
		st := store.Step{Name: j.Name, At: j.At, Result: j.Result}
		if j.Err != nil {
			st.Err = &store.ErrorRecord{Code: j.Err.Code, Message: j.Err.Message, Body: j.Err.Body}
		}
		if j.Name == "" || st.Size() != j.Size || (st.Err != nil && st.Result != nil) {
			return nil, &store.CorruptError{Key: key, Reason: fmt.Sprintf("row step %d malformed", i)}
		}
		steps[i] = st
	}
	return steps, nil
}

// RecordStep implements [store.Stepper] with one UPDATE, fenced as
// Complete's is, that appends the step when the row holds p.Index steps
// and the steps with it stay within MaxResultBytes. Only a refusal costs
// a second statement, a read of the row that explains it: not found,
// fenced, a retry of a recorded step (nil), a step out of order, or too
// large.
func (s *Store) RecordStep(ctx context.Context, p store.StepParams) error {
	if err := p.Check(); err != nil {
		return err
	}
	size := p.Step.Size()
	if size > s.cfg.MaxResultBytes {
		return &store.TooLargeError{Key: p.Key, Size: size, Limit: s.cfg.MaxResultBytes}
	}
	enc, err := encodeStep(p.Step)
	if err != nil {
		return fmt.Errorf("%w: RecordStep of %q: %w", store.ErrInvalidParams, p.Key, err)
	}
	c := p.ClaimRef
	args := []any{c.Key, int64(c.Fence), c.Owner, c.Now, int16(store.StatusInProgress), p.Index, string(enc), size, s.cfg.MaxResultBytes}
	// As in fenced: the explanation may be out of date (the row changed
	// between the write and the read); a claim's own steps are the only
	// writes that change its row's count, so one more round decides.
	for round := 0; ; round++ {
		tag, err := s.db.Exec(ctx, s.sql.step, args...)
		if err != nil {
			return s.translate("record step", c.Key, err)
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		var (
			curFence, expires, total int64
			curOwner                 string
			status                   int16
			count                    int
			name                     *string
		)
		err = s.db.QueryRow(ctx, s.sql.explainStep, c.Key, p.Index).Scan(&curFence, &curOwner, &status, &expires, &count, &name, &total)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		if err != nil {
			return s.translate("record step", c.Key, err)
		}
		if expires <= c.Now {
			return store.ErrNotFound
		}
		fe := c.Fenced(uint64(curFence), curOwner, store.Status(status))
		switch {
		case !fe.Own() || fe.Status != store.StatusInProgress:
			return fe
		case p.Index < count && name != nil && *name == p.Step.Name:
			return nil // recorded already: a retry
		case p.Index != count:
			at := "no step there"
			if p.Index < count {
				at = "another step there"
			}
			return fmt.Errorf("%w: RecordStep of %q: step %q at index %d, but the record holds %d steps and %s", store.ErrInvalidParams, p.Key, p.Step.Name, p.Index, count, at)
		case total+int64(size) > int64(s.cfg.MaxResultBytes):
			return &store.TooLargeError{Key: p.Key, Size: int(total) + size, Limit: s.cfg.MaxResultBytes}
		case round == 2:
			return fmt.Errorf("pgstore: record step %s: the row changed under every write: %w", c.Key, store.ErrUnavailable)
		}
	}
}
