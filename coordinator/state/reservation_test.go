package state

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// reservationOn is an admitted reservation pod holding gpu on node.
func reservationOn(node, gpu string) *corev1.Pod {
	r := pod("gpufrac-reservation-" + node + "-" + gpu).on(node).gpus(1).phase(corev1.PodRunning).p
	r.Namespace = api.ReservationNamespace
	r.Labels[api.LabelRole] = api.RoleReservation
	r.Annotations[api.AnnotationGPU] = gpu
	r.Annotations[api.AnnotationReservedGPU] = gpu
	return r
}

// withGPU changes GPU index i of the node's inventory.
func (b *nodeB) withGPU(i int, change func(*api.GPUInfo)) *nodeB {
	inv, err := api.DecodeInventory(b.n.Annotations[api.AnnotationGPUInventory])
	if err != nil {
		panic(err)
	}
	change(&inv[i])
	s, _ := api.EncodeInventory(inv)
	b.n.Annotations[api.AnnotationGPUInventory] = s
	return b
}

func (b *nodeB) cordoned() *nodeB { b.n.Spec.Unschedulable = true; return b }

// TestReservationsAreTrackedWhateverTheirNodeOrGPU: a reservation whose GPU
// left fraction mode or turned unhealthy, or whose node is cordoned, not
// Ready or gone, stays in the snapshot, marked orphaned with why and with
// the fractions still on it, so the reservation manager can remove it.
func TestReservationsAreTrackedWhateverTheirNodeOrGPU(t *testing.T) {
	tests := []struct {
		name     string
		node     *corev1.Node // nil: the node was deleted
		fraction bool         // a 30% fraction runs on the GPU
		orphaned string       // part of the reason, "" when the reservation is fine
		lost     bool         // its node is gone or not Ready
	}{
		{name: "healthy shared GPU", node: node("n", 2).inventory("fraction").n, fraction: true},
		{name: "node cordoned", node: node("n", 2).inventory("fraction").cordoned().n, orphaned: "cordoned"},
		{name: "node not Ready", node: node("n", 2).inventory("fraction").notReady().n, fraction: true, orphaned: "not Ready", lost: true},
		{name: "node deleted", orphaned: "no longer exists", lost: true},
		{name: "GPU unhealthy", node: node("n", 2).inventory("fraction").withGPU(1, func(g *api.GPUInfo) { g.Healthy = false }).n, fraction: true, orphaned: "unhealthy"},
		{name: "GPU switched to MIG", node: node("n", 2).inventory("fraction").withGPU(1, func(g *api.GPUInfo) { g.Mode = "mig" }).n, orphaned: "mode mig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := []*corev1.Pod{reservationOn("n", "n-gpu1")}
			if tt.fraction {
				f := pod("f").on("n").fraction(30, "n-gpu1").phase(corev1.PodRunning).p
				f.Annotations[api.AnnotationAllocatedGPU] = "n-gpu1"
				pods = append(pods, f)
			}
			var nodes []*corev1.Node
			if tt.node != nil {
				nodes = append(nodes, tt.node)
			}
			s, err := Build(Inputs{Nodes: nodes, Pods: pods, PoolLabel: api.LabelNodePool})
			if err != nil {
				t.Fatal(err)
			}
			r := s.Reservations[NodeGPU{"n", "n-gpu1"}]
			if r == nil {
				t.Fatalf("the reservation fell out of the snapshot; reservations: %v", s.Reservations)
			}
			if (tt.orphaned == "") != (r.Orphaned == "") || !strings.Contains(r.Orphaned, tt.orphaned) {
				t.Errorf("orphaned %q, want it to say %q", r.Orphaned, tt.orphaned)
			}
			if want := map[bool]int{true: 1}[tt.fraction]; r.Fractions != want {
				t.Errorf("fractions = %d, want %d", r.Fractions, want)
			}
			if r.NodeLost != tt.lost || r.NodeGone != (tt.node == nil) {
				t.Errorf("NodeLost %v NodeGone %v, want %v and %v", r.NodeLost, r.NodeGone, tt.lost, tt.node == nil)
			}
			if !r.Ready {
				t.Error("an admitted reservation is not Ready")
			}
		})
	}
}

