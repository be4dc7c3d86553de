package cdi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// DefaultRegenerateTimeout bounds one step of the regeneration command.
const DefaultRegenerateTimeout = 2 * time.Minute

// DefaultRegenerateBackoff is how a failed regeneration is retried: 5 s,
// doubling up to 5 minutes, each wait up to 10 % longer at random (so a
// rollout's nodes do not retry in step), until it succeeds or is
// triggered anew.
var DefaultRegenerateBackoff = wait.Backoff{Duration: 5 * time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 5 * time.Minute}

// maxOutput is how much of a step's output is kept for the log (its end).
const maxOutput = 4096

// RegenerateOptions configure a Regenerator.
type RegenerateOptions struct {
	// Steps are the admin's command, run in order, each an argv whose
	// first element is an absolute path (no shell, no PATH lookup): e.g.
	// nvidia-ctk cdi generate, then nvidia-ctk cdi transform root. A step
	// that fails (non-zero exit, or past Timeout) fails the run; the
	// remaining steps are not run.
	Steps [][]string
	// Timeout bounds each step; zero is DefaultRegenerateTimeout.
	Timeout time.Duration
	// Backoff spaces the retries of a failed run; zero is
	// DefaultRegenerateBackoff.
	Backoff wait.Backoff
	// OnResult is called (from Run's goroutine) after every run with why it
	// ran and its error (nil: every step succeeded).
	OnResult func(why string, err error)
	// Registerer receives gpufrac_cdi_regenerations_total (nil: not exported).
	Registerer prometheus.Registerer
	// Staged and Output, when set, make the steps write their spec to
	// Staged, a path only gpufrac-node and the steps use, and gpufrac-node
	// install it at Output (in a directory the container runtime reads)
	// only once it is a valid CDI spec of Kind with at least one device:
	// written to a temporary name beside Output, then renamed over it, so
	// that the runtime and the Checker never see a half-written or broken
	// spec, and a step that exits 0 with a bad spec fails the run (and is
	// retried) instead of un-resolving every device of the node.
	Staged, Output string
}

// ParseSteps checks an admin's regeneration steps: each non-empty, its
// program an absolute path.
func ParseSteps(steps [][]string) error {
	if len(steps) == 0 {
		return errors.New("no command")
	}
	for i, s := range steps {
		if len(s) == 0 {
			return fmt.Errorf("step %d is empty", i+1)
		}
		if !filepath.IsAbs(s[0]) {
			return fmt.Errorf("step %d: %q is not an absolute path (the command runs without a shell or PATH)", i+1, s[0])
		}
	}
	return nil
}

// Regenerator runs the admin's CDI spec regeneration command (normally the
// NVIDIA container toolkit's nvidia-ctk cdi generate) when triggered, after
// gpufrac-node changed a MIG layout: the toolkit's spec names GPUs and MIG
// devices by UUID, and MIG devices created since are in no spec until it is
// generated anew. A failed run is retried with backoff until it succeeds
// or is triggered anew; it never stops the agent. The Checker sees the new
// spec through its watch.
type Regenerator struct {
	opts    RegenerateOptions
	trigger chan struct{}
	runs    *prometheus.CounterVec

	mu        sync.Mutex
	why       []string // reasons of the triggers not run yet
	triggered bool     // Trigger was called
}

// NewRegenerator returns a Regenerator for the steps (ParseSteps).
func NewRegenerator(o RegenerateOptions) (*Regenerator, error) {
	if err := ParseSteps(o.Steps); err != nil {
		return nil, fmt.Errorf("CDI spec regeneration command: %w", err)
	}
	if (o.Staged == "") != (o.Output == "") {
		return nil, errors.New("CDI spec regeneration: the staged spec and the output are set together")
	}
	for _, p := range []string{o.Staged, o.Output} {
		if p != "" && !filepath.IsAbs(p) {
			return nil, fmt.Errorf("CDI spec regeneration: %q is not an absolute path", p)
		}
	}
	if o.Output != "" && !slices.Contains([]string{".yaml", ".json"}, filepath.Ext(o.Output)) {
		return nil, fmt.Errorf("CDI spec regeneration: output %q: a CDI spec file ends in .yaml or .json", o.Output)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultRegenerateTimeout
	}
	if o.Backoff.Duration <= 0 {
		o.Backoff = DefaultRegenerateBackoff
	}
	r := &Regenerator{opts: o, trigger: make(chan struct{}, 1),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_cdi_regenerations_total",
			Help: "Runs of the admin's CDI spec regeneration command (nvidia-ctk cdi generate) after MIG layout changes gpufrac-node made, or at start when devices served were in no spec, by result (success, failure); a failure is retried with backoff.",
		}, []string{"result"}),
	}
	for _, res := range []string{"success", "failure"} {
		r.runs.WithLabelValues(res)
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(r.runs); err != nil {
			return nil, fmt.Errorf("registering CDI regeneration metrics: %w", err)
		}
	}
	return r, nil
}

