// Package gpu holds the real-GPU checks of gpufrac-node (issue 26): run.sh
// and the programs under cmd/. These tests check run.sh's behaviour on a
// machine without a GPU; the checks themselves are tested in
// cmd/gpucheck against the mock NVML.
package gpu

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runScript runs run.sh with args and env added; it returns the exit
// status, stdout and stderr.
func runScript(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"run.sh"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatalf("running run.sh: %v", err)
	return 0, "", ""
}

func TestRunWithoutGPU(t *testing.T) {
	dir := t.TempDir()
	// Binaries present or not, no device node means no GPU.
	code, out, errOut := runScript(t, []string{"GPUCHECK_DEV=" + filepath.Join(dir, "nvidiactl"), "GPUCHECK_BIN=" + dir}, "run")
	if code != 2 {
		t.Errorf("exit status %d, want 2", code)
	}
	if !strings.Contains(out, "result: NOT RUN: no NVIDIA GPU on this machine") || !strings.Contains(out, "date:") {
		t.Errorf("stdout:\n%s", out)
	}
	if !strings.Contains(errOut, "cannot run: no NVIDIA GPU") {
		t.Errorf("stderr:\n%s", errOut)
	}
}

// TestRunOnThisMachine runs run.sh run as it is: this machine has no GPU.
func TestRunOnThisMachine(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	if code, out, _ := runScript(t, nil, "run"); code != 2 || !strings.Contains(out, "NOT RUN: no NVIDIA GPU") {
		t.Errorf("exit status %d, stdout:\n%s", code, out)
	}
}

func TestRunWithoutBinaries(t *testing.T) {
	dir := t.TempDir()
	code, out, _ := runScript(t, []string{"GPUCHECK_DEV=/dev/null", "GPUCHECK_BIN=" + dir}, "run")
	if code != 3 || !strings.Contains(out, "run 'tests/gpu/run.sh build' first") {
		t.Errorf("exit status %d, want 3; stdout:\n%s", code, out)
	}
}

func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestRunBinaryDoesNotStart(t *testing.T) {
	dir := t.TempDir()
	writeScript(t, filepath.Join(dir, "gpucheck"), "echo 'version GLIBC_2.99 not found' >&2; exit 1\n")
	writeScript(t, filepath.Join(dir, "cudahold"), "exit 64\n")
	code, out, _ := runScript(t, []string{"GPUCHECK_DEV=/dev/null", "GPUCHECK_BIN=" + dir}, "run")
	if code != 3 || !strings.Contains(out, "gpucheck does not start here (exit 1): version GLIBC_2.99 not found") {
		t.Errorf("exit status %d, want 3; stdout:\n%s", code, out)
	}
}

// TestRunPassesThrough: run.sh hands gpucheck the cudahold path and its
// own arguments, and exits with gpucheck's status.
func TestRunPassesThrough(t *testing.T) {
	dir := t.TempDir()
	writeScript(t, filepath.Join(dir, "gpucheck"), `[ "$1" = -h ] && exit 64
echo "args: $*"; exit 1
`)
	writeScript(t, filepath.Join(dir, "cudahold"), "exit 64\n")
	code, out, _ := runScript(t, []string{"GPUCHECK_DEV=/dev/null", "GPUCHECK_BIN=" + dir}, "run", "-hold-mib", "2048")
	if code != 1 || !strings.Contains(out, "args: -cudahold "+dir+"/cudahold -hold-mib 2048") {
		t.Errorf("exit status %d, want 1; stdout:\n%s", code, out)
	}
}

func TestUsage(t *testing.T) {
	if code, _, errOut := runScript(t, nil); code != 64 || !strings.Contains(errOut, "usage:") {
		t.Errorf("exit status %d, stderr %q", code, errOut)
	}
}
