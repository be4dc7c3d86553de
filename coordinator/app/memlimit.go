package app

import (
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
)

// EnvMemoryLimit names the environment variable that tells the coordinator
// its container's memory limit in bytes; the Helm chart sets it from
// limits.memory through the downward API (resourceFieldRef).
const EnvMemoryLimit = "GPUFRAC_MEMORY_LIMIT"

// memoryLimitShare is the share of the container's limit the Go runtime
// aims to stay under: the rest is for what the runtime does not count
// (thread stacks outside the heap, the binary's mapped pages) and for the
// moments a collection is late.
const memoryLimitShare = 0.9

// MemoryLimit sets the Go runtime's soft memory limit to 90 % of the
// container's memory limit given in containerLimit (bytes, as the
// downward API writes it), unless goMemLimit (the GOMEMLIMIT variable,
// which the runtime read itself) is set. It returns the limit set, 0 when
// it set none.
//
// Why: the coordinator's live heap is mostly its informers' objects, and
// with the default GOGC the runtime lets the heap grow to twice the live
// heap before it collects - at 50,000 pods more than the chart's 512 MiB
// limit, so the container would be OOM-killed while half its memory is
// garbage (docs/benchmarks-history.md, "Scale"). A soft limit makes the collector
// run earlier as the heap nears it, at some CPU; it cannot shrink the live
// heap, so a limit below it means collections back to back (the runtime
// caps them at about half the CPU) rather than an OOM kill.
func MemoryLimit(containerLimit, goMemLimit string) (int64, error) {
	if strings.TrimSpace(goMemLimit) != "" || strings.TrimSpace(containerLimit) == "" {
		return 0, nil
	}
	limit, err := strconv.ParseInt(strings.TrimSpace(containerLimit), 10, 64)
	if err != nil || limit <= 0 {
		return 0, fmt.Errorf("%s=%q is not a memory limit in bytes", EnvMemoryLimit, containerLimit)
	}
	soft := int64(math.Floor(float64(limit) * memoryLimitShare))
	debug.SetMemoryLimit(soft)
	return soft, nil
}
