//go:build linux || darwin

package boltstore

import "syscall"

// diskFree is the space an unprivileged process may still use on the file
// system holding dir.
func diskFree(dir string) (int64, bool, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false, err
	}
	return int64(st.Bavail) * int64(st.Bsize), true, nil //nolint:unconvert // the field types differ by platform
}
