package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// coordinatorIdentity is the coordinator's identity in its Lease.
	coordinatorIdentity = "gpufrac-demo"
	// coordinatorLease is the coordinator's default Lease name.
	coordinatorLease = "gpufrac-coordinator"
	// coordinatorStopGrace is how long the coordinator gets to release its
	// Lease after SIGTERM.
	coordinatorStopGrace = 10 * time.Second
	// reservationGrace is the coordinator's --reservation-grace in the demo
	// (tests/demo/demo-values.yaml): short, so scaling the burst down frees
	// Karpenter's nodes within a minute.
	reservationGrace = 15 * time.Second
)

// coordinatorProcess is the running gpufrac-coordinator.
type coordinatorProcess struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // its exit status, once done is closed
	log     string
	metrics string // host:port of /metrics, /healthz, /readyz
	// leaseNamespace holds its leader-election Lease (the chart's namespace).
	leaseNamespace string
}

// startCoordinator runs bin/gpufrac-coordinator against the cluster with
// the arguments of the chart's Deployment (as the kubelet expands them) and
// the chart's ServiceAccount (kubeconfig), logging to the cluster's log dir,
// and waits until it holds its Lease and has synced its caches. Only what a
// local process needs differs: its metrics address and the kubeconfig.
func startCoordinator(ctx context.Context, cfg config, c *cluster.Cluster, in *cluster.Install, kubeconfig string) (*coordinatorProcess, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	co := &coordinatorProcess{
		log:     filepath.Join(c.LogDir(), "gpufrac-coordinator.log"),
		metrics: "127.0.0.1:" + strconv.Itoa(port),
		done:    make(chan struct{}),
	}
	args, err := in.CoordinatorProcessArgs(c.Dir, coordinatorIdentity)
	if err != nil {
		return nil, fmt.Errorf("gpufrac-coordinator arguments from the chart: %w", err)
	}
	if g, _ := cluster.Flag(args, "reservation-grace"); g != reservationGrace.String() {
		return nil, fmt.Errorf("the chart gives --reservation-grace=%s, the demo says %s (tests/demo/demo-values.yaml)", g, reservationGrace)
	}
	co.leaseNamespace, _ = cluster.Flag(args, "lease-namespace")
	args = append(cluster.ReplaceFlag(args, "metrics-addr", co.metrics), "--kubeconfig="+kubeconfig)
	f, err := os.Create(co.log)
	if err != nil {
		return nil, fmt.Errorf("creating the coordinator log: %w", err)
	}
	defer f.Close() // the child has its own descriptor
	co.cmd = exec.Command(filepath.Join(cfg.binDir(), "gpufrac-coordinator"), args...)
	co.cmd.Stdout, co.cmd.Stderr = f, f
	// Its own process group, and it dies with the demo's background process.
	co.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := co.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting gpufrac-coordinator (make build builds it): %w", err)
	}
	go func() {
		co.err = co.cmd.Wait()
		close(co.done)
	}()
	if err := co.waitLeading(ctx, c.Client); err != nil {
		return nil, errors.Join(err, co.stop(ctx))
	}
	return co, nil
}

// waitLeading waits until the coordinator holds its Lease and /readyz says
// its caches are synced, or it exits.
func (co *coordinatorProcess) waitLeading(ctx context.Context, client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	httpClient := &http.Client{Timeout: time.Second}
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-co.done:
			return false, fmt.Errorf("gpufrac-coordinator exited (%v); see %s", co.err, co.log)
		default:
		}
		l, err := client.CoordinationV1().Leases(co.leaseNamespace).Get(ctx, coordinatorLease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != coordinatorIdentity {
			return false, nil
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+co.metrics+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for gpufrac-coordinator to lead: %w", err)
	}
	return nil
}

// stop sends SIGTERM (the coordinator releases its Lease) and waits, then
// SIGKILL after coordinatorStopGrace.
func (co *coordinatorProcess) stop(ctx context.Context) error {
	select {
	case <-co.done:
		return nil
	default:
	}
	logger := klog.FromContext(ctx)
	_ = syscall.Kill(-co.cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(coordinatorStopGrace)
	defer t.Stop()
	select {
	case <-co.done:
		return nil
	case <-t.C:
		logger.Info("gpufrac-coordinator did not stop in time; killing it", "grace", coordinatorStopGrace)
		_ = syscall.Kill(-co.cmd.Process.Pid, syscall.SIGKILL)
		<-co.done
		return errors.New("gpufrac-coordinator did not stop on SIGTERM")
	}
}

// freePort returns a TCP port free on 127.0.0.1 right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
