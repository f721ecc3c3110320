//go:build !unix

package benchkit

import (
	"errors"
	"time"
)

// SelfCPU is not available here: the client's CPU is not reported.
func SelfCPU() (time.Duration, error) { return 0, errors.New("benchkit: no getrusage on this system") }
