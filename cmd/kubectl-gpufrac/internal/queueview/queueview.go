// Package queueview builds and prints kubectl gpufrac's queue view: each
// gpufrac.io/v1alpha1 Queue with its GPU quota and limit, the GPUs its
// running pods are charged, what the coordinator last wrote in its status,
// and its pending pods by the reason the coordinator gave (the PodScheduled
// condition). Charges come from the coordinator's own request parsing
// (coordinator/podrequest) and are summed up the tree by its quota
// arithmetic (coordinator/queue), so the plugin and the coordinator count
// alike.
package queueview

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/queue"
)

// ReasonWaiting is the pending reason of a pod without a PodScheduled
// condition: no scheduler has looked at it yet.
const ReasonWaiting = "Waiting"

// View is the queues and what they hold. It is also the JSON shape of
// kubectl gpufrac queues -o json: fields are only added, never renamed.
type View struct {
	// Namespace is set when only that namespace's pods were read: Used then
	// counts them alone.
	Namespace string `json:"namespace,omitempty"`
	// Queues are by name; queues named by pods but not readable or absent
	// appear with Known false.
	Queues []Queue `json:"queues"`
	// Notes say what could not be read.
	Notes []string `json:"notes,omitempty"`
}

// Queue is one queue.
type Queue struct {
	Name   string `json:"name"`
	Parent string `json:"parent,omitempty"`
	// Known is false for a queue pods name that was not read (absent, or
	// queues not readable).
	Known bool `json:"known"`
	// GPUQuota and GPULimit are in GPUs ("2.5"); empty when the queue does
	// not manage GPUs (quota) or sets no limit.
	GPUQuota string `json:"gpuQuota,omitempty"`
	GPULimit string `json:"gpuLimit,omitempty"`
	// UsedMilliGPU is the charge of the running (bound, not finished) pods
	// the coordinator admitted to the queue or its children, in milli-GPU
	// (a whole GPU 1000, a 30% fraction 300); UsedGPUs the same in GPUs.
	UsedMilliGPU int64  `json:"usedMilliGPU"`
	UsedGPUs     string `json:"usedGPUs"`
	// AllocatedGPUs is the queue's status.allocated.gpu as the coordinator
	// last wrote it (children included); empty when absent.
	AllocatedGPUs string `json:"allocatedGPUs,omitempty"`
	// Running counts the pods charged to the queue itself.
	Running int `json:"running"`
	// Pending counts the queue's pending GPU pods by reason (OverQuota,
	// OverLimit, GangIncomplete, NoCapacity, ..., Waiting).
	Pending map[string]int `json:"pending"`
	// Invalid is the message of a Valid=False condition.
	Invalid string `json:"invalid,omitempty"`
}

// Load reads the queues (when allowed) and the pods of namespace ns (every
// namespace when ns is empty). Listing pods may fail with Forbidden, which
// the caller tests with apierrors.IsForbidden; queues that cannot be read
// leave a note.
func Load(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, ns string) (*View, error) {
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		if ns != "" {
			return nil, fmt.Errorf("listing pods in namespace %s: %w", ns, err)
		}
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	var queues []v1alpha1.Queue
	var notes []string
	l, err := dyn.Resource(v1alpha1.QueueGVR()).List(ctx, metav1.ListOptions{})
	switch {
	case err == nil:
		for i := range l.Items {
			q, err := v1alpha1.FromUnstructured(&l.Items[i])
			if err != nil {
				notes = append(notes, err.Error())
				continue
			}
			queues = append(queues, *q)
		}
	case apierrors.IsForbidden(err):
		notes = append(notes, "queues are not readable with these credentials (list queues.gpufrac.io forbidden): quotas, limits and status not shown")
	case apierrors.IsNotFound(err):
		notes = append(notes, "the API server does not serve queues.gpufrac.io (gpufrac's CRDs not installed?)")
	default:
		return nil, fmt.Errorf("listing queues: %w", err)
	}
	// Claims (nodes in mode dra) say what their pods are charged; without
	// them (not served, or not readable) such pods are charged nothing.
	var claims []resourceapi.ResourceClaim
	if l, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{}); err == nil {
		claims = l.Items
	}
	// A pending pod without a queue label is its namespace's default
	// queue's (the namespace's gpufrac.io/default-queue label), as the
	// coordinator charges it; namespaces that cannot be read leave a note.
	defaults, err := defaultQueues(ctx, client, ns)
	if err != nil {
		notes = append(notes, err.Error())
	}
	v := Build(queues, pods.Items, claims, defaults)
	v.Namespace = ns
	v.Notes = append(notes, v.Notes...)
	if ns != "" {
		v.Notes = append(v.Notes, "used counts namespace "+ns+"'s pods only; allocated is the coordinator's figure for the whole queue")
	}
	return v, nil
}

