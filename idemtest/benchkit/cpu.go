package benchkit

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// CPU meters, over a part of a benchmark, the CPU time of the processes a
// message costs: this process (the client, getrusage), a Redis server
// (used_cpu_user + used_cpu_sys of INFO cpu) and a broker found by its
// process name (utime + stime of /proc/PID/stat, Linux). Report gives
// each per message. A process it cannot read is left out of the report,
// with a log line.
type CPU struct {
	redis                  string // host:port, "" for none
	broker                 string // process name ("nats-server", "beam.smp"), "" for none
	pid                    int
	client, srv, brk       time.Duration
	clientOK, srvOK, brkOK bool
}

// StartCPU starts metering: redisAddr is the Redis whose CPU to read ("" for
// none), broker the process name of the message broker ("" for none),
// or its process id in decimal (where several processes share the name).
func StartCPU(b testing.TB, redisAddr, broker string) *CPU {
	b.Helper()
	c := &CPU{redis: redisAddr, broker: broker}
	if pid, err := strconv.Atoi(broker); err == nil && pid > 0 {
		c.pid = pid
	} else if broker != "" {
		if c.pid = FindProcess(broker); c.pid == 0 {
			b.Logf("benchkit: no process named %s: its CPU is not reported", broker)
		}
	}
	c.client, c.srv, c.brk, c.clientOK, c.srvOK, c.brkOK = c.read()
	return c
}

func (c *CPU) read() (client, srv, brk time.Duration, clientOK, srvOK, brkOK bool) {
	client, err := SelfCPU()
	clientOK = err == nil
	if c.redis != "" {
		srv, err = RedisCPU(c.redis)
		srvOK = err == nil
	}
	if c.pid != 0 {
		brk, err = ProcCPU(c.pid)
		brkOK = err == nil
	}
	return
}

// Report reports the CPU each process spent per message since StartCPU,
// over n messages: client-cpu-µs/msg, redis-cpu-µs/msg and
// broker-cpu-µs/msg.
func (c *CPU) Report(b *testing.B, n int) {
	b.Helper()
	client, srv, brk, clientOK, srvOK, brkOK := c.read()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	if clientOK && c.clientOK {
		b.ReportMetric(per(client-c.client), "client-cpu-µs/msg")
	}
	if srvOK && c.srvOK {
		b.ReportMetric(per(srv-c.srv), "redis-cpu-µs/msg")
	}
	if brkOK && c.brkOK {
		b.ReportMetric(per(brk-c.brk), "broker-cpu-µs/msg")
	}
}

// RedisCPU returns the CPU time the Redis at addr has used
// (used_cpu_user + used_cpu_sys of INFO cpu), asked over a connection of
// its own.
func RedisCPU(addr string) (time.Duration, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("*2\r\n$4\r\nINFO\r\n$3\r\ncpu\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("benchkit: INFO cpu answered %q: %v", head, err)
	}
	var secs float64
	found := 0
	for found < 2 {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, fmt.Errorf("benchkit: INFO cpu: %w", err)
		}
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("benchkit: INFO cpu %s: %w", name, err)
			}
			secs += f
			found++
		}
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// clockTicks is the unit of /proc/PID/stat's times (USER_HZ), 100 on
// Linux's every architecture but alpha and ia64.
const clockTicks = 100

// ProcCPU returns the CPU time process pid has used: utime + stime of
// /proc/PID/stat (Linux).
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command may hold spaces: the fields start after its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("benchkit: /proc/%d/stat has no command", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("benchkit: /proc/%d/stat is short", pid)
	}
	// After the command: state (3), ... utime (14), stime (15).
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("benchkit: /proc/%d/stat times not numbers", pid)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// FindProcess returns the id of a process whose name (/proc/PID/comm) is
// name, or 0 when there is none (or /proc cannot be read).
func FindProcess(name string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == name {
			return pid
		}
	}
	return 0
}

// StoreRedis is the address of the Redis a benchmark's store uses, whose
// CPU it reports: IDEM_REDIS_ADDR (make bench-consumers starts a Redis of
// its own and sets it), or 127.0.0.1:6379.
func StoreRedis() string {
	if a := os.Getenv("IDEM_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}
