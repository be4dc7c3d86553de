// Package policycheck lists the pods that gpufrac's admission policies would
// refuse if they were created now. Each pod's copy is created with a
// server-side dry run (nothing is stored), so the API server evaluates the
// policies itself, as it would for the pod's controller: a policy in [Deny]
// refuses the copy, one in [Warn] answers a warning. Installed audit-first
// (admissionPolicies.tenantValidationActions: [Warn, Audit]), the check
// lists every workload that [Deny] would stop, before it does.
package policycheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpufrac/gpufrac/api"
)

// DryRun creates p with a server-side dry run and returns the API server's
// warnings and error.
type DryRun func(ctx context.Context, p *corev1.Pod) (warnings []string, err error)

// Finding is one workload a policy refuses (or would refuse).
type Finding struct {
	Namespace string `json:"namespace"`
	// Workload is the pod's controller ("Deployment/vllm", "Job/train"), or
	// "Pod/<name>" for a bare pod.
	Workload string `json:"workload"`
	// Pod is the pod checked (the first of the workload's).
	Pod    string `json:"pod"`
	Policy string `json:"policy"`
	// Denied: the policy denies now ([Deny]); else it only warns.
	Denied  bool   `json:"denied"`
	Message string `json:"message"`
}

// Report is what Check found.
type Report struct {
	Checked  int       `json:"checked"`
	Findings []Finding `json:"findings"`
	// Notes are pods that could not be checked, and why.
	Notes []string `json:"notes,omitempty"`
}

// copyName prefixes the dry-run copies' generated names.
const copyName = "gpufrac-policy-check-"

// Check creates a dry-run copy of every running or pending pod in namespace
// ("" for all), one per workload, and reports what gpufrac's policies
// (gpufrac-*) said of it.
func Check(ctx context.Context, cs kubernetes.Interface, namespace string, dry DryRun) (*Report, error) {
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	r := &Report{Findings: []Finding{}}
	owners := newOwners(cs)
	seen := map[string]bool{} // namespace/workload checked
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil ||
			p.Namespace == api.ReservationNamespace {
			continue
		}
		workload := owners.workload(ctx, p)
		if seen[p.Namespace+"/"+workload] {
			continue
		}
		seen[p.Namespace+"/"+workload] = true
		r.Checked++
		warnings, err := dry(ctx, Copy(p))
		for _, w := range warnings {
			if policy, msg, ok := parseWarning(w); ok {
				r.Findings = append(r.Findings, Finding{Namespace: p.Namespace, Workload: workload, Pod: p.Name, Policy: policy, Message: msg})
			}
		}
		if err == nil {
			continue
		}
		if policy, msg, ok := parseDenial(err); ok {
			r.Findings = append(r.Findings, Finding{Namespace: p.Namespace, Workload: workload, Pod: p.Name, Policy: policy, Denied: true, Message: msg})
			continue
		}
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			// Another admission plugin (Pod Security, a quota) or RBAC.
			r.Notes = append(r.Notes, fmt.Sprintf("%s/%s (%s) not checked: %v", p.Namespace, p.Name, workload, err))
			continue
		}
		return nil, fmt.Errorf("dry-run create of a copy of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return strings.Compare(a.Namespace+"/"+a.Workload+"/"+a.Policy, b.Namespace+"/"+b.Workload+"/"+b.Policy)
	})
	return r, nil
}

// Copy is what p's controller (or its author) would create today: p's
// metadata and spec without what the API server, the scheduler and
// gpufrac's components wrote since, under a generated name.
//
// gpufrac's policies leave the cluster superusers' own pods alone (not a
// tenant's) but check what controllers create for tenants: a bare pod's
// copy names the pod as its controller, so that an administrator running
// the check sees what the pod's author would meet.
func Copy(p *corev1.Pod) *corev1.Pod {
	c := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName:    copyName,
			Namespace:       p.Namespace,
			Labels:          p.Labels,
			Annotations:     map[string]string{},
			OwnerReferences: slices.Clone(p.OwnerReferences),
		},
		Spec: *p.Spec.DeepCopy(),
	}
	for k, v := range p.Annotations {
		if !written[k] {
			c.Annotations[k] = v
		}
	}
	c.Spec.NodeName = "" // the binding's, never a creation's
	c.Spec.EphemeralContainers = nil
	if metav1.GetControllerOf(p) == nil {
		c.OwnerReferences = append(c.OwnerReferences, metav1.OwnerReference{
			APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptrTo(true)})
	}
	return c
}