// TestReservedGPUIsExplicit: a reserved GPU is said so, not encoded in its
// free milli: it shows all its room for fractions, and still never takes a
// whole-GPU pod.
func TestReservedGPUIsExplicit(t *testing.T) {
	s, err := Build(Inputs{Nodes: []*corev1.Node{node("n", 2).inventory("fraction").n},
		Pods: []*corev1.Pod{reservationOn("n", "n-gpu1")}, PoolLabel: api.LabelNodePool})
	if err != nil {
		t.Fatal(err)
	}
	gpus := s.Node(0).GPUs
	if gpus[1].FreeMilli != placement.MilliPerGPU || !gpus[1].Reserved || gpus[0].Reserved {
		t.Errorf("GPUs %+v, want gpu1 reserved with all its 1000 milli free, gpu0 not reserved", gpus)
	}
	p, err := placement.New(placement.DefaultPolicy, placement.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		d, err := p.Place(s.Snapshot, &placement.Request{GPUs: 1})
		if err != nil {
			break
		}
		if d.GPUs[0] == "n-gpu1" {
			t.Fatalf("a whole-GPU request got the reserved GPU")
		}
		if err := s.Assume(&placement.Request{GPUs: 1}, d); err != nil {
			t.Fatal(err)
		}
	}
	// Fractions use the reserved GPU: it is the reservation's purpose. (A
	// 100% fraction takes an unreserved GPU: placement never sees a whole
	// reserved GPU free, see placement.Snapshot.)
	d, err := p.Place(s.Snapshot, &placement.Request{ShareMilli: 900})
	if err != nil || d.GPUs[0] != "n-gpu1" {
		t.Errorf("a 90%% fraction: %+v, %v; want the reserved GPU", d, err)
	}
}

// TestReservationBeingRemovedTakesNoFraction: a reservation pod that is
// terminating, or that the coordinator deleted while the informer still
// shows it as it was (Inputs.Removing), still holds its GPU, but no
// fraction may be placed there any more.
func TestReservationBeingRemovedTakesNoFraction(t *testing.T) {
	for _, tc := range []struct {
		name        string
		terminating bool
		removing    bool
	}{
		{name: "terminating", terminating: true},
		{name: "deleted, informer behind", removing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := reservationOn("n", "n-gpu1")
			res.UID = "res"
			if tc.terminating {
				res.DeletionTimestamp = &metav1.Time{Time: time.Unix(1_700_000_000, 0)}
			}
			in := Inputs{Nodes: []*corev1.Node{node("n", 2).inventory("fraction").n}, Pods: []*corev1.Pod{res}}
			if tc.removing {
				in.Removing = map[types.UID]bool{"res": true}
			}
			snap, err := Build(in)
			if err != nil {
				t.Fatal(err)
			}
			r := snap.Reservations[NodeGPU{"n", "n-gpu1"}]
			if r == nil || !strings.Contains(r.Orphaned, "being removed") {
				t.Fatalf("reservation %+v, want it orphaned as being removed", r)
			}
			g := snap.Node(0).GPUs
			i := slices.IndexFunc(g, func(x placement.GPU) bool { return x.ID == "n-gpu1" })
			if i < 0 || g[i].Reserved || g[i].FreeMilli != 0 {
				t.Errorf("GPUs %+v, want n-gpu1 held whole (not reserved for shares)", g)
			}
		})
	}
}

