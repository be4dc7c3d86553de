// Package tenantview builds and prints kubectl gpufrac's namespace view: the
// GPU pods of one namespace with their node, GPU, share, phase, the reason
// the coordinator gave while they are pending, and their queue. It reads
// only that namespace's pods (list pods in the namespace), so a tenant
// without cluster-wide reads can use it; the queues its pods use are added
// by the caller when queues are readable (queueview).
package tenantview

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
)

// View is a namespace's GPU pods. It is also the JSON shape of
// kubectl gpufrac -n NS -o json (with the queues beside it): fields are only
// added, never renamed.
type View struct {
	Namespace string `json:"namespace"`
	Pods      []Pod  `json:"pods"`
}

// Pod is one GPU pod.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Node is the node it is bound to; empty while pending.
	Node string `json:"node,omitempty"`
	// GPU is the GPU UUID gpufrac-node gave the pod (gpufrac.io/allocated-gpu,
	// comma-separated for several whole GPUs), else the one the coordinator
	// chose (gpufrac.io/gpu) while gpufrac-node has not written it back.
	GPU string `json:"gpu,omitempty"`
	// Share is what the pod holds or asks: "30%", "1 GPU", "2 GPUs",
	// "nvidia.com/mig-1g.10gb 1", "claims".
	Share string `json:"share"`
	// Percent is the share of one GPU for a fraction; Whole the whole GPUs.
	Percent int `json:"percent,omitempty"`
	Whole   int `json:"whole,omitempty"`
	// Reservation is set for a reservation pod of the coordinator (only in
	// gpufrac-reservations).
	Reservation bool   `json:"reservation,omitempty"`
	Phase       string `json:"phase"`
	// Reason and Message are the PodScheduled=False condition's, the
	// coordinator's word on why a pending pod waits (OverQuota, OverLimit,
	// GangIncomplete, NoCapacity, ...), or the kubelet's for a pod it rejected.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Queue is the queue the coordinator admitted the pod to
	// (gpufrac.io/admitted-queue), else its gpufrac.io/queue label.
	Queue string `json:"queue,omitempty"`
}

// Load lists the pods of namespace ns (bound to node only, when set) and
// builds the view.
func Load(ctx context.Context, client kubernetes.Interface, ns, node string) (*View, error) {
	opts := metav1.ListOptions{}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	l, err := client.CoreV1().Pods(ns).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing pods in namespace %s: %w", ns, err)
	}
	items := l.Items
	if node != "" {
		// The field selector did this already; kept for API servers (and
		// fakes) that ignore it.
		items = slices.DeleteFunc(items, func(p corev1.Pod) bool { return p.Spec.NodeName != node })
	}
	return Build(ns, items), nil
}

// Build makes the view from a namespace's pods: pure, for tests. Finished
// pods are left out, but for those the kubelet rejected.
func Build(ns string, pods []corev1.Pod) *View {
	v := &View{Namespace: ns, Pods: []Pod{}}
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodSucceeded || (p.Status.Phase == corev1.PodFailed && p.Status.Reason == "") {
			continue
		}
		r := request.Parse(p, request.Options{})
		if r.Whole() == 0 && r.Fraction() == 0 && len(r.Scalars()) == 0 && len(p.Spec.ResourceClaims) == 0 &&
			p.Spec.SchedulerName != api.SchedulerName {
			continue
		}
		row := Pod{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase),
			Percent: r.Fraction(), Whole: r.Whole(), Share: share(r, p),
			Reservation: p.Namespace == api.ReservationNamespace && p.Labels[api.LabelRole] == api.RoleReservation,
			Queue:       cmp.Or(p.Annotations[api.AnnotationAdmittedQueue], p.Labels[api.LabelQueue])}
		row.GPU = cmp.Or(p.Annotations[api.AnnotationAllocatedGPU], p.Annotations[api.AnnotationReservedGPU], p.Annotations[api.AnnotationGPU])
		if p.Status.Phase == corev1.PodFailed {
			row.Reason, row.Message = p.Status.Reason, p.Status.Message
		} else if p.Spec.NodeName == "" {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					row.Reason, row.Message = c.Reason, c.Message
				}
			}
		}
		v.Pods = append(v.Pods, row)
	}
	slices.SortFunc(v.Pods, func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) })
	return v
}

func share(r *request.Pod, p *corev1.Pod) string {
	var parts []string
	switch w := r.Whole(); {
	case w == 1:
		parts = append(parts, "1 GPU")
	case w > 1:
		parts = append(parts, fmt.Sprintf("%d GPUs", w))
	}
	if f := r.Fraction(); f > 0 {
		parts = append(parts, fmt.Sprintf("%d%%", f))
	}
	sc := r.Scalars()
	for _, name := range slices.Sorted(maps.Keys(sc)) {
		parts = append(parts, fmt.Sprintf("%s %d", name, sc[name]))
	}
	if len(parts) == 0 && len(p.Spec.ResourceClaims) > 0 {
		parts = append(parts, "claims")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " + ")
}

// Render prints the view as a table.
func (v *View) Render(w io.Writer, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(v.Pods) == 0 {
		fmt.Fprintf(tw, "No GPU pods in namespace %s.\n", v.Namespace)
	} else {
		fmt.Fprintln(tw, "POD\tNODE\tGPU\tSHARE\tPHASE\tQUEUE\tWHY")
		for _, p := range v.Pods {
			gpu := p.GPU
			if !wide && len(gpu) > 12 {
				gpu = gpu[:12] + "…"
			}
			why := strings.TrimSuffix(strings.TrimSpace(p.Reason+": "+p.Message), ":")
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, dash(p.Node), dash(gpu), p.Share, p.Phase, dash(p.Queue), dash(why))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("printing namespace view: %w", err)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