// defaultQueues is each namespace's default queue (its gpufrac.io/default-queue
// label): of namespace ns, or of every namespace when ns is empty.
func defaultQueues(ctx context.Context, client kubernetes.Interface, ns string) (map[string]string, error) {
	const why = "pending pods without a %s label are not counted under their namespace's default queue: %v"
	out := map[string]string{}
	if ns != "" {
		n, err := client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			return out, fmt.Errorf(why, api.LabelQueue, err)
		}
		if q := n.Labels[api.LabelDefaultQueue]; q != "" {
			out[ns] = q
		}
		return out, nil
	}
	l, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return out, fmt.Errorf(why, api.LabelQueue, err)
	}
	for i := range l.Items {
		if q := l.Items[i].Labels[api.LabelDefaultQueue]; q != "" {
			out[l.Items[i].Name] = q
		}
	}
	return out, nil
}

// Build makes the view from queues, pods, the pods' resource claims and
// each namespace's default queue (nil: none known): pure, for tests.
func Build(queues []v1alpha1.Queue, pods []corev1.Pod, claims []resourceapi.ResourceClaim, defaults map[string]string) *View {
	v := &View{Queues: []Queue{}}
	claimOf := map[[2]string]*resourceapi.ResourceClaim{} // namespace, name -> claim
	for i := range claims {
		claimOf[[2]string{claims[i].Namespace, claims[i].Name}] = &claims[i]
	}
	opts := podrequest.Options{Claims: podrequest.ClaimOptions{Get: func(ns, name string) (*resourceapi.ResourceClaim, bool) {
		c, ok := claimOf[[2]string{ns, name}]
		return c, ok
	}}}
	rows := map[string]*Queue{} // queue name -> its row
	row := func(name string) *Queue {
		if r := rows[name]; r != nil {
			return r
		}
		rows[name] = &Queue{Name: name, Pending: map[string]int{}}
		return rows[name]
	}
	specs := make([]queue.Spec, 0, len(queues))
	for i := range queues {
		q := &queues[i]
		r := row(q.Name)
		r.Known, r.Parent = true, q.Spec.Parent
		if g := q.Spec.Resources.GPU; g != nil {
			r.GPUQuota = "0"
			if g.Quota != nil {
				r.GPUQuota = FormatMilli(g.Quota.MilliValue())
			}
			if g.Limit != nil {
				r.GPULimit = FormatMilli(g.Limit.MilliValue())
			}
		}
		if a, ok := q.Status.Allocated[v1alpha1.ResourceGPU]; ok {
			r.AllocatedGPUs = FormatMilli(a.MilliValue())
		}
		if c := meta(q.Status.Conditions, v1alpha1.ConditionValid); c != nil && c.Status == metav1.ConditionFalse {
			r.Invalid = c.Message
		}
		s, err := queue.SpecFromAPI(q)
		if err != nil {
			s.Invalid = err.Error()
		}
		specs = append(specs, s)
	}
	// The tree's problems are the coordinator's to report (Valid condition);
	// the tree it returns holds the valid queues.
	tree, _ := queue.NewTree(specs)
	unknown := map[string]int64{} // queue not in the tree -> milli-GPU charged to it
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if p.Spec.NodeName == "" {
			name := p.Labels[api.LabelQueue]
			if name == "" && p.Spec.SchedulerName == api.SchedulerName {
				// The coordinator charges its label-less pods to their
				// namespace's default queue.
				name = defaults[p.Namespace]
			}
			if name != "" && isGPUPod(p) {
				row(name).Pending[PendingReason(p)]++
			}
			continue
		}
		name := p.Annotations[api.AnnotationAdmittedQueue]
		if name == "" {
			continue // not admitted by the coordinator: charged to no queue
		}
		milli, nonPreemptible, ok := Charge(p, opts)
		if !ok {
			continue
		}
		row(name).Running++
		if err := tree.Assume(name, queue.Resources{GPUMilli: milli}, nonPreemptible); err != nil {
			unknown[name] += milli
		}
	}
	for _, name := range slices.Sorted(maps.Keys(rows)) {
		r := rows[name]
		if used, _, ok := tree.Usage(name); ok {
			r.UsedMilliGPU = used.GPUMilli
		} else {
			r.UsedMilliGPU = unknown[name]
		}
		r.UsedGPUs = FormatMilli(r.UsedMilliGPU)
		v.Queues = append(v.Queues, *r)
	}
	return v
}

