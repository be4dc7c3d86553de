package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// up starts the background cluster (unless one runs), submits the examples and
// prints the GPU view, what it shows and how to go on.
func up(ctx context.Context, cfg config) error {
	if pid, ok := running(cfg); ok {
		fmt.Printf("The demo is already running (pid %d).\n\n", pid)
		return showAll(ctx, cfg)
	}
	began := time.Now()
	// A stale state directory (crashed or killed demo) goes.
	if err := os.RemoveAll(cfg.dir); err != nil {
		return fmt.Errorf("removing stale demo state: %w", err)
	}
	if err := os.MkdirAll(cfg.dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", cfg.dir, err)
	}
	fmt.Println("==> starting the demo cluster in the background (log: " + rel(cfg, cfg.logFile()) + ")")
	_, exited, err := spawn(cfg)
	if err != nil {
		return err
	}
	if err := follow(ctx, cfg, exited); err != nil {
		return fmt.Errorf("%w\nlogs: %s and %s; clean up with make demo-down", err, rel(cfg, cfg.logFile()), rel(cfg, filepath.Join(cfg.dir, "logs")))
	}

	fmt.Println("==> submitting the sample workloads from deployments/examples")
	client, dyn, err := clientsFor(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if err := submitExamples(ctx, cfg, client, dyn); err != nil {
		return fmt.Errorf("%w\nlogs: %s; the cluster keeps running (make demo-status, make demo-down)", err, rel(cfg, filepath.Join(cfg.dir, "logs")))
	}
	fmt.Printf("==> the demo is up after %s\n\n", time.Since(began).Round(100*time.Millisecond))
	return showAll(ctx, cfg)
}

// showAll prints the GPU view, the legend and how to go on.
func showAll(ctx context.Context, cfg config) error {
	if err := printView(ctx, cfg); err != nil {
		return err
	}
	client, _, err := clientsFor(cfg)
	if err != nil {
		return err
	}
	if err := printLegend(ctx, cfg, client); err != nil {
		return err
	}
	// The burst is there only with Karpenter.
	_, err = client.AppsV1().Deployments(metav1.NamespaceDefault).Get(ctx, burstDeployment, metav1.GetOptions{})
	printHowTo(cfg, err == nil)
	return nil
}

// spawn starts `gpufrac-demo serve` in its own session, so it outlives make and
// the terminal, and records its pid. exited is closed when it ends.
func spawn(cfg config) (pid int, exited <-chan struct{}, err error) {
	self, err := os.Executable()
	if err != nil {
		return 0, nil, fmt.Errorf("finding the demo binary: %w", err)
	}
	logFile, err := os.OpenFile(cfg.logFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, nil, fmt.Errorf("opening the demo log: %w", err)
	}
	defer logFile.Close()
	args := []string{"serve", "--dir=" + cfg.dir, "--bin-dir=" + cfg.bin, "--gpu-nodes=" + strconv.Itoa(cfg.nodes),
		"--gpus-per-node=" + strconv.Itoa(cfg.gpusPerNode), "--karpenter=" + strconv.FormatBool(cfg.karpenter),
		"--real-node=" + strconv.FormatBool(cfg.realNode),
		"--timeout=" + cfg.timeout.String()}
	cmd := exec.Command(self, args...)
	cmd.Dir = cfg.root
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("starting the demo cluster: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	pid = cmd.Process.Pid
	if err := os.WriteFile(cfg.pidFile(), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		return 0, nil, fmt.Errorf("writing the pid file: %w", err)
	}
	return pid, done, nil
}

// follow prints the background process's progress lines until it is ready, it
// fails or exits, or the timeout passes.
func follow(ctx context.Context, cfg config, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	var offset int64
	for {
		lines, next, err := readLines(cfg.progressFile(), offset)
		if err != nil {
			return err
		}
		offset = next
		for _, l := range lines {
			switch {
			case l == progressReady:
				return nil
			case strings.HasPrefix(l, progressFailed):
				return errors.New("the demo cluster failed to start: " + strings.TrimPrefix(l, progressFailed))
			default:
				fmt.Println("    " + l)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the demo cluster: %w", ctx.Err())
		case <-exited:
			// One last read: the failure line may have come just before the exit.
			if lines, _, err := readLines(cfg.progressFile(), offset); err == nil {
				for _, l := range lines {
					if strings.HasPrefix(l, progressFailed) {
						return errors.New("the demo cluster failed to start: " + strings.TrimPrefix(l, progressFailed))
					}
				}
			}
			return errors.New("the demo cluster exited while starting")
		case <-ticker.C:
		}
	}
}

// readLines returns the complete lines of path from offset on, and the offset
// after the last one. A missing file has no lines yet.
func readLines(path string, offset int64) ([]string, int64, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, offset, nil
	}
	if err != nil {
		return nil, offset, fmt.Errorf("reading progress: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, offset, fmt.Errorf("reading progress: %w", err)
	}
	var lines []string
	r := bufio.NewReader(f)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			// A partial line waits for its newline.
			return lines, offset, nil
		}
		offset += int64(len(l))
		lines = append(lines, strings.TrimSuffix(l, "\n"))
	}
}

// running returns the pid of a live demo process recorded in the pid file.
func running(cfg config) (int, bool) {
	data, err := os.ReadFile(cfg.pidFile())
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	// The pid must still be a gpufrac-demo, not a reused number.
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !strings.Contains(string(cmdline), "gpufrac-demo") {
		return 0, false
	}
	return pid, true
}

// status prints the GPU view of the running demo.
func status(ctx context.Context, cfg config) error {
	pid, ok := running(cfg)
	if !ok {
		return errors.New("the demo is not running: make demo")
	}
	fmt.Printf("The demo is running (pid %d).\n\n", pid)
	if err := printView(ctx, cfg); err != nil {
		return err
	}
	client, _, err := clientsFor(cfg)
	if err != nil {
		return err
	}
	return printLegend(ctx, cfg, client)
}

// down stops the background process (which stops the cluster) and removes the
// state directory.
func down(ctx context.Context, cfg config) error {
	pid, ok := running(cfg)
	if ok {
		fmt.Printf("stopping the demo (pid %d)...\n", pid)
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stopping the demo: %w", err)
		}
		deadline := time.Now().Add(90 * time.Second)
		for {
			if _, alive := running(cfg); !alive || syscall.Kill(pid, 0) != nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Println("the demo did not stop in 90s; killing it")
				// Its components die with it (they have a parent-death signal).
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for the demo to stop: %w", ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	} else {
		fmt.Println("the demo is not running")
	}
	if err := os.RemoveAll(cfg.dir); err != nil {
		return fmt.Errorf("removing %s: %w", cfg.dir, err)
	}
	fmt.Println("demo stopped; " + rel(cfg, cfg.dir) + " removed")
	return nil
}

// clientsFor builds clients from the demo's admin kubeconfig.
func clientsFor(cfg config) (kubernetes.Interface, dynamic.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig())
	if err != nil {
		return nil, nil, fmt.Errorf("loading %s: %w", cfg.kubeconfig(), err)
	}
	rc.UserAgent = "gpufrac-demo"
	rc.QPS, rc.Burst = 50, 100
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("creating API client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	return client, dyn, nil
}

// printView runs the kubectl plugin (bin/kubectl-gpufrac, built by make build)
// against the demo, exactly as a user would.
func printView(ctx context.Context, cfg config) error {
	fmt.Println("==> GPUs and who holds them (kubectl gpufrac):")
	fmt.Println()
	cmd := exec.CommandContext(ctx, filepath.Join(cfg.binDir(), "kubectl-gpufrac"), "--kubeconfig="+cfg.kubeconfig())
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("running bin/kubectl-gpufrac (make build builds it): %w", err)
	}
	return nil
}

