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
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
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
	// Workload is the pod's controller ("Deployment/vllm", "CronJob/nightly",
	// "RayCluster/rc"), or "Pod/<name>" for a bare pod.
	Workload string `json:"workload"`
	// Pod is the pod checked, or "template" when the workload has no pod
	// now and its pod template was checked.
	Pod    string `json:"pod"`
	Policy string `json:"policy"`
	// Denied: the policy denies now ([Deny]); else it only warns.
	Denied  bool   `json:"denied"`
	Message string `json:"message"`
}

// Report is what Check found.
type Report struct {
	// Checked counts the pods (and templates) the API server judged.
	Checked  int       `json:"checked"`
	Findings []Finding `json:"findings"`
	// Notes say what could not be checked, and why.
	Notes []string `json:"notes,omitempty"`
}

// Options say what Check looks at.
type Options struct {
	// Namespace to check ("" for all).
	Namespace string
	// ReservationNamespace holds gpufrac's own pods, which are not checked
	// (default api.ReservationNamespace).
	ReservationNamespace string
}

// copyName prefixes the dry-run copies' generated names.
const copyName = "gpufrac-policy-check-"

// Check judges one pod per distinct pod shape of each workload (its
// controller, a ReplicaSet's Deployment, a Job's CronJob) and, for the
// workloads that have no pod now (a CronJob between runs, a Deployment
// scaled to zero), their pod templates: each as a server-side dry-run copy,
// reporting what gpufrac's policies (gpufrac-*) said. What the API server
// refuses for another reason is a note, not an error: only listing fails
// the check.
func Check(ctx context.Context, cs kubernetes.Interface, o Options, dry DryRun) (*Report, error) {
	if o.ReservationNamespace == "" {
		o.ReservationNamespace = api.ReservationNamespace
	}
	r := &Report{Findings: []Finding{}}
	r.Notes = append(r.Notes, bindingNotes(ctx, cs)...)
	pods, err := cs.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	owners := newOwners(cs)
	seen := map[string]bool{}    // namespace/workload/shape judged
	hasPods := map[string]bool{} // namespace/workload with a pod now
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Namespace == o.ReservationNamespace {
			continue
		}
		workload := owners.workload(ctx, p)
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil {
			continue // its controller's template is checked below, unless a live pod is
		}
		hasPods[p.Namespace+"/"+workload] = true
		if n := len(p.Spec.EphemeralContainers); n > 0 {
			r.Notes = append(r.Notes, fmt.Sprintf("%s/%s (%s) has %d ephemeral container(s), added by update: a created copy cannot carry them, so they are not checked", p.Namespace, p.Name, workload, n))
		}
		key := p.Namespace + "/" + workload + "/" + shape(&p.Spec)
		if seen[key] {
			continue
		}
		seen[key] = true
		r.judge(ctx, dry, Copy(p), p.Namespace, workload, p.Name)
	}
	for _, t := range templates(ctx, cs, o.Namespace, r) {
		if t.pod.Namespace == o.ReservationNamespace || hasPods[t.pod.Namespace+"/"+t.workload] {
			continue
		}
		r.judge(ctx, dry, t.pod, t.pod.Namespace, t.workload, "template")
	}
	slices.SortStableFunc(r.Findings, func(a, b Finding) int {
		return strings.Compare(a.Namespace+"/"+a.Workload+"/"+a.Policy, b.Namespace+"/"+b.Workload+"/"+b.Policy)
	})
	return r, nil
}

// judge dry-runs the creation of p and records what gpufrac's policies said.
func (r *Report) judge(ctx context.Context, dry DryRun, p *corev1.Pod, namespace, workload, pod string) {
	warnings, err := dry(ctx, p)
	if err != nil {
		if policy, msg, ok := parseDenial(err); ok {
			r.Checked++
			r.Findings = append(r.Findings, Finding{Namespace: namespace, Workload: workload, Pod: pod, Policy: policy, Denied: true, Message: msg})
			return
		}
		r.Notes = append(r.Notes, fmt.Sprintf("%s/%s (%s) not checked: %v", namespace, pod, workload, err))
		return
	}
	r.Checked++
	// A policy warns once per rule the pod breaks: one finding per policy,
	// its messages joined.
	at := map[string]int{} // policy -> index in r.Findings
	for _, w := range warnings {
		policy, msg, ok := parseWarning(w)
		if !ok {
			continue
		}
		if i, dup := at[policy]; dup {
			r.Findings[i].Message += "; " + msg
			continue
		}
		at[policy] = len(r.Findings)
		r.Findings = append(r.Findings, Finding{Namespace: namespace, Workload: workload, Pod: pod, Policy: policy, Message: msg})
	}
}

