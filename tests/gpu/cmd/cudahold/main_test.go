package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestRunHoldsUntilStdinCloses(t *testing.T) {
	defer func(a func(uint64) (holdInfo, error)) { allocate = a }(allocate)
	var asked uint64
	allocate = func(b uint64) (holdInfo, error) {
		asked = b
		return holdInfo{Device: "NVIDIA H200", Driver: 12080, FreeBytes: 100 << 30, TotalBytes: 140 << 30}, nil
	}
	stdinR, stdinW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan int)
	go func() { done <- run([]string{"-mib", "4096"}, stdinR, outW, io.Discard) }()
	line := make([]byte, 200)
	n, _ := outR.Read(line)
	want := fmt.Sprintf("READY pid=%d mib=4096 device=\"NVIDIA H200\" driver=12080 free_mib=102400 total_mib=143360\n", os.Getpid())
	if string(line[:n]) != want {
		t.Errorf("stdout %q, want %q", line[:n], want)
	}
	if asked != 4096<<20 {
		t.Errorf("allocated %d bytes, want %d", asked, 4096<<20)
	}
	select {
	case <-done:
		t.Fatal("exited while its stdin is open")
	case <-time.After(50 * time.Millisecond):
	}
	_ = stdinW.Close()
	if code := <-done; code != 0 {
		t.Errorf("exit status %d", code)
	}
}

func TestRunErrors(t *testing.T) {
	defer func(a func(uint64) (holdInfo, error)) { allocate = a }(allocate)
	for _, tc := range []struct {
		err  error
		want int
	}{
		{fmt.Errorf("%w: dlopen libcuda.so.1: not found", errNoDriver), 2},
		{errors.New("CUDA call cuMemAlloc(&ptr, bytes) failed: CUDA_ERROR_OUT_OF_MEMORY (2)"), 1},
	} {
		allocate = func(uint64) (holdInfo, error) { return holdInfo{}, tc.err }
		var errOut strings.Builder
		if code := run([]string{"-mib", "1"}, strings.NewReader(""), io.Discard, &errOut); code != tc.want || !strings.Contains(errOut.String(), tc.err.Error()) {
			t.Errorf("%v: exit status %d, want %d; stderr %q", tc.err, code, tc.want, errOut.String())
		}
	}
	if code := run([]string{"-mib", "0"}, strings.NewReader(""), io.Discard, io.Discard); code != 64 {
		t.Errorf("-mib 0: exit status %d, want 64", code)
	}
}

// TestCUDAWithoutDriver calls the real CUDA path: without the NVIDIA driver,
// libcuda.so.1 does not load and cudahold says so with status 2 (a machine
// with the driver's libraries but no device fails in cuInit, status 1).
func TestCUDAWithoutDriver(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	var errOut strings.Builder
	if code := run([]string{"-mib", "1"}, strings.NewReader(""), io.Discard, &errOut); (code != 2 || !strings.Contains(errOut.String(), "libcuda.so.1")) && (code != 1 || !strings.Contains(errOut.String(), "cuInit")) {
		t.Errorf("exit status %d, want 2 (no libcuda.so.1) or 1 (cuInit failed); stderr %q", code, errOut.String())
	}
}
