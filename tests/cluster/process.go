package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process describes one component process the cluster started.
type Process struct {
	// Name is the component name ("etcd", "kube-apiserver", ...).
	Name string
	// PID is the process ID; the process leads its own process group (PGID == PID).
	PID int
	// LogPath is the file that holds the process's stdout and stderr.
	LogPath string
}

// process is a running component. Its stdout and stderr go straight to a log file
// (no copying goroutine). The only goroutine it owns waits for the process and ends
// when the process ends; stop makes sure that happens.
type process struct {
	Process
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // cmd.Wait's result, valid after done is closed
}

// startProcess starts bin in its own process group with the given environment
// (nothing is inherited from the test process) and appends its output to logPath.
func startProcess(name, bin string, args, env []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log file of %s: %w", name, err)
	}
	// The child has its own copy of the descriptor once started.
	defer logFile.Close()
	fmt.Fprintf(logFile, "### %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own process group: Stop signals the whole group, children included.
		Setpgid: true,
		// If the test binary dies without running its cleanups (timeout panic, SIGKILL),
		// the kernel kills the components instead of leaving them behind.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{
		Process: Process{Name: name, PID: cmd.Process.Pid, LogPath: logPath},
		cmd:     cmd,
		done:    make(chan struct{}),
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then sends SIGKILL and
// waits for the process to be reaped. It is safe to call more than once. After it
// returns, no process of the group is left (any straggler got SIGKILL).
func (p *process) stop(grace time.Duration) error {
	if !p.exited() {
		// ESRCH only means the group is already gone.
		if err := syscall.Kill(-p.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("sending SIGTERM to %s (pgid %d): %w", p.Name, p.PID, err)
		}
		select {
		case <-p.done:
		case <-time.After(grace):
		}
	}
	// Kill the group even when the leader has exited: a child may still be in it.
	if err := syscall.Kill(-p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending SIGKILL to %s (pgid %d): %w", p.Name, p.PID, err)
	}
	<-p.done
	return nil
}

// logTail returns the last n lines of the process's log for error messages.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.LogPath, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// portConflict reports whether the process failed because a port was taken between
// freePorts and the process binding it (another cluster started at the same time).
func (p *process) portConflict() bool {
	data, err := os.ReadFile(p.LogPath)
	return err == nil && bytes.Contains(data, []byte("address already in use"))
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment ago.
// A port can still be taken before the component binds it; startComponent retries then.
func freePorts(n int) ([]int, error) {
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// probeHTTP does one GET and succeeds on status 200. header may be nil.
func probeHTTP(ctx context.Context, client *http.Client, url string, header http.Header) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("building request for %s: %w", url, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probing %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probing %s: status %d: %s", url, resp.StatusCode, bytes.TrimSpace(body))
	}
	return nil
}

// liveGroupMembers lists the processes in process group pgid that are not zombies
// (a zombie is dead; only its parent's wait, possibly init's, removes it).
func liveGroupMembers(pgid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var live []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
		end := bytes.LastIndexByte(data, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(string(data[end+1:]))
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		if pgrp, err := strconv.Atoi(fields[2]); err == nil && pgrp == pgid {
			live = append(live, pid)
		}
	}
	return live, nil
}
