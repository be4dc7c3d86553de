// Command cudahold allocates GPU memory through the CUDA driver API and holds
// it, so that the real-GPU checks (tests/gpu) can see a CUDA process in NVML
// and have gpufrac's watchdog act on it.
//
// It loads libcuda.so.1 with dlopen at run time: no CUDA toolkit is needed to
// build it, and it builds (and `go vet` passes) on machines without a GPU.
// It uses the device's primary context (cuDevicePrimaryCtxRetain), allocates
// -mib MiB with cuMemAlloc, writes every byte (cuMemsetD8) so the memory is
// backed, prints one line
//
//	READY pid=<pid> mib=<n> device="<name>" driver=<cuda driver version> free_mib=<n> total_mib=<n>
//
// and holds the memory until its stdin closes, it gets SIGTERM or SIGINT, or
// -hold passes. Pick the GPU with CUDA_VISIBLE_DEVICES=<GPU UUID>; cudahold
// uses CUDA device 0 of what it sees.
//
// Exit status: 0 after holding, 2 when libcuda.so.1 cannot be loaded (no
// NVIDIA driver), 1 on any CUDA error (the step and CUDA's error name are
// printed), 64 on bad flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// holdInfo is what the allocation reports.
type holdInfo struct {
	Device     string
	Driver     int
	FreeBytes  uint64
	TotalBytes uint64
}

// errNoDriver means libcuda.so.1 could not be loaded.
var errNoDriver = errors.New("CUDA driver library not loadable")

// allocate is the CUDA allocation (cuda.go); tests replace it.
var allocate = cudaAllocate

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cudahold", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mib := fs.Uint64("mib", 1024, "GPU memory to allocate and hold, in MiB")
	hold := fs.Duration("hold", 5*time.Minute, "hold at most this long, then free the memory and exit")
	if err := fs.Parse(args); err != nil {
		return 64
	}
	if *mib == 0 || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "cudahold: want -mib > 0 and no arguments")
		return 64
	}
	info, err := allocate(*mib << 20)
	if err != nil {
		fmt.Fprintf(stderr, "cudahold: %v\n", err)
		if errors.Is(err, errNoDriver) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(stdout, "READY pid=%d mib=%d device=%q driver=%d free_mib=%d total_mib=%d\n",
		os.Getpid(), *mib, info.Device, info.Driver, info.FreeBytes>>20, info.TotalBytes>>20)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(eof)
	}()
	select {
	case s := <-sig:
		fmt.Fprintf(stderr, "cudahold: %v, exiting\n", s)
	case <-eof:
		fmt.Fprintln(stderr, "cudahold: stdin closed, exiting")
	case <-time.After(*hold):
		fmt.Fprintf(stderr, "cudahold: held for %v, exiting\n", *hold)
	}
	return 0
}
