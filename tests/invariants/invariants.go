// Package invariants checks, against any API server, what gpufrac must
// never get wrong whatever happened before - a coordinator killed, an API
// server restarted, a node gone: nothing double-booked, nothing orphaned,
// nothing left waiting without a word. The chaos suite calls it after every
// fault; other end-to-end tests call it when they end.
//
// What it checks (Check):
//
//  1. gpu: no GPU beyond 100 % of fractions, none given to two whole holders
//     (reservations count as whole holders), no fraction on a GPU a pod holds
//     whole, and every fraction's GPU held by a reservation (unless
//     Options.NoReservations) - the GPU it got, or before it is admitted the
//     GPU the coordinator planned; no pod rejected at device admission. These
//     read what gpufrac-node wrote back (gpufrac.io/allocated-gpu), so a
//     running pod holding GPUs on a node gpufrac-node serves (it publishes
//     the node's GPU inventory) must have it written back: otherwise the GPU
//     checks would pass for want of anything to check.
//  2. reservation: every reservation pod admitted (gpufrac.io/reserved-gpu),
//     on a Ready, schedulable node that lists its GPU healthy in fraction
//     mode, with a fraction on that GPU (unless Options.AllowIdleReservations),
//     one per GPU, none terminating.
//  3. placeholder: every placeholder pod serves pending work the queues
//     admitted (its pods wait with NoCapacity, DriftedNodesOnly or ReservationPending), and the
//     placeholders ask no more GPUs in all than that work could use (each
//     waiting pod its whole GPUs, one GPU per fraction, one per MIG device or
//     replica).
//  4. queue: every Queue's status.allocated (gpu, cpu) equals the usage
//     recomputed from the bound pods charged to it (gpufrac.io/admitted-queue)
//     and to its children; and every bound pod of the coordinator names the
//     queue it was charged to (the binding writes it: a pod bound without it
//     was not bound by the coordinator, and no queue pays for it).
//  5. pending: every pending pod of the coordinator older than
//     Options.PendingGrace says why (PodScheduled=False with a reason, never
//     Unschedulable).
//
// The checks read the API only, as the coordinator does; they do not share
// its code, so a bug in its accounting shows.
package invariants

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// The invariants, as Violation.Invariant names them.
const (
	GPU         = "gpu"
	Reservation = "reservation"
	Placeholder = "placeholder"
	Queue       = "queue"
	Pending     = "pending"
)

// reasonUnexpectedAdmissionError is the kubelet's reason for a pod it
// rejected at device admission.
const reasonUnexpectedAdmissionError = "UnexpectedAdmissionError"

// Options tune the checks.
type Options struct {
	// SchedulerName is the coordinator's scheduler name (default api.SchedulerName).
	SchedulerName string
	// PendingGrace is how long a new pending pod may go without a reason
	// (default 15 s: the coordinator reports ReservationPending after 5 s).
	PendingGrace time.Duration
	// AllowIdleReservations accepts reservations without fractions (a
	// coordinator with a long --reservation-grace).
	AllowIdleReservations bool
	// NoReservations is for a coordinator run with --reservations=false:
	// fractions need no reservation.
	NoReservations bool
	// AllowAdmissionRejections accepts pods the kubelet rejected at device
	// admission (a test that provokes them).
	AllowAdmissionRejections bool
	// NoWriteBack is for a bed where nothing plays gpufrac-node's
	// write-back of gpufrac.io/allocated-gpu on the pods it serves (the
	// scale benchmark plays only its reservation part): running pods
	// without it are not reported.
	NoWriteBack bool
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.SchedulerName == "" {
		o.SchedulerName = api.SchedulerName
	}
	if o.PendingGrace == 0 {
		o.PendingGrace = 15 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Violation is one broken invariant.
type Violation struct {
	// Invariant is one of GPU, Reservation, Placeholder, Queue, Pending.
	Invariant string
	// Object names what breaks it ("node/gpu", "namespace/pod", "queue q").
	Object string
	// Message says how.
	Message string
}

func (v Violation) String() string {
	return fmt.Sprintf("[%s] %s: %s", v.Invariant, v.Object, v.Message)
}

// world is what the checks read.
type world struct {
	o      Options
	nodes  map[string]*corev1.Node
	pods   []*corev1.Pod
	queues []*v1alpha1.Queue
	out    []Violation
}

func (w *world) add(inv, obj, format string, args ...any) {
	w.out = append(w.out, Violation{Invariant: inv, Object: obj, Message: fmt.Sprintf(format, args...)})
}

// Check reads nodes, pods and Queues and returns every violation, sorted.
// dyn may be nil: the queue check is skipped then.
func Check(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, o Options) ([]Violation, error) {
	o.defaults()
	w := &world{o: o, nodes: map[string]*corev1.Node{}}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		w.nodes[nodes.Items[i].Name] = &nodes.Items[i]
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		w.pods = append(w.pods, &pods.Items[i])
	}
	if dyn != nil {
		l, err := dyn.Resource(v1alpha1.QueueGVR()).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing queues: %w", err)
		}
		for i := range l.Items {
			if q, err := v1alpha1.FromUnstructured(&l.Items[i]); err == nil {
				w.queues = append(w.queues, q)
			}
		}
	}
	w.gpus()
	w.reservations()
	w.placeholders()
	w.queueUsage()
	w.pending()
	sort.Slice(w.out, func(i, j int) bool { return w.out[i].String() < w.out[j].String() })
	return w.out, nil
}