// written are the annotations gpufrac's components write on a pod after its
// creation (its binding, the node agent's write-back): not the author's.
var written = map[string]bool{
	api.AnnotationGPU: true, api.AnnotationAdmittedQueue: true, api.AnnotationAdmittedPreemptible: true, api.AnnotationAdmittedGang: true,
	api.AnnotationAllocatedGPU: true, api.AnnotationReservedGPU: true, api.AnnotationDoNotDisrupt: true,
}

func ptrTo[T any](v T) *T { return &v }

var (
	// The API server's words (k8s.io/apiserver, policy/validating).
	warningRE = regexp.MustCompile(`^Validation failed for ValidatingAdmissionPolicy '([^']+)' with binding '[^']*': (.*)$`)
	denialRE  = regexp.MustCompile(`ValidatingAdmissionPolicy '([^']+)'(?: with binding '[^']*')? denied request: (.*)$`)
)

// parseWarning reads a [Warn] policy's warning; only gpufrac's policies count.
func parseWarning(w string) (policy, msg string, ok bool) {
	m := warningRE.FindStringSubmatch(w)
	if m == nil || !strings.HasPrefix(m[1], "gpufrac-") {
		return "", "", false
	}
	return m[1], m[2], true
}

// parseDenial reads a [Deny] policy's refusal; only gpufrac's policies count.
func parseDenial(err error) (policy, msg string, ok bool) {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return "", "", false
	}
	m := denialRE.FindStringSubmatch(status.Status().Message)
	if m == nil || !strings.HasPrefix(m[1], "gpufrac-") {
		return "", "", false
	}
	return m[1], m[2], true
}

// owners names pods' workloads, reading a ReplicaSet's Deployment once.
type owners struct {
	cs    kubernetes.Interface
	owner map[string]string // namespace/ReplicaSet -> its workload
}

func newOwners(cs kubernetes.Interface) *owners { return &owners{cs: cs, owner: map[string]string{}} }

// workload is p's controller, a ReplicaSet's own controller in its place.
func (o *owners) workload(ctx context.Context, p *corev1.Pod) string {
	ref := metav1.GetControllerOf(p)
	if ref == nil {
		return "Pod/" + p.Name
	}
	name := ref.Kind + "/" + ref.Name
	if ref.Kind != "ReplicaSet" {
		return name
	}
	key := p.Namespace + "/" + ref.Name
	if w, ok := o.owner[key]; ok {
		return w
	}
	w := name
	if rs, err := o.cs.AppsV1().ReplicaSets(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}); err == nil {
		if up := metav1.GetControllerOf(rs); up != nil {
			w = up.Kind + "/" + up.Name
		}
	}
	o.owner[key] = w
	return w
}

// Render prints the report as a table.
func (r *Report) Render(w io.Writer) error {
	if len(r.Findings) == 0 {
		fmt.Fprintf(w, "%d workloads checked: gpufrac's admission policies refuse none of them.\n", r.Checked)
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAMESPACE\tWORKLOAD\tPOLICY\tNOW\tWHY")
		for _, f := range r.Findings {
			now := "warns"
			if f.Denied {
				now = "denies"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Namespace, f.Workload, f.Policy, now, f.Message)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "\n%d workloads checked, %d refused by a policy (a policy that denies names only itself: fix it and check again).\n",
			r.Checked, countWorkloads(r.Findings))
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

func countWorkloads(fs []Finding) int {
	seen := map[string]bool{}
	for _, f := range fs {
		seen[f.Namespace+"/"+f.Workload] = true
	}
	return len(seen)
}

// NewDryRun returns a DryRun over a client of cfg that gives each call the
// warnings of its own response (calls are made one at a time).
func NewDryRun(cfg *rest.Config) (DryRun, error) {
	col := &collector{}
	c := rest.CopyConfig(cfg)
	c.WarningHandler, c.WarningHandlerWithContext = nil, col
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("creating the dry-run client: %w", err)
	}
	var mu sync.Mutex
	return func(ctx context.Context, p *corev1.Pod) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		col.take()
		_, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kubectl-gpufrac-policy-check"})
		return col.take(), err
	}, nil
}

// collector keeps the warnings of the responses since the last take.
type collector struct {
	mu   sync.Mutex
	msgs []string
}

func (c *collector) HandleWarningHeaderWithContext(_ context.Context, code int, _ string, text string) {
	if code != 299 || text == "" {
		return
	}
	c.mu.Lock()
	c.msgs = append(c.msgs, text)
	c.mu.Unlock()
}

func (c *collector) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.msgs
	c.msgs = nil
	return out
}
