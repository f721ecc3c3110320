package benchkit_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/idemtest/benchkit"
	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// The meters read real processes: this one (getrusage, /proc/self) and a
// real Redis (INFO cpu).
func TestCPUMeters(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	comm, err := os.ReadFile(filepath.Join("/proc", "self", "comm"))
	if err != nil {
		t.Fatal(err)
	}
	if pid := benchkit.FindProcess(strings.TrimSpace(string(comm))); pid == 0 {
		t.Errorf("FindProcess(%q) found nothing, not even this process", strings.TrimSpace(string(comm)))
	}
	self, err := benchkit.SelfCPU()
	if err != nil || self <= 0 {
		t.Errorf("SelfCPU: %v, %v", self, err)
	}
	proc, err := benchkit.ProcCPU(os.Getpid())
	if err != nil || proc < 0 {
		t.Errorf("ProcCPU of this process: %v, %v", proc, err)
	}
	addr := testenv.Reach(t, "Redis", "IDEM_REDIS_ADDR", "127.0.0.1:6379")
	if d, err := benchkit.RedisCPU(addr); err != nil || d <= 0 {
		t.Errorf("RedisCPU: %v, %v", d, err)
	}
	if _, err := benchkit.RedisCPU("127.0.0.1:1"); err == nil {
		t.Error("RedisCPU of no server answered")
	}
}