// Eventually polls Check until it finds nothing or limit passes, and then
// fails tb with the violations of the last check. Faults leave transient
// states (a reservation in its grace, a status not yet written): what
// matters is that the cluster settles into a correct one.
func Eventually(tb testing.TB, client kubernetes.Interface, dyn dynamic.Interface, o Options, limit time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), limit)
	defer cancel()
	var last []Violation // from the last check that read the cluster
	var lastErr error
	err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		vs, err := Check(ctx, client, dyn, o)
		if err != nil {
			lastErr = err
			return false, nil
		}
		last, lastErr = vs, nil
		return len(vs) == 0, nil
	})
	if err == nil {
		return
	}
	var b strings.Builder
	for _, v := range last {
		b.WriteString("\n  " + v.String())
	}
	tb.Fatalf("invariants still broken after %s (last error %v):%s", limit, lastErr, b.String())
}

func key(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func isReservation(p *corev1.Pod) bool {
	return p.Namespace == api.ReservationNamespace && p.Labels[api.LabelRole] == api.RoleReservation
}

func isPlaceholder(p *corev1.Pod) bool {
	return p.Namespace == api.ReservationNamespace && p.Labels[api.LabelRole] == api.RolePlaceholder
}

// amount reads an extended resource of a pod: per container the request,
// else the limit; containers add up, init containers count as a maximum.
func amount(p *corev1.Pod, name corev1.ResourceName) int64 {
	one := func(c *corev1.Container) int64 {
		if q, ok := c.Resources.Requests[name]; ok {
			return q.Value()
		}
		if q, ok := c.Resources.Limits[name]; ok {
			return q.Value()
		}
		return 0
	}
	var sum, init int64
	for i := range p.Spec.Containers {
		sum += one(&p.Spec.Containers[i])
	}
	for i := range p.Spec.InitContainers {
		init = max(init, one(&p.Spec.InitContainers[i]))
	}
	return max(sum, init)
}

// scalar tells whether a pod asks for MIG devices or time-sliced replicas
// (charged to queues by what the node's inventory says they are worth).
func scalar(p *corev1.Pod) bool {
	for _, c := range append(slices.Clone(p.Spec.Containers), p.Spec.InitContainers...) {
		for name := range c.Resources.Limits {
			if strings.HasPrefix(string(name), api.MIGResourcePrefix) || string(name) == api.DefaultTimesliceResource {
				return true
			}
		}
		for name := range c.Resources.Requests {
			if strings.HasPrefix(string(name), api.MIGResourcePrefix) || string(name) == api.DefaultTimesliceResource {
				return true
			}
		}
	}
	return false
}

// nodeGPU names one GPU of one node.
type nodeGPU struct{ node, gpu string }

func (k nodeGPU) String() string { return k.node + "/" + k.gpu }

// gpus checks invariant 1.
func (w *world) gpus() {
	whole := map[nodeGPU][]*corev1.Pod{} // GPU -> whole holders (reservations included)
	fracs := map[nodeGPU]int64{}         // GPU -> percent given to fractions
	planned := map[nodeGPU][]string{}    // GPU -> fraction pods planned on it and not admitted yet
	for _, p := range w.pods {
		if p.Status.Phase == corev1.PodFailed && p.Status.Reason == reasonUnexpectedAdmissionError && !w.o.AllowAdmissionRejections {
			w.add(GPU, key(p), "rejected at device admission: %s", p.Status.Message)
		}
		if p.Spec.NodeName == "" || terminal(p) || w.nodes[p.Spec.NodeName] == nil {
			continue // a pod on a node that is gone holds no GPU there
		}
		node := p.Spec.NodeName
		if isReservation(p) {
			if g := p.Annotations[api.AnnotationReservedGPU]; g != "" {
				k := nodeGPU{node, g}
				whole[k] = append(whole[k], p)
			}
			continue
		}
		if !isPlaceholder(p) && p.Status.Phase == corev1.PodRunning && p.Annotations[api.AnnotationAllocatedGPU] == "" &&
			(amount(p, api.ResourceGPU) > 0 || amount(p, api.ResourceFraction) > 0) && served(w.nodes[node]) && !w.o.NoWriteBack {
			w.add(GPU, key(p), "runs on %s holding GPUs, but gpufrac-node never wrote back which (%s)", node, api.AnnotationAllocatedGPU)
		}
		if g := p.Annotations[api.AnnotationGPU]; g != "" && amount(p, api.ResourceFraction) > 0 && p.Annotations[api.AnnotationAllocatedGPU] == "" {
			k := nodeGPU{node, g}
			planned[k] = append(planned[k], key(p))
		}
		if amount(p, api.ResourceGPU) > 0 {
			for _, g := range strings.Split(p.Annotations[api.AnnotationAllocatedGPU], ",") {
				if g != "" {
					k := nodeGPU{node, g}
					whole[k] = append(whole[k], p)
				}
			}
		}
		if pct := amount(p, api.ResourceFraction); pct > 0 {
			if g := p.Annotations[api.AnnotationAllocatedGPU]; g != "" {
				fracs[nodeGPU{node, g}] += pct
			}
		}
	}
	for k, hs := range whole {
		if len(hs) > 1 {
			names := make([]string, len(hs))
			for i, p := range hs {
				names[i] = key(p)
			}
			sort.Strings(names)
			w.add(GPU, k.String(), "given whole to %d pods: %s", len(hs), strings.Join(names, ", "))
		}
	}
	for k, pct := range fracs {
		if pct > 100 {
			w.add(GPU, k.String(), "fractions take %d%%", pct)
		}
		var reserved bool
		for _, p := range whole[k] {
			if isReservation(p) {
				reserved = true
			} else {
				w.add(GPU, k.String(), "fractions (%d%%) share it with %s, which holds it whole", pct, key(p))
			}
		}
		if !reserved && !w.o.NoReservations {
			w.add(GPU, k.String(), "fractions (%d%%) run on it but no reservation holds it", pct)
		}
	}
	// Fractions bound but not admitted yet: the coordinator binds them only
	// once their GPU's reservation holds it.
	for k, ps := range planned {
		if w.o.NoReservations || slices.ContainsFunc(whole[k], isReservation) {
			continue
		}
		sort.Strings(ps)
		w.add(GPU, k.String(), "fractions %s are bound to it but no reservation holds it", strings.Join(ps, ", "))
	}
}

// served tells whether gpufrac-node serves the node: it publishes the
// node's GPU inventory.
func served(n *corev1.Node) bool {
	return n.Annotations[api.AnnotationGPUInventory] != ""
}

// reservations checks invariant 2.
func (w *world) reservations() {
	used := map[nodeGPU]int{} // GPU -> fraction pods on it (given or planned)
	for _, p := range w.pods {
		if p.Spec.NodeName == "" || terminal(p) || amount(p, api.ResourceFraction) == 0 {
			continue
		}
		g := p.Annotations[api.AnnotationAllocatedGPU]
		if g == "" {
			g = p.Annotations[api.AnnotationGPU]
		}
		used[nodeGPU{p.Spec.NodeName, g}]++
	}
	perGPU := map[nodeGPU][]string{}
	for _, p := range w.pods {
		if !isReservation(p) || terminal(p) {
			continue
		}
		if p.DeletionTimestamp != nil {
			w.add(Reservation, key(p), "still terminating")
			continue
		}
		node := w.nodes[p.Spec.NodeName]
		g := p.Annotations[api.AnnotationReservedGPU]
		planned := p.Annotations[api.AnnotationGPU]
		k := nodeGPU{p.Spec.NodeName, g}
		if g == "" {
			k.gpu = planned
		}
		perGPU[k] = append(perGPU[k], key(p))
		switch {
		case node == nil:
			w.add(Reservation, key(p), "its node %s no longer exists", p.Spec.NodeName)
			continue
		case node.Spec.Unschedulable:
			w.add(Reservation, key(p), "its node %s is cordoned", node.Name)
		case !cluster.IsNodeReady(node):
			w.add(Reservation, key(p), "its node %s is not Ready", node.Name)
		}
		if g == "" {
			w.add(Reservation, key(p), "not admitted: no %s (planned GPU %s)", api.AnnotationReservedGPU, planned)
			continue
		}
		inv, err := api.DecodeInventory(node.Annotations[api.AnnotationGPUInventory])
		if err != nil {
			w.add(Reservation, key(p), "node %s has no readable GPU inventory: %v", node.Name, err)
			continue
		}
		i := slices.IndexFunc(inv, func(x api.GPUInfo) bool { return x.UUID == g })
		switch {
		case i < 0:
			w.add(Reservation, key(p), "GPU %s is not in the inventory of %s", g, node.Name)
		case !inv[i].Healthy:
			w.add(Reservation, key(p), "GPU %s on %s is unhealthy", g, node.Name)
		case inv[i].Mode != "fraction":
			w.add(Reservation, key(p), "GPU %s on %s is in mode %s", g, node.Name, inv[i].Mode)
		}
		if used[k] == 0 && !w.o.AllowIdleReservations {
			w.add(Reservation, key(p), "no fraction uses GPU %s on %s", g, node.Name)
		}
	}
	for k, rs := range perGPU {
		if len(rs) > 1 {
			sort.Strings(rs)
			w.add(Reservation, k.String(), "%d reservations: %s", len(rs), strings.Join(rs, ", "))
		}
	}
}

// scheduledReason is a pending pod's PodScheduled=False reason ("" if none).
func scheduledReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Reason
		}
	}
	return ""
}