// shape is what the policies read of a pod that may differ between the pods
// of one workload (a RayCluster's head and workers, a Deployment's two
// ReplicaSets mid-rollout): pods of one shape are judged once.
func shape(s *corev1.PodSpec) string {
	var b strings.Builder
	containers := func(cs []corev1.Container) {
		for _, c := range cs {
			fmt.Fprintf(&b, "c:%s:%s:", c.Name, c.Image)
			for _, e := range c.Env {
				b.WriteString(e.Name + ",")
			}
			for k := range c.Resources.Limits {
				b.WriteString(string(k) + ",")
			}
			if c.SecurityContext != nil {
				b.WriteString(c.SecurityContext.String())
			}
			b.WriteString(";")
		}
	}
	containers(s.InitContainers)
	containers(s.Containers)
	for _, v := range s.Volumes {
		if v.Projected == nil && v.Secret == nil && v.ConfigMap == nil && v.EmptyDir == nil {
			fmt.Fprintf(&b, "v:%s:%s;", v.Name, v.VolumeSource.String())
		}
	}
	fmt.Fprintf(&b, "h:%v%v%v;p:%s;s:%s", s.HostNetwork, s.HostPID, s.HostIPC, s.PriorityClassName, s.SchedulerName)
	if s.SecurityContext != nil {
		b.WriteString(s.SecurityContext.String())
	}
	return b.String()
}

// template is a workload's pod as its controller would create it.
type template struct {
	workload string
	pod      *corev1.Pod
}

// templates are the pod templates of the namespace's Deployments,
// StatefulSets, DaemonSets, CronJobs and unfinished Jobs not made by a
// CronJob. A kind that cannot be listed is a note.
func templates(ctx context.Context, cs kubernetes.Interface, namespace string, r *Report) []template {
	var out []template
	add := func(kind string, meta metav1.ObjectMeta, t corev1.PodTemplateSpec) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: copyName, Namespace: meta.Namespace, Labels: t.Labels, Annotations: t.Annotations,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: kind, Name: meta.Name, UID: meta.UID, Controller: ptrTo(true)}}},
			Spec: *t.Spec.DeepCopy(),
		}
		out = append(out, template{workload: kind + "/" + meta.Name, pod: p})
	}
	note := func(kind string, err error) {
		r.Notes = append(r.Notes, fmt.Sprintf("%s not listed (%v): workloads of that kind without a pod now are not checked", kind, err))
	}
	if l, err := cs.AppsV1().Deployments(namespace).List(ctx, metav1.ListOptions{}); err != nil {
		note("Deployments", err)
	} else {
		for _, d := range l.Items {
			add("Deployment", d.ObjectMeta, d.Spec.Template)
		}
	}
	if l, err := cs.AppsV1().StatefulSets(namespace).List(ctx, metav1.ListOptions{}); err != nil {
		note("StatefulSets", err)
	} else {
		for _, d := range l.Items {
			add("StatefulSet", d.ObjectMeta, d.Spec.Template)
		}
	}
	if l, err := cs.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{}); err != nil {
		note("DaemonSets", err)
	} else {
		for _, d := range l.Items {
			add("DaemonSet", d.ObjectMeta, d.Spec.Template)
		}
	}
	if l, err := cs.BatchV1().CronJobs(namespace).List(ctx, metav1.ListOptions{}); err != nil {
		note("CronJobs", err)
	} else {
		for _, d := range l.Items {
			add("CronJob", d.ObjectMeta, d.Spec.JobTemplate.Spec.Template)
		}
	}
	if l, err := cs.BatchV1().Jobs(namespace).List(ctx, metav1.ListOptions{}); err != nil {
		note("Jobs", err)
	} else {
		for _, j := range l.Items {
			if ref := metav1.GetControllerOf(&j); ref != nil && ref.Kind == "CronJob" || jobFinished(&j) {
				continue
			}
			add("Job", j.ObjectMeta, j.Spec.Template)
		}
	}
	return out
}