// Trigger asks Run to regenerate the spec (soon, once for any number of
// triggers); why says what changed, for the log and the event.
func (r *Regenerator) Trigger(why string) {
	r.mu.Lock()
	if !slices.Contains(r.why, why) {
		r.why = append(r.why, why)
	}
	r.triggered = true
	r.mu.Unlock()
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Triggered tells whether Trigger was ever called.
func (r *Regenerator) Triggered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.triggered
}

// takeWhy returns and clears the reasons of the pending triggers.
func (r *Regenerator) takeWhy() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	why := strings.Join(r.why, "; ")
	r.why = nil
	return why
}

// Run regenerates the spec on every trigger until ctx ends, retrying a
// failed run with backoff (a new trigger runs at once and restarts the
// backoff).
func (r *Regenerator) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("cdi-regenerate")
	var retry <-chan time.Time // nil: nothing to retry
	var backoff wait.Backoff
	why := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.trigger:
			why = r.takeWhy()
			backoff = r.opts.Backoff
		case <-retry:
		}
		err := r.runOnce(ctx, logger, why)
		if ctx.Err() != nil {
			return nil
		}
		result := "success"
		if err != nil {
			result = "failure"
		}
		r.runs.WithLabelValues(result).Inc()
		if r.opts.OnResult != nil {
			r.opts.OnResult(why, err)
		}
		if err == nil {
			retry = nil
			continue
		}
		d := backoff.Step()
		logger.Error(err, "Regenerating the CDI spec failed; retrying", "why", why, "retryIn", d)
		retry = time.After(d)
	}
}

// runOnce runs the steps in order.
func (r *Regenerator) runOnce(ctx context.Context, logger klog.Logger, why string) error {
	start := time.Now()
	for i, argv := range r.opts.Steps {
		out, err := r.runStep(ctx, argv)
		logger.Info("Ran a CDI spec regeneration step", "why", why, "step", i+1, "command", argv, "err", err, "output", out)
		if err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, filepath.Base(argv[0]), err)
		}
	}
	if r.opts.Output != "" {
		n, err := installSpec(r.opts.Staged, r.opts.Output)
		if err != nil {
			return err
		}
		logger.Info("Installed the regenerated CDI spec", "path", r.opts.Output, "devices", n)
	}
	logger.Info("Regenerated the CDI spec", "why", why, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// installSpec checks that staged is a valid CDI spec of Kind (the CDI
// library's own parsing and validation) with at least one device, and
// puts it at output atomically: written to a temporary file beside output
// (a name the runtime does not read as a spec), synced, renamed over it.
// A failure leaves output as it was. It returns the spec's device count.
func installSpec(staged, output string) (int, error) {
	spec, err := cdiapi.ReadSpec(staged, 0)
	if err != nil {
		return 0, fmt.Errorf("the regenerated CDI spec %s is not valid, %s left as it was: %w", staged, output, err)
	}
	if kind := spec.GetVendor() + "/" + spec.GetClass(); kind != Kind {
		return 0, fmt.Errorf("the regenerated CDI spec %s is of kind %q, not %q; %s left as it was", staged, kind, Kind, output)
	}
	if len(spec.Devices) == 0 {
		return 0, fmt.Errorf("the regenerated CDI spec %s names no device; %s left as it was", staged, output)
	}
	data, err := os.ReadFile(staged)
	if err != nil {
		return 0, fmt.Errorf("reading the regenerated CDI spec: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(output), "."+filepath.Base(output)+".*.tmp")
	if err != nil {
		return 0, fmt.Errorf("installing the regenerated CDI spec: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return 0, fmt.Errorf("installing the regenerated CDI spec: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return 0, fmt.Errorf("installing the regenerated CDI spec: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return 0, fmt.Errorf("installing the regenerated CDI spec: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("installing the regenerated CDI spec: %w", err)
	}
	if err := os.Rename(tmp.Name(), output); err != nil {
		return 0, fmt.Errorf("installing the regenerated CDI spec at %s: %w", output, err)
	}
	return len(spec.Devices), nil
}

// runStep runs one step under the timeout, returning the end of its
// output (stdout and stderr).
func (r *Regenerator) runStep(ctx context.Context, argv []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var out tailBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The step runs in its own process group, killed whole at the timeout:
	// a child it started would otherwise live on, hold the output pipes
	// (the run waiting WaitDelay for them) and may write after the retry
	// started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A child that left the group may still hold the pipes: stop waiting
	// for them shortly after.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("timed out after %s: %w", r.opts.Timeout, err)
	}
	return strings.TrimSpace(out.String()), err
}

// tailBuffer keeps the last maxOutput bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	cut bool
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(p)
	b.buf.Write(p)
	if over := b.buf.Len() - maxOutput; over > 0 {
		b.buf.Next(over)
		b.cut = true
	}
	return n, nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cut {
		return "…" + b.buf.String()
	}
	return b.buf.String()
}