// printHowTo says how to go on; burst: the Karpenter burst was submitted.
func printHowTo(cfg config, burst bool) {
	scale := ""
	if burst {
		scale = fmt.Sprintf(`  kubectl scale deployment %[1]s --replicas=12  # more fractions: placeholders, Karpenter adds capacity
  kubectl scale deployment %[1]s --replicas=0   # reservations go after %[2]s, then Karpenter removes empty nodes
`, burstDeployment, reservationGrace)
	}
	fmt.Printf(`
The demo cluster keeps running. Try (with your kubectl, 1.35 to 1.37; make tools builds none):
  export KUBECONFIG=$PWD/%s
  kubectl get pods -A -o wide                         # every pod, gpufrac-reservations' reservations and placeholders included
  kubectl get queues                                  # quota, allocated GPUs and pending work per queue
  kubectl describe pod eval-nightly                   # why it waits: the event with the numbers (also in its PodScheduled condition)
  kubectl get resourceclaims,resourceslices           # the claims of the dra-* pods and the devices of gpu-node-dra
%s  bin/kubectl-gpufrac                                 # this view again (or make demo-status; as a plugin: PATH=$PWD/bin:$PATH kubectl gpufrac)
%sLogs: %s/ (gpufrac-coordinator.log, gpufrac-node-<node>.log, karpenter.log, ...).  Stop everything: make demo-down
`, rel(cfg, cfg.kubeconfig()), scale, repartitionHowTo(cfg), rel(cfg, filepath.Join(cfg.dir, "logs")))
}

// repartitionHowTo says how to repartition a node as an admin does: the
// last GPU of the last static node in MIG mode, through the ConfigMap every
// node agent mounts (the demo's agents follow its edits within about a
// second of the harness's mount sync; a kubelet takes up to a minute or so).
func repartitionHowTo(cfg config) string {
	node := staticNodePrefix + strconv.Itoa(cfg.nodes)
	return fmt.Sprintf(`Repartition as an admin does, through the ConfigMap every gpufrac-node mounts:
  kubectl -n gpufrac-system get cm gpufrac-node-config -o yaml   # the config the nodes run
  kubectl -n gpufrac-system edit cm gpufrac-node-config          # add to config.yaml's groups (a GPU the view shows free):
      - nodeSelector: {kubernetes.io/hostname: %s}
        gpus: [{indices: "%d", mode: mig, migLayout: all-1g.10gb}]
  bin/kubectl-gpufrac                                 # GPU %[2]d of %[1]s: mig 7× 1g.10gb (if nothing runs on it), 100 fraction units fewer
  kubectl get events --field-selector reason=GPUConfigRejected   # a bad edit: the nodes keep their last good config and say why
`, node, cfg.gpusPerNode-1)
}

// rel shortens a path inside the repository for messages.
func rel(cfg config, path string) string {
	if r, err := filepath.Rel(cfg.root, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}