// waiting tells whether a pod is the coordinator's and pending.
func (w *world) waiting(p *corev1.Pod) bool {
	return p.Spec.SchedulerName == w.o.SchedulerName && p.Spec.NodeName == "" && !terminal(p) && p.DeletionTimestamp == nil
}

// placeholders checks invariant 3.
func (w *world) placeholders() {
	admitted := map[string]bool{} // workload key -> some pod of it waits for capacity
	var could int64               // GPUs the waiting admitted pods could use at most
	for _, p := range w.pods {
		if !w.waiting(p) {
			continue
		}
		if r := scheduledReason(p); r != api.ReasonNoCapacity && r != api.ReasonDriftedNodesOnly && r != api.ReasonReservationPending {
			continue
		}
		admitted[key(p)] = true
		if g := p.Labels[api.LabelPodGroup]; g != "" {
			admitted[p.Namespace+"/"+g] = true
		} else if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "Job" {
			// A Job's gang is named after the Job when no pod-group
			// label names it (podrequest).
			admitted[p.Namespace+"/"+ref.Name] = true
		}
		if sg := p.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
			// A PodGroup's gang (KEP-4671), as the coordinator names it
			// (podrequest.PodGroupGangPrefix).
			admitted[p.Namespace+"/podgroup/"+*sg.PodGroupName] = true
		}
		could += gpusAtMost(p)
	}
	var asked int64 // GPUs the placeholders ask
	var names []string
	for _, p := range w.pods {
		if !isPlaceholder(p) || terminal(p) || p.DeletionTimestamp != nil {
			continue
		}
		asked += amount(p, api.ResourceGPU)
		names = append(names, p.Name)
		serves := false
		for _, wl := range strings.Split(p.Annotations[placeholder.AnnotationWorkloads], ",") {
			serves = serves || admitted[wl]
		}
		if !serves {
			w.add(Placeholder, key(p), "serves no pending admitted work (workloads %q)", p.Annotations[placeholder.AnnotationWorkloads])
		}
	}
	if asked > could {
		sort.Strings(names)
		w.add(Placeholder, api.ReservationNamespace, "placeholders ask %d GPUs, more than the %d the admitted pending pods could use: %s",
			asked, could, strings.Join(names, ", "))
	}
}