// TestReservationCreatedNotShownTakesAGPU: a reservation the coordinator
// created that the informer does not show yet (Inputs.Creating) takes a GPU
// of its node: the one it asks for when nobody is known to hold it, else a
// clean one, as a shown reservation not yet told its GPU. Once shown it is
// counted from its pod only, and said shown.
func TestReservationCreatedNotShownTakesAGPU(t *testing.T) {
	whole := pod("w").on("n").gpus(1).p
	whole.Annotations[api.AnnotationAllocatedGPU] = "n-gpu0" // written back: it got the GPU the reservation asks for
	tests := []struct {
		name      string
		asked     string
		shown     bool
		wantFree  []int
		wantReady map[NodeGPU]bool // reservations tracked -> Ready
		wantShown map[NodeGPU]bool
	}{
		{name: "its GPU held: a clean one", asked: "n-gpu0", wantFree: []int{0, 0, 1000}, wantReady: map[NodeGPU]bool{}},
		{name: "its GPU free: that one, reserved", asked: "n-gpu2", wantFree: []int{0, 1000, 1000}, wantReady: map[NodeGPU]bool{}},
		{name: "shown: counted once", asked: "n-gpu2", shown: true, wantFree: []int{0, 1000, 1000},
			wantReady: map[NodeGPU]bool{{"n", "n-gpu2"}: true}, wantShown: map[NodeGPU]bool{{"n", "n-gpu2"}: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := []*corev1.Pod{whole}
			if tt.shown {
				pods = append(pods, reservation("r", 1, tt.asked, tt.asked))
			}
			s, err := Build(Inputs{Nodes: []*corev1.Node{node("n", 3).inventory("fraction").n}, Pods: pods, PoolLabel: api.LabelNodePool,
				Creating: map[NodeGPU]bool{{"n", tt.asked}: true}})
			if err != nil {
				t.Fatal(err)
			}
			var gotFree []int
			reserved := map[string]bool{}
			for _, g := range s.Node(0).GPUs {
				gotFree = append(gotFree, g.FreeMilli)
				reserved[g.ID] = g.Reserved
			}
			ready := map[NodeGPU]bool{}
			for k, r := range s.Reservations {
				ready[k] = r.Ready
			}
			if diff := cmp.Diff(tt.wantFree, gotFree); diff != "" {
				t.Errorf("GPU free milli (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantReady, ready); diff != "" {
				t.Errorf("reservations tracked (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantShown, s.CreatingShown, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("CreatingShown (-want +got):\n%s", diff)
			}
			if want := tt.asked == "n-gpu2"; reserved["n-gpu2"] != want {
				t.Errorf("n-gpu2 reserved for fractions: %v, want %v", reserved["n-gpu2"], want)
			}
		})
	}
}

// TestReservationSaysWhetherItsNodeRunsGPUWork: NodeIdle is true only when
// nothing but reservations uses the node's GPUs - not a fraction on
// another reservation, a whole-GPU pod, a pod assumed there, or a MIG
// device - so the reservation manager can let the node go sooner.
func TestReservationSaysWhetherItsNodeRunsGPUWork(t *testing.T) {
	idleRes := reservationOn("n", "n-gpu0")
	tests := []struct {
		name    string
		others  []*corev1.Pod
		assumed map[types.UID]Assumed
		static  bool // the node has no karpenter.sh/nodepool label
		want    bool
	}{
		{name: "nothing else", want: true},
		// Review of issue 16: no autoscaler removes a static node, so a
		// shorter grace there only makes the next fraction wait for a new
		// reservation.
		{name: "nothing else, on a static node", static: true},
		{name: "a second idle reservation", others: []*corev1.Pod{reservationOn("n", "n-gpu1")}, want: true},
		{name: "a CPU-only pod", others: []*corev1.Pod{pod("cpu").on("n").cpu("4").phase(corev1.PodRunning).p}, want: true},
		{name: "a finished whole-GPU pod", others: []*corev1.Pod{pod("done").on("n").gpus(1).phase(corev1.PodSucceeded).p}, want: true},
		{name: "a fraction on another reservation", others: []*corev1.Pod{reservationOn("n", "n-gpu1"),
			pod("f").on("n").fraction(30, "n-gpu1").phase(corev1.PodRunning).p}},
		{name: "a whole-GPU pod", others: []*corev1.Pod{pod("w").on("n").gpus(1).phase(corev1.PodRunning).p}},
		{name: "a whole-GPU pod being bound", others: []*corev1.Pod{pod("a").gpus(1).p},
			assumed: map[types.UID]Assumed{"a": {Node: "n"}}},
		{name: "a MIG device", others: []*corev1.Pod{pod("m").on("n").scalar("nvidia.com/mig-1g.10gb", 1).phase(corev1.PodRunning).p}},
		// Review of issue 16: GPU work in every shape a tenant can write.
		{name: "an init container asking a GPU", others: []*corev1.Pod{pod("i").on("n").initScalar(string(api.ResourceGPU), 1).phase(corev1.PodPending).p}},
		{name: "a time-sliced replica", others: []*corev1.Pod{pod("r").on("n").scalar(shared, 1).phase(corev1.PodRunning).p}},
		{name: "a whole-GPU pod terminating", others: []*corev1.Pod{terminating(pod("t").on("n").gpus(1).phase(corev1.PodRunning).p)}},
		{name: "a whole-GPU pod bound by nodeName, not admitted yet", others: []*corev1.Pod{pod("nn").on("n").gpus(1).p}},
		{name: "a fraction being bound on another GPU", others: []*corev1.Pod{reservationOn("n", "n-gpu1"), pod("fa").fraction(30, "").p},
			assumed: map[types.UID]Assumed{"fa": {Node: "n", GPU: "n-gpu1"}}},
		{name: "a tenant's whole-GPU pod labelled as a reservation", others: []*corev1.Pod{labelled(pod("fake").on("n").gpus(1).phase(corev1.PodRunning).p,
			api.LabelRole, api.RoleReservation)}},
		{name: "a pod with a resource claim", others: []*corev1.Pod{claiming(pod("c").on("n").phase(corev1.PodRunning).p)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, p := range tt.others {
				if p.UID == "" {
					p.UID = types.UID(p.Name)
				}
			}
			n := node("n", 2).inventory("fraction").n
			if tt.static {
				delete(n.Labels, api.LabelNodePool)
			}
			s, err := Build(Inputs{Nodes: []*corev1.Node{n},
				Pods: append([]*corev1.Pod{idleRes}, tt.others...), Assumed: tt.assumed, PoolLabel: api.LabelNodePool})
			if err != nil {
				t.Fatal(err)
			}
			r := s.Reservations[NodeGPU{"n", "n-gpu0"}]
			if r == nil {
				t.Fatalf("reservation missing: %v", s.Reservations)
			}
			if r.NodeIdle != tt.want {
				t.Errorf("NodeIdle = %v, want %v", r.NodeIdle, tt.want)
			}
		})
	}
}

func terminating(p *corev1.Pod) *corev1.Pod {
	now := metav1.Now()
	p.DeletionTimestamp = &now
	return p
}

func labelled(p *corev1.Pod, k, v string) *corev1.Pod {
	p.Labels[k] = v
	return p
}

func claiming(p *corev1.Pod) *corev1.Pod {
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("c-gpu")}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	return p
}
