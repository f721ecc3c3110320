//go:build !unix

package idem_test

import "time"

// cpuNow is not measured here: the cpu-ns/op metric reads 0.
func cpuNow() time.Duration { return 0 }
