package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Status is a check's outcome.
type Status string

// Check outcomes.
const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Skip Status = "SKIP"
)

// Exit statuses of gpucheck (and of tests/gpu/run.sh run).
const (
	exitPass = 0
	// exitFail: at least one check failed.
	exitFail = 1
	// exitNoGPU: no NVIDIA GPU or driver here; nothing was checked.
	exitNoGPU = 2
	// exitUsage: bad flags, or gpucheck could not start its helpers.
	exitUsage = 64
)

// Check is one line of the results block.
type Check struct {
	Name   string
	Status Status
	// Detail says what was measured, with the numbers, or why it was skipped.
	Detail string
}

// Report is the results block gpucheck prints.
type Report struct {
	Date   time.Time
	Host   string
	Driver string
	// GPUs are one line each: index, name, UUID, memory, MIG mode.
	GPUs   []string
	Checks []Check
	// Notes are printed after the checks (how the checks ran).
	Notes []string
}

// Add appends a check.
func (r *Report) Add(name string, st Status, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Status: st, Detail: fmt.Sprintf(format, args...)})
}

// Note appends a note.
func (r *Report) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Counts returns how many checks passed, failed and were skipped.
func (r *Report) Counts() (pass, fail, skip int) {
	for _, c := range r.Checks {
		switch c.Status {
		case Pass:
			pass++
		case Fail:
			fail++
		default:
			skip++
		}
	}
	return pass, fail, skip
}

// ExitCode is exitFail when a check failed, else exitPass. A report
// without any passed check also fails: nothing was shown.
func (r *Report) ExitCode() int {
	pass, fail, _ := r.Counts()
	if fail > 0 || pass == 0 {
		return exitFail
	}
	return exitPass
}

// Write prints the results block.
func (r *Report) Write(w io.Writer) {
	var b strings.Builder
	fmt.Fprintln(&b, "=== gpufrac real-GPU checks (tests/gpu) ===")
	fmt.Fprintf(&b, "date:   %s\n", r.Date.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "host:   %s\n", r.Host)
	fmt.Fprintf(&b, "driver: %s\n", r.Driver)
	for _, g := range r.GPUs {
		fmt.Fprintf(&b, "gpu:    %s\n", g)
	}
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%-4s %s: %s\n", c.Status, c.Name, c.Detail)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	pass, fail, skip := r.Counts()
	verdict := "PASS"
	if r.ExitCode() != exitPass {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "result: %s (%d passed, %d failed, %d skipped)\n", verdict, pass, fail, skip)
	fmt.Fprintln(&b, "===")
	_, _ = io.WriteString(w, b.String())
}

// WriteNotRun prints the block of a run that could not start, with why.
func WriteNotRun(w io.Writer, date time.Time, host, why string) {
	fmt.Fprintf(w, "=== gpufrac real-GPU checks (tests/gpu) ===\ndate:   %s\nhost:   %s\nresult: NOT RUN: %s\n===\n",
		date.UTC().Format(time.RFC3339), host, why)
}