// Charge is the milli-GPU a bound pod is charged to the queue that admitted
// it, read as the coordinator reads admitted pods: the spec alone, under the
// admitted queue, preemptible as the binding recorded. MIG devices and
// replicas are charged the coordinator's fallback worth (nodes' inventories
// are not read), a claim for bytes of a GPU a whole GPU (the GPU's memory
// is not read). ok is false when the pod does not parse.
func Charge(p *corev1.Pod, opts podrequest.Options) (milli int64, nonPreemptible bool, ok bool) {
	spec := *p
	spec.Labels = map[string]string{api.LabelQueue: p.Annotations[api.AnnotationAdmittedQueue]}
	spec.Annotations = nil
	spec.OwnerReferences = nil
	parsed, err := podrequest.Parse(&spec, opts)
	if err != nil {
		return 0, false, false
	}
	nonPreemptible = parsed.NonPreemptible
	switch p.Annotations[api.AnnotationAdmittedPreemptible] {
	case "true":
		nonPreemptible = false
	case "false":
		nonPreemptible = true
	}
	return parsed.QueueResources().GPUMilli, nonPreemptible, true
}

// isGPUPod tells whether a pod asks for GPUs or is gpufrac's to schedule.
func isGPUPod(p *corev1.Pod) bool {
	r := request.Parse(p, request.Options{})
	return r.Whole() > 0 || r.Fraction() > 0 || len(r.Scalars()) > 0 || len(p.Spec.ResourceClaims) > 0 ||
		p.Spec.SchedulerName == api.SchedulerName
}

// PendingReason is the reason of a pending pod's PodScheduled=False
// condition (what the coordinator wrote), or ReasonWaiting without one.
func PendingReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			return c.Reason
		}
	}
	return ReasonWaiting
}

func meta(cs []metav1.Condition, t string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

// FormatMilli renders milli-GPU as GPUs: 1300 is "1.3", 2000 "2".
func FormatMilli(m int64) string {
	s := strconv.FormatInt(m/1000, 10)
	if frac := m % 1000; frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%03d", frac), "0")
	}
	return s
}

// Render prints the view as a table.
func (v *View) Render(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(v.Queues) == 0 {
		fmt.Fprintln(tw, "No queues.")
	} else {
		fmt.Fprintln(tw, "QUEUE\tPARENT\tGPU QUOTA\tGPU LIMIT\tUSED\tALLOCATED\tRUNNING\tPENDING")
		for _, q := range v.Queues {
			name := q.Name
			if !q.Known {
				name += " (not read)"
			}
			if q.Invalid != "" {
				name += " (invalid)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", name, dash(q.Parent), dash(q.GPUQuota), limit(q), q.UsedGPUs,
				dash(q.AllocatedGPUs), q.Running, pending(q.Pending))
		}
	}
	for _, q := range v.Queues {
		if q.Invalid != "" {
			fmt.Fprintf(tw, "queue %s is invalid: %s\n", q.Name, q.Invalid)
		}
	}
	for _, n := range v.Notes {
		fmt.Fprintln(tw, "Note: "+n)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("printing queues: %w", err)
	}
	return nil
}

func limit(q Queue) string {
	switch {
	case q.GPULimit != "":
		return q.GPULimit
	case q.Known:
		return "none"
	}
	return "-"
}

// pending is "OverQuota 2, NoCapacity 1" (most first), or "-".
func pending(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	reasons := slices.SortedFunc(maps.Keys(m), func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s %d", r, m[r])
	}
	return strings.Join(parts, ", ")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
