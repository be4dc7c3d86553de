package scheduler

import (
	rtmetrics "runtime/metrics"
	"syscall"
	"time"
)

// cpuUse is the CPU time the process has used: all its threads, user and
// system, and the part the garbage collector used (the runtime's
// estimate, brought up to date at each collection). A cycle's log line
// gives both for the cycle, beside its wall time: a cycle much longer
// than the CPU the process used meanwhile waited for a core.
type cpuUse struct {
	process, gc time.Duration
}

// gcCPUMetric is the runtime's estimate of the collector's CPU time.
const gcCPUMetric = "/cpu/classes/gc/total:cpu-seconds"

// readCPUUse reads the process's CPU use now; a figure it cannot read is 0.
func readCPUUse() cpuUse {
	var u cpuUse
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	sample := []rtmetrics.Sample{{Name: gcCPUMetric}}
	rtmetrics.Read(sample)
	if sample[0].Value.Kind() == rtmetrics.KindFloat64 {
		u.gc = time.Duration(sample[0].Value.Float64() * float64(time.Second))
	}
	return u
}

// since is the CPU used from u0 to u.
func (u cpuUse) since(u0 cpuUse) cpuUse {
	return cpuUse{process: u.process - u0.process, gc: u.gc - u0.gc}
}
