package main

import (
	"strings"
	"testing"
	"time"
)

func TestReport(t *testing.T) {
	r := &Report{Date: time.Date(2026, 11, 28, 19, 0, 0, 0, time.UTC), Host: "gpu-1", Driver: "570.124.06", GPUs: []string{"0 NVIDIA H200 GPU-x"}}
	r.Add("inventory-nvml", Pass, "%d GPU(s)", 1)
	r.Add("mps", Skip, "no MPS")
	r.Note("plain process")
	if r.ExitCode() != exitPass {
		t.Errorf("ExitCode = %d with only passes and skips", r.ExitCode())
	}
	var b strings.Builder
	r.Write(&b)
	want := `=== gpufrac real-GPU checks (tests/gpu) ===
date:   2026-11-28T19:00:00Z
host:   gpu-1
driver: 570.124.06
gpu:    0 NVIDIA H200 GPU-x
PASS inventory-nvml: 1 GPU(s)
SKIP mps: no MPS
note: plain process
result: PASS (1 passed, 0 failed, 1 skipped)
===
`
	if b.String() != want {
		t.Errorf("Write:\n%s\nwant:\n%s", b.String(), want)
	}

	r.Add("watchdog-kill", Fail, "not killed")
	if r.ExitCode() != exitFail {
		t.Errorf("ExitCode = %d with a failure", r.ExitCode())
	}
	b.Reset()
	r.Write(&b)
	if !strings.Contains(b.String(), "FAIL watchdog-kill: not killed\n") || !strings.Contains(b.String(), "result: FAIL (1 passed, 1 failed, 1 skipped)") {
		t.Errorf("Write with a failure:\n%s", b.String())
	}

	// Nothing passed: nothing was shown, and that is no pass.
	skipped := &Report{}
	skipped.Add("mps", Skip, "no MPS")
	if skipped.ExitCode() != exitFail {
		t.Errorf("ExitCode = %d with only skips", skipped.ExitCode())
	}
}