// gpusAtMost is the most GPUs a pod could take: its whole GPUs, one for its
// fraction, one per MIG device or time-sliced replica.
func gpusAtMost(p *corev1.Pod) int64 {
	n := amount(p, api.ResourceGPU)
	if amount(p, api.ResourceFraction) > 0 {
		n++
	}
	names := map[corev1.ResourceName]bool{}
	for _, c := range append(slices.Clone(p.Spec.Containers), p.Spec.InitContainers...) {
		for name := range c.Resources.Limits {
			names[name] = true
		}
		for name := range c.Resources.Requests {
			names[name] = true
		}
	}
	for name := range names {
		if strings.HasPrefix(string(name), api.MIGResourcePrefix) || string(name) == api.DefaultTimesliceResource {
			n += amount(p, name)
		}
	}
	return n
}

// queueUsage checks invariant 4.
func (w *world) queueUsage() {
	parent := map[string]string{}
	for _, q := range w.queues {
		parent[q.Name] = q.Spec.Parent
	}
	type usage struct{ gpu, cpu int64 }
	used := map[string]*usage{}
	unchecked := map[string]bool{} // queue -> some pod's charge depends on the inventory (MIG, replicas)
	for _, q := range w.queues {
		used[q.Name] = &usage{}
	}
	for _, p := range w.pods {
		if p.Spec.SchedulerName == w.o.SchedulerName && p.Spec.NodeName != "" && !terminal(p) && p.Annotations[api.AnnotationAdmittedQueue] == "" {
			w.add(Queue, key(p), "bound to %s without %s: the coordinator did not bind it, and no queue is charged for it",
				p.Spec.NodeName, api.AnnotationAdmittedQueue)
		}
		// A bound pod is charged to the queue its binding recorded; bound pods
		// without it are not the coordinator's work, whatever their labels say.
		leaf := p.Annotations[api.AnnotationAdmittedQueue]
		if leaf == "" || p.Spec.NodeName == "" || terminal(p) || used[leaf] == nil {
			continue
		}
		gpu := amount(p, api.ResourceGPU)*1000 + amount(p, api.ResourceFraction)*10
		cpu := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})[corev1.ResourceCPU]
		for q, hops := leaf, 0; q != "" && used[q] != nil && hops <= len(w.queues); q, hops = parent[q], hops+1 {
			used[q].gpu += gpu
			used[q].cpu += cpu.MilliValue()
			if scalar(p) {
				unchecked[q] = true
			}
		}
	}
	for _, q := range w.queues {
		if unchecked[q.Name] {
			continue
		}
		if c := findCondition(q.Status.Conditions, v1alpha1.ConditionValid); c != nil && c.Status == metav1.ConditionFalse {
			continue // an invalid queue is charged nothing
		}
		u := used[q.Name]
		gotGPU, gotCPU := q.Status.Allocated["gpu"], q.Status.Allocated["cpu"]
		if gotGPU.MilliValue() != u.gpu || gotCPU.MilliValue() != u.cpu {
			w.add(Queue, "queue "+q.Name, "status says %s GPU and %s CPU allocated, its pods use %.3f GPU and %.3f CPU",
				gotGPU.String(), gotCPU.String(), float64(u.gpu)/1000, float64(u.cpu)/1000)
		}
	}
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

// pending checks invariant 5.
func (w *world) pending() {
	now := w.o.Now()
	for _, p := range w.pods {
		if !w.waiting(p) || now.Sub(p.CreationTimestamp.Time) < w.o.PendingGrace {
			continue
		}
		switch r := scheduledReason(p); r {
		case "":
			w.add(Pending, key(p), "pending for %s without a reason", now.Sub(p.CreationTimestamp.Time).Round(time.Second))
		case corev1.PodReasonUnschedulable:
			w.add(Pending, key(p), "says Unschedulable, which makes Karpenter provision for it")
		}
	}
}
