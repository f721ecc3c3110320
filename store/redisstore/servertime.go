package redisstore

import (
	"context"
	"time"
)

// ServerTime implements [store.ServerTimer]: Redis TIME, in microseconds.
// On Redis Cluster it is the clock of the node the client picks; the
// masters' clocks are each synchronised (NTP), and the engine corrects its
// clock to this one (see docs/state-machine.md, "One clock").
func (s *Store) ServerTime(ctx context.Context) (time.Time, error) {
	t, err := s.c.Time(ctx).Result()
	if err != nil {
		return time.Time{}, s.translate("time", "", err)
	}
	return t, nil
}