// jobFinished tells whether a Job makes no more pods.
func jobFinished(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// bindingNotes says what the check cannot see: gpufrac's policies not
// installed, or bindings that only audit (their verdicts go to the audit
// log, not to the client).
func bindingNotes(ctx context.Context, cs kubernetes.Interface) []string {
	l, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{fmt.Sprintf("admission policy bindings not listed (%v): whether gpufrac's policies are installed is not known", err)}
	}
	var notes []string
	n := 0
	for _, b := range l.Items {
		if !strings.HasPrefix(b.Spec.PolicyName, "gpufrac-") {
			continue
		}
		n++
		if !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) && !slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Warn) {
			notes = append(notes, fmt.Sprintf("binding %s only audits (%v): its verdicts go to the audit log, not to this check; set [Warn, Audit] to see them here", b.Name, b.Spec.ValidationActions))
		}
	}
	if n == 0 {
		notes = append(notes, "no gpufrac admission policy is bound (admissionPolicies.enabled=false?): nothing can refuse a workload, and this check finds nothing")
	}
	return notes
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

// owners names pods' workloads, reading a ReplicaSet's Deployment and a
// Job's CronJob once each.
type owners struct {
	cs    kubernetes.Interface
	owner map[string]string // namespace/ReplicaSet -> its workload
}

func newOwners(cs kubernetes.Interface) *owners { return &owners{cs: cs, owner: map[string]string{}} }

// workload is p's controller, a ReplicaSet's Deployment or a Job's CronJob
// in its place.
func (o *owners) workload(ctx context.Context, p *corev1.Pod) string {
	ref := metav1.GetControllerOf(p)
	if ref == nil {
		return "Pod/" + p.Name
	}
	name := ref.Kind + "/" + ref.Name
	if ref.Kind != "ReplicaSet" && ref.Kind != "Job" {
		return name
	}
	key := p.Namespace + "/" + name
	if w, ok := o.owner[key]; ok {
		return w
	}
	w := name
	var up *metav1.OwnerReference
	switch ref.Kind {
	case "ReplicaSet":
		if rs, err := o.cs.AppsV1().ReplicaSets(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}); err == nil {
			up = metav1.GetControllerOf(rs)
		}
	case "Job":
		if j, err := o.cs.BatchV1().Jobs(p.Namespace).Get(ctx, ref.Name, metav1.GetOptions{}); err == nil {
			up = metav1.GetControllerOf(j)
		}
	}
	if up != nil && (up.Kind == "Deployment" || up.Kind == "CronJob") {
		w = up.Kind + "/" + up.Name
	}
	o.owner[key] = w
	return w
}

// Render prints the report as a table.
func (r *Report) Render(w io.Writer) error {
	if len(r.Findings) == 0 {
		fmt.Fprintf(w, "%d pods and templates checked: gpufrac's admission policies refuse none of them.\n", r.Checked)
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
		fmt.Fprintf(w, "\n%d pods and templates checked, %d workloads refused by a policy (a policy that denies names only itself: fix it and check again).\n",
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
// warnings of its own response (calls are made one at a time), each bounded
// by perRequest (0: not bounded).
func NewDryRun(cfg *rest.Config, perRequest time.Duration) (DryRun, error) {
	col := &collector{}
	c := rest.CopyConfig(cfg)
	c.WarningHandler, c.WarningHandlerWithContext = nil, col
	// One dry run per pod shape: more than client-go's default 5/s, still
	// far below what an API server takes.
	c.QPS, c.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("creating the dry-run client: %w", err)
	}
	var mu sync.Mutex
	return func(ctx context.Context, p *corev1.Pod) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		col.take()
		if perRequest > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, perRequest)
			defer cancel()
		}
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
