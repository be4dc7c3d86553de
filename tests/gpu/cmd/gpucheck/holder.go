package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// holder is a running cudahold (or, in tests, any program that prints a
// READY line and waits): a child process holding GPU memory.
type holder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	// PID is the child's PID; Ready is its READY line.
	PID   uint32
	Ready string

	stderr lockedBuffer
	done   chan struct{}
	// state is the child's exit state once done is closed.
	state *os.ProcessState
}

// lockedBuffer is a bytes.Buffer safe for the writer goroutine exec starts.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startHolder starts argv with env added and waits up to timeout for its
// READY line. The child dies with gpucheck (SIGKILL on parent death, and
// cudahold exits when its stdin closes).
func startHolder(ctx context.Context, argv, env []string, timeout time.Duration) (*holder, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	h := &holder{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &h.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	h.PID = uint32(cmd.Process.Pid)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			if !sent && strings.HasPrefix(sc.Text(), "READY ") {
				lines <- sc.Text()
				sent = true
			}
		}
		close(lines)
	}()
	go func() {
		_ = cmd.Wait()
		h.state = cmd.ProcessState
		close(h.done)
	}()
	select {
	case l, ok := <-lines:
		if ok {
			h.Ready = l
			return h, nil
		}
		<-h.done
		return nil, fmt.Errorf("%s exited (%v) before it was ready: %s", argv[0], h.state, strings.TrimSpace(h.stderr.String()))
	case <-time.After(timeout):
		h.Stop()
		return nil, fmt.Errorf("%s not ready after %v: %s", argv[0], timeout, strings.TrimSpace(h.stderr.String()))
	case <-ctx.Done():
		h.Stop()
		return nil, ctx.Err()
	}
}

// Alive tells whether the child has not exited.
func (h *holder) Alive() bool {
	select {
	case <-h.done:
		return false
	default:
		return true
	}
}

// WaitExit waits up to d for the child to exit and returns its state.
func (h *holder) WaitExit(d time.Duration) (*os.ProcessState, bool) {
	select {
	case <-h.done:
		return h.state, true
	case <-time.After(d):
		return nil, false
	}
}

// Stop ends the child (stdin closed, then SIGKILL) and waits for it.
func (h *holder) Stop() {
	if !h.Alive() {
		return
	}
	_ = h.stdin.Close()
	if _, ok := h.WaitExit(5 * time.Second); ok {
		return
	}
	_ = h.cmd.Process.Kill()
	<-h.done
}

// killedBySIGKILL tells whether the state is a death by SIGKILL.
func killedBySIGKILL(st *os.ProcessState) bool {
	if st == nil {
		return false
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}
