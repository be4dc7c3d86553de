package scheduler

import (
	"runtime"
	"testing"
	"time"
)

// TestReadCPUUse: the process's CPU figure moves with work done, and the
// collector's with a collection.
func TestReadCPUUse(t *testing.T) {
	u0 := readCPUUse()
	var sink []byte
	for begin := time.Now(); time.Since(begin) < 50*time.Millisecond; {
		sink = make([]byte, 1<<16)
		sink[0]++
	}
	runtime.GC()
	u := readCPUUse().since(u0)
	if u.process <= 0 {
		t.Errorf("process CPU %v after 50 ms of work", u.process)
	}
	if u.gc <= 0 {
		t.Errorf("collector CPU %v after a collection", u.gc)
	}
	_ = sink
}
