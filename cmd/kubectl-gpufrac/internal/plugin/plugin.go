// Package plugin runs kubectl gpufrac's commands against API clients: the
// node view (nodes, the default), the namespace view (-n, or when the user
// may not read cluster-wide) and the queue view (queues), as text or JSON.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/policycheck"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/queueview"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/tenantview"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/view"
)

// The commands.
const (
	CommandNodes       = "nodes"
	CommandQueues      = "queues"
	CommandPolicyCheck = "policy-check"
)

// The output formats.
const (
	OutputText = ""
	OutputJSON = "json"
)

// ErrUsage reports a command line Run cannot act on.
var ErrUsage = errors.New("usage")

// ErrRefused reports that policy-check found workloads gpufrac's admission
// policies refuse or would refuse (the command exits 1, for scripts).
var ErrRefused = errors.New("gpufrac's admission policies refuse or would refuse workloads")

// Config is what the command line asked.
type Config struct {
	// Command is CommandNodes (also for "") or CommandQueues.
	Command string
	// Namespace, when set (-n), scopes the view to one namespace.
	Namespace string
	// DefaultNamespace is the kubeconfig context's namespace: the view falls
	// back to it when a cluster-wide read is forbidden.
	DefaultNamespace string
	// Node limits the view to one node.
	Node string
	// Output is OutputText or OutputJSON.
	Output string
	// Wide prints full GPU UUIDs and reservation pod names.
	Wide bool
}

// Clients are the API clients the views read with.
type Clients struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// DryRun creates a pod with a server-side dry run (policy-check).
	DryRun policycheck.DryRun
}

// NamespaceDoc is the JSON shape of the namespace view: its pods and the
// queues they use.
type NamespaceDoc struct {
	*tenantview.View
	Queues []queueview.Queue `json:"queues"`
	Notes  []string          `json:"notes,omitempty"`
}

// Run runs the command. Hints (a fallback to the namespace view) go to
// stderr, so stdout stays valid JSON.
func Run(ctx context.Context, c Clients, cfg Config, stdout, stderr io.Writer) error {
	if cfg.Output != OutputText && cfg.Output != OutputJSON {
		return fmt.Errorf("%w: -o %q: want json (or nothing for text)", ErrUsage, cfg.Output)
	}
	switch cfg.Command {
	case "", CommandNodes:
		if cfg.Namespace != "" {
			return namespaceView(ctx, c, cfg, cfg.Namespace, stdout)
		}
		v, err := view.Load(ctx, c.Kube, cfg.Node)
		if apierrors.IsForbidden(err) {
			return namespaceView(ctx, c, cfg, fallback(cfg, err, stderr), stdout)
		}
		if err != nil {
			return err
		}
		if cfg.Output == OutputJSON {
			return v.RenderJSON(stdout)
		}
		return v.Render(stdout, view.Options{Wide: cfg.Wide})
	case CommandQueues:
		v, err := queueview.Load(ctx, c.Kube, c.Dynamic, cfg.Namespace)
		if cfg.Namespace == "" && apierrors.IsForbidden(err) {
			v, err = queueview.Load(ctx, c.Kube, c.Dynamic, fallback(cfg, err, stderr))
		}
		if err != nil {
			return err
		}
		if cfg.Output == OutputJSON {
			return view.WriteJSON(stdout, v)
		}
		return v.Render(stdout)
	case CommandPolicyCheck:
		if c.DryRun == nil {
			return fmt.Errorf("%w: policy-check needs a dry-run client", ErrUsage)
		}
		r, err := policycheck.Check(ctx, c.Kube, policycheck.Options{Namespace: cfg.Namespace}, c.DryRun)
		if err != nil {
			return err
		}
		if cfg.Output == OutputJSON {
			err = view.WriteJSON(stdout, r)
		} else {
			err = r.Render(stdout)
		}
		if err == nil && len(r.Findings) > 0 {
			err = fmt.Errorf("%w: %d of them", ErrRefused, len(r.Findings))
		}
		return err
	}
	return fmt.Errorf("%w: unknown command %q: want %s, %s or %s", ErrUsage, cfg.Command, CommandNodes, CommandQueues, CommandPolicyCheck)
}

// fallback prints the one-line hint and names the namespace to show
// instead of a cluster-wide view that was forbidden.
func fallback(cfg Config, err error, stderr io.Writer) string {
	ns := cfg.DefaultNamespace
	if ns == "" {
		ns = "default"
	}
	fmt.Fprintf(stderr, "kubectl-gpufrac: no cluster-wide read (%v); showing namespace %s (-n NS for another)\n", apierrors.ReasonForError(err), ns)
	return ns
}

// namespaceView prints namespace ns's GPU pods and the queues they use.
func namespaceView(ctx context.Context, c Clients, cfg Config, ns string, stdout io.Writer) error {
	pods, err := tenantview.Load(ctx, c.Kube, ns, cfg.Node)
	if err != nil {
		return err
	}
	doc := NamespaceDoc{View: pods, Queues: []queueview.Queue{}}
	if used := usedQueues(pods); len(used) > 0 {
		qv, err := queueview.Load(ctx, c.Kube, c.Dynamic, ns)
		if err != nil {
			doc.Notes = append(doc.Notes, "queues not shown: "+err.Error())
		} else {
			for _, q := range qv.Queues {
				if used[q.Name] {
					doc.Queues = append(doc.Queues, q)
				}
			}
			doc.Notes = append(doc.Notes, qv.Notes...)
		}
	}
	if cfg.Output == OutputJSON {
		return view.WriteJSON(stdout, doc)
	}
	if err := pods.Render(stdout, cfg.Wide); err != nil {
		return err
	}
	if len(doc.Queues) == 0 && len(doc.Notes) == 0 {
		return nil
	}
	fmt.Fprintln(stdout)
	return (&queueview.View{Namespace: ns, Queues: doc.Queues, Notes: doc.Notes}).Render(stdout)
}

// usedQueues are the queues the pods name.
func usedQueues(v *tenantview.View) map[string]bool {
	out := map[string]bool{}
	for _, p := range v.Pods {
		if p.Queue != "" {
			out[p.Queue] = true
		}
	}
	return out
}
