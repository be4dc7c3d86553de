package pods

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// ledgerRun drives a ledger as Hint does, on a time of its own: no
// informer, no PodResources, no client.
type ledgerRun struct {
	l    *ledger
	pods []*corev1.Pod
	now  time.Time
}

func newLedgerRun(steps ...step) *ledgerRun {
	lr := &ledgerRun{l: newLedger(api.SchedulerName), now: t0}
	for _, s := range steps {
		s(lr)
	}
	return lr
}

func (lr *ledgerRun) reconcile() { lr.l.reconcile(lr.pods, lr.now) }

// slotView is what a test sees of one fraction container's record.
type slotView struct {
	State string
	GPU   string
}

// slotViews returns the record of every fraction container, by "pod/container".
func (l *ledger) slotViews() map[string]slotView {
	out := map[string]slotView{}
	for _, r := range l.order {
		for _, s := range r.slots {
			out[r.pod.Name+"/"+s.container] = slotView{State: s.state.String(), GPU: s.gpu}
		}
	}
	return out
}

// step is one thing the informer, the kubelet or the clock does.
type step func(*ledgerRun)

// seen: the informer shows these pods (and no others).
func seen(pods ...*corev1.Pod) step {
	return func(lr *ledgerRun) {
		lr.pods = pods
		lr.reconcile()
	}
}

// allocated: an Allocate answer of units on gpu, as Hint.Allocated records it.
func allocated(gpu string, units int) step {
	return func(lr *ledgerRun) {
		lr.reconcile()
		lr.l.attribute(answer{gpu: gpu, units: units, at: lr.now})
	}
}

// listed: a PodResources listing, as the write-back reads it.
func listed(as ...Assignment) step {
	return func(lr *ledgerRun) {
		lr.l.setListing(newListing(as))
		lr.reconcile()
	}
}

// after: the clock moves on by d.
func after(d time.Duration) step {
	return func(lr *ledgerRun) {
		lr.now = lr.now.Add(d)
		lr.reconcile()
	}
}

// taken: the whole-GPU resource handed gpu to a reservation.
func taken(gpu string) step {
	return func(lr *ledgerRun) { lr.l.reservationTaken(gpu, lr.now) }
}

// awaited: DevicesAllocated told of ids.
func awaited(ids ...string) step {
	return func(lr *ledgerRun) { lr.l.await(ids, lr.now) }
}

// holdsUnits: container of p holds units fraction units on gpu.
func holdsUnits(p *corev1.Pod, container, gpu string, units int) Assignment {
	a := Assignment{Namespace: p.Namespace, Pod: p.Name, Container: container, Resource: api.ResourceFraction}
	for k := range units {
		a.DeviceIDs = append(a.DeviceIDs, resource.UnitID(gpu, k))
	}
	return a
}

// holdsGPUs: container of p holds the whole devices ids.
func holdsGPUs(p *corev1.Pod, container string, ids ...string) Assignment {
	return Assignment{Namespace: p.Namespace, Pod: p.Name, Container: container, Resource: api.ResourceGPU, DeviceIDs: ids}
}

func reservationPod(name, gpu string) *podBuilder {
	return makePod(api.ReservationNamespace, api.ReservationNamePrefix+name).whole("hold", 1).gpu(gpu)
}

func TestLedgerRecords(t *testing.T) {
	old := func() *podBuilder { return makePod("default", "old").fraction("main", 30).gpu(gpuA).age(time.Hour) }
	young := func() *podBuilder { return makePod("default", "young").fraction("main", 30).gpu(gpuB) }
	tests := []struct {
		name             string
		steps            []step
		want             map[string]slotView // "pod/container" -> record
		wantUnattributed int
	}{
		{
			name:  "a new pod's fraction container waits",
			steps: []step{seen(old().obj())},
			want:  map[string]slotView{"old/main": {"waiting", ""}},
		},
		{
			name:  "waiting -> answered: the answer is recorded with its GPU",
			steps: []step{seen(old().obj()), allocated(gpuA, 30)},
			want:  map[string]slotView{"old/main": {"answered", gpuA}},
		},
		{
			name:  "answered -> admitted: the listing confirms the answer",
			steps: []step{seen(old().obj()), allocated(gpuA, 30), listed(holdsUnits(old().obj(), "main", gpuA, 30))},
			want:  map[string]slotView{"old/main": {"admitted", gpuA}},
		},
		{
			name:  "answered -> admitted by the phase: the answer's GPU is kept",
			steps: []step{seen(old().obj()), allocated(gpuC, 30), seen(old().phase(corev1.PodRunning).obj())},
			want:  map[string]slotView{"old/main": {"admitted", gpuC}},
		},
		{
			name:  "waiting -> admitted by the allocated-gpu write-back",
			steps: []step{seen(old().annotate(api.AnnotationAllocatedGPU, gpuB).obj())},
			want:  map[string]slotView{"old/main": {"admitted", gpuB}},
		},
		{
			name:  "an answer goes to the container planned on its GPU, not the oldest",
			steps: []step{seen(old().obj(), young().obj()), allocated(gpuB, 30)},
			want:  map[string]slotView{"old/main": {"waiting", ""}, "young/main": {"answered", gpuB}},
		},
		{
			name:  "none planned on its GPU: the oldest waiting container with a plan",
			steps: []step{seen(old().obj(), young().obj()), allocated(gpuC, 30)},
			want:  map[string]slotView{"old/main": {"answered", gpuC}, "young/main": {"waiting", ""}},
		},
		{
			name: "a planned container before an older one without a plan",
			steps: []step{seen(makePod("default", "other").fraction("main", 30).scheduler("default-scheduler").age(2*time.Hour).obj(),
				young().obj()), allocated(gpuC, 30)},
			want: map[string]slotView{"other/main": {"waiting", ""}, "young/main": {"answered", gpuC}},
		},
		{
			name: "no plan at all: the oldest waiting container",
			steps: []step{seen(makePod("default", "a").fraction("main", 30).scheduler("x").age(time.Minute).obj(),
				makePod("default", "b").fraction("main", 30).scheduler("x").age(time.Hour).obj()), allocated(gpuC, 30)},
			want: map[string]slotView{"a/main": {"waiting", ""}, "b/main": {"answered", gpuC}},
		},
		{
			name:  "an answer of another size is nobody's",
			steps: []step{seen(old().obj()), allocated(gpuA, 50)},
			want:  map[string]slotView{"old/main": {"waiting", ""}}, wantUnattributed: 1,
		},
		{
			name: "the listing moves the answer to the container that got it",
			steps: []step{seen(old().obj(), young().obj()), allocated(gpuA, 30),
				listed(holdsUnits(young().obj(), "main", gpuA, 30))},
			want: map[string]slotView{"old/main": {"waiting", ""}, "young/main": {"admitted", gpuA}},
		},
		{
			name: "two answers swap owners when the listing says so",
			steps: []step{seen(old().obj(), young().obj()), allocated(gpuA, 30), allocated(gpuB, 30),
				listed(holdsUnits(young().obj(), "main", gpuA, 30))},
			want: map[string]slotView{"old/main": {"answered", gpuB}, "young/main": {"admitted", gpuA}},
		},
		{
			name: "a listed container whose own answer named another GPU hands that answer on",
			steps: []step{seen(old().obj(), young().obj()), allocated(gpuB, 30),
				listed(holdsUnits(young().obj(), "main", gpuC, 30))},
			want: map[string]slotView{"old/main": {"answered", gpuB}, "young/main": {"admitted", gpuC}},
		},
		{
			name:  "an answer before its pod is known waits, then finds the pod",
			steps: []step{seen(), allocated(gpuA, 30), seen(old().obj())},
			want:  map[string]slotView{"old/main": {"answered", gpuA}},
		},
		{
			name:             "an answer before its pod is known stays unattributed",
			steps:            []step{seen(), allocated(gpuA, 30)},
			want:             map[string]slotView{},
			wantUnattributed: 1,
		},
		{
			name:  "an unconfirmed answer expires after inflightTTL",
			steps: []step{seen(old().obj()), allocated(gpuA, 30), after(inflightTTL)},
			want:  map[string]slotView{"old/main": {"waiting", ""}},
		},
		{
			name:  "an unconfirmed answer holds until just before inflightTTL",
			steps: []step{seen(old().obj()), allocated(gpuA, 30), after(inflightTTL - time.Nanosecond)},
			want:  map[string]slotView{"old/main": {"answered", gpuA}},
		},
		{
			name:             "an unattributed answer expires too",
			steps:            []step{seen(), allocated(gpuA, 30), after(inflightTTL)},
			want:             map[string]slotView{},
			wantUnattributed: 0,
		},
		{
			name:  "a terminated pod takes no answer",
			steps: []step{seen(old().phase(corev1.PodSucceeded).obj(), young().obj()), allocated(gpuA, 30)},
			want:  map[string]slotView{"old/main": {"waiting", ""}, "young/main": {"answered", gpuA}},
		},
		{
			name:  "a pod gone from the informer loses its record and its answer",
			steps: []step{seen(old().obj()), allocated(gpuA, 30), seen()},
			want:  map[string]slotView{},
		},
		{
			name: "a pod created again under its name is a new record",
			steps: []step{seen(old().obj()), allocated(gpuA, 30), seen(func() *corev1.Pod {
				p := old().obj()
				p.UID = types.UID("second-incarnation")
				return p
			}())},
			want: map[string]slotView{"old/main": {"waiting", ""}},
		},
		{
			name:  "two same-size containers of one pod are two records",
			steps: []step{seen(makePod("default", "p").fraction("a", 30).fraction("b", 30).gpu(gpuA).obj()), allocated(gpuA, 30)},
			want:  map[string]slotView{"p/a": {"answered", gpuA}, "p/b": {"waiting", ""}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := newLedgerRun(tt.steps...)
			if diff := cmp.Diff(tt.want, lr.l.slotViews()); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if got := len(lr.l.unattributed); got != tt.wantUnattributed {
				t.Errorf("%d answers unattributed, want %d", got, tt.wantUnattributed)
			}
		})
	}
}

func TestLedgerGPUFor(t *testing.T) {
	type result struct {
		GPU        string
		OK, Unseen bool
	}
	tests := []struct {
		name  string
		steps []step
		units int
		want  result
	}{
		{
			name:  "nothing waits: unseen, the informer may lag",
			steps: []step{seen()},
			units: 30,
			want:  result{Unseen: true},
		},
		{
			name:  "the oldest waiting planned container's GPU",
			steps: []step{seen(makePod("default", "a").fraction("main", 30).gpu(gpuA).obj(), makePod("default", "b").fraction("main", 30).gpu(gpuB).age(time.Hour).obj())},
			units: 30,
			want:  result{GPU: gpuB, OK: true},
		},
		{
			name:  "a waiting container without a plan: no hint, and not unseen",
			steps: []step{seen(makePod("default", "a").fraction("main", 30).scheduler("x").obj())},
			units: 30,
			want:  result{},
		},
		{
			name:  "an init container of the size waits: not unseen",
			steps: []step{seen(makePod("default", "a").initFraction("setup", 30).plain("main").obj())},
			units: 30,
			want:  result{},
		},
		{
			name: "an answer in flight serves the pod planned on its GPU",
			steps: []step{seen(makePod("default", "a").fraction("main", 30).gpu(gpuA).age(time.Hour).obj(),
				makePod("default", "b").fraction("main", 30).gpu(gpuB).obj()), allocated(gpuA, 30)},
			units: 30,
			want:  result{GPU: gpuB, OK: true},
		},
		{
			name: "unattributed answers cover the waiting containers: unseen",
			steps: []step{seen(), allocated(gpuA, 30), seen(makePod("default", "a").fraction("main", 30).gpu(gpuA).obj()),
				allocated(gpuB, 30)},
			units: 30,
			want:  result{Unseen: true},
		},
		{
			name: "admitted elsewhere: the planned GPU still lacks its fraction",
			steps: []step{seen(makePod("default", "a").fraction("main", 30).gpu(gpuA).age(time.Hour).annotate(api.AnnotationAllocatedGPU, gpuB).obj(),
				makePod("default", "b").fraction("main", 30).gpu(gpuB).obj())},
			units: 30,
			want:  result{GPU: gpuA, OK: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := newLedgerRun(tt.steps...)
			var got result
			got.GPU, got.OK, got.Unseen = lr.l.gpuFor(tt.units)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("gpuFor(%d) (-want +got):\n%s", tt.units, diff)
			}
		})
	}
}

func TestLedgerRefusesInitContainerFractions(t *testing.T) {
	initPod := func() *podBuilder { return makePod("tenant", "init-frac").initFraction("setup", 20).plain("main") }
	tests := []struct {
		name    string
		pods    []*corev1.Pod
		units   int
		wantPod string // the pod the refusal names; "" for none
	}{
		{name: "a waiting pod asks the size in an init container", pods: []*corev1.Pod{initPod().obj()}, units: 20, wantPod: "tenant/init-frac"},
		{name: "refused beside an app container of the size (fail closed)",
			pods:  []*corev1.Pod{initPod().obj(), makePod("team", "app").fraction("main", 20).gpu(gpuA).obj()},
			units: 20, wantPod: "tenant/init-frac"},
		{name: "another size", pods: []*corev1.Pod{initPod().obj()}, units: 10},
		{name: "the pod runs: its init containers are past", pods: []*corev1.Pod{initPod().phase(corev1.PodRunning).obj()}, units: 20},
		{name: "the pod ended", pods: []*corev1.Pod{initPod().phase(corev1.PodFailed).obj()}, units: 20},
		{name: "an app container of the size alone", pods: []*corev1.Pod{makePod("team", "app").fraction("main", 20).obj()}, units: 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := newLedgerRun(seen(tt.pods...))
			err := lr.l.refusal(tt.units)
			if tt.wantPod == "" {
				if err != nil {
					t.Errorf("refusal(%d) = %v, want nil", tt.units, err)
				}
				return
			}
			if !errors.Is(err, ErrInitContainerFraction) || !strings.Contains(err.Error(), tt.wantPod) {
				t.Errorf("refusal(%d) = %v, want ErrInitContainerFraction naming %s", tt.units, err, tt.wantPod)
			}
		})
	}
}

func TestLedgerReservationHandOver(t *testing.T) {
	older := func() *podBuilder { return reservationPod("n-1", gpuB).age(time.Hour) }
	newer := func() *podBuilder { return reservationPod("n-2", gpuA) }
	tests := []struct {
		name  string
		steps []step
		want  string // the GPU the waiting reservation asks for; "" for none
	}{
		{name: "the oldest waiting reservation", steps: []step{seen(newer().obj(), older().obj())}, want: gpuB},
		{name: "handed its GPU: the next one", steps: []step{seen(newer().obj(), older().obj()), taken(gpuB)}, want: gpuA},
		{name: "handed its GPU: skipped until just before reservationTakenTTL",
			steps: []step{seen(older().obj()), taken(gpuB), after(reservationTakenTTL - time.Nanosecond)}, want: ""},
		{name: "handed its GPU: asked about again after reservationTakenTTL",
			steps: []step{seen(older().obj()), taken(gpuB), after(reservationTakenTTL)}, want: gpuB},
		{name: "listed holding a GPU: no longer waiting",
			steps: []step{seen(older().obj()), listed(holdsGPUs(older().obj(), "hold", gpuB))}, want: ""},
		{name: "carrying reserved-gpu: no longer waiting",
			steps: []step{seen(older().annotate(api.AnnotationReservedGPU, gpuB).obj())}, want: ""},
		{name: "started: no longer waiting", steps: []step{seen(older().phase(corev1.PodRunning).obj())}, want: ""},
		{name: "without a GPU to ask for", steps: []step{seen(makePod(api.ReservationNamespace, api.ReservationNamePrefix+"x").whole("hold", 1).obj())}, want: ""},
		{name: "a reservation's name outside the reservation namespace is none",
			steps: []step{seen(makePod("tenant", api.ReservationNamePrefix+"x").whole("hold", 1).gpu(gpuA).obj())}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := newLedgerRun(tt.steps...)
			got := ""
			if r := lr.l.waitingReservation("", lr.now); r != nil {
				got = r.planned
			}
			if got != tt.want {
				t.Errorf("waitingReservation() asks for %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLedgerReservationOnly(t *testing.T) {
	res := func() *podBuilder { return reservationPod("n-3", gpuA) }
	trainer := func() *podBuilder { return makePod("tenant", "trainer").whole("main", 1) }
	type result struct {
		Only, Unsure bool
		Blocker      string
	}
	tests := []struct {
		name  string
		steps []step
		gpu   string
		want  result
	}{
		{name: "the reservation alone", steps: []step{seen(res().obj())}, gpu: gpuA, want: result{Only: true}},
		{name: "another GPU", steps: []step{seen(res().obj())}, gpu: gpuB, want: result{}},
		{name: "a whole-GPU pod waits beside it", steps: []step{seen(res().obj(), trainer().obj())}, gpu: gpuA,
			want: result{Blocker: "trainer"}},
		{name: "a whole-GPU pod listed holding GPUs does not count",
			steps: []step{seen(res().obj(), trainer().obj()), listed(holdsGPUs(trainer().obj(), "main", gpuB))}, gpu: gpuA,
			want: result{Only: true}},
		{name: "a waiting whole-GPU pod claiming allocated-gpu the listing does not show: unsure",
			steps: []step{seen(res().obj(), trainer().annotate(api.AnnotationAllocatedGPU, gpuB).obj())}, gpu: gpuA,
			want: result{Unsure: true}},
		{name: "the reservation already holds its GPU",
			steps: []step{seen(res().annotate(api.AnnotationReservedGPU, gpuA).obj())}, gpu: gpuA, want: result{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := newLedgerRun(tt.steps...)
			var got result
			var blocker *corev1.Pod
			got.Only, got.Unsure, blocker = lr.l.reservationOnly(tt.gpu)
			if blocker != nil {
				got.Blocker = blocker.Name
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("reservationOnly(%s) (-want +got):\n%s", tt.gpu, diff)
			}
		})
	}
}

func TestLedgerWrites(t *testing.T) {
	frac := func() *podBuilder { return makePod("default", "frac").fraction("main", 30).gpu(gpuA) }
	res := func() *podBuilder { return reservationPod("one", gpuA) }
	trainer := func() *podBuilder { return makePod("default", "trainer").whole("b", 1).whole("a", 2) }
	mixed := func() *podBuilder { return makePod("default", "mixed").whole("main", 1).fraction("side", 20) }
	// sent marks every write as patched, as the write-back does on success.
	sent := func(lr *ledgerRun) {
		for _, w := range lr.l.writes() {
			lr.l.markSent(w)
		}
	}
	rv := func(b *podBuilder, v string) *podBuilder { b.p.ResourceVersion = v; return b }
	tests := []struct {
		name  string
		steps []step
		want  map[string]map[string]string // "namespace/name" -> annotations to set
	}{
		{name: "nothing listed: nothing to write", steps: []step{seen(frac().obj(), res().obj())}, want: map[string]map[string]string{}},
		{name: "a fraction pod: the GPU of its units",
			steps: []step{seen(frac().obj()), listed(holdsUnits(frac().obj(), "main", gpuB, 30))},
			want:  map[string]map[string]string{"default/frac": {api.AnnotationAllocatedGPU: gpuB}}},
		{name: "a reservation: reserved-gpu, not allocated-gpu",
			steps: []step{seen(res().obj()), listed(holdsGPUs(res().obj(), "hold", gpuA))},
			want:  map[string]map[string]string{api.ReservationNamespace + "/" + api.ReservationNamePrefix + "one": {api.AnnotationReservedGPU: gpuA}}},
		{name: "a reservation holding two GPUs: nothing",
			steps: []step{seen(res().obj()), listed(holdsGPUs(res().obj(), "hold", gpuA, gpuB))},
			want:  map[string]map[string]string{}},
		{name: "a whole-GPU pod: every container's GPUs, sorted",
			steps: []step{seen(trainer().obj()), listed(holdsGPUs(trainer().obj(), "b", gpuC), holdsGPUs(trainer().obj(), "a", gpuB, gpuA))},
			want:  map[string]map[string]string{"default/trainer": {api.AnnotationAllocatedGPU: gpuA + "," + gpuB + "," + gpuC}}},
		{name: "a pod with a fraction and whole GPUs keeps its fraction's GPU",
			steps: []step{seen(mixed().obj()), listed(holdsGPUs(mixed().obj(), "main", gpuA), holdsUnits(mixed().obj(), "side", gpuB, 20))},
			want:  map[string]map[string]string{"default/mixed": {api.AnnotationAllocatedGPU: gpuB}}},
		{name: "already on the pod: nothing",
			steps: []step{seen(frac().annotate(api.AnnotationAllocatedGPU, gpuB).obj()), listed(holdsUnits(frac().obj(), "main", gpuB, 30))},
			want:  map[string]map[string]string{}},
		{name: "sent, and the informer still shows the pod as it was: nothing",
			steps: []step{seen(rv(frac(), "1").obj()), listed(holdsUnits(frac().obj(), "main", gpuB, 30)), sent},
			want:  map[string]map[string]string{}},
		{name: "sent, and the pod changed without it: again",
			steps: []step{seen(rv(frac(), "1").obj()), listed(holdsUnits(frac().obj(), "main", gpuB, 30)), sent, seen(rv(frac(), "2").obj())},
			want:  map[string]map[string]string{"default/frac": {api.AnnotationAllocatedGPU: gpuB}}},
		{name: "a listed pod the informer does not show: nothing",
			steps: []step{seen(), listed(holdsUnits(frac().obj(), "main", gpuB, 30))},
			want:  map[string]map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := newLedgerRun(tt.steps...)
			got := map[string]map[string]string{}
			for _, w := range lr.l.writes() {
				got[w.pod.Namespace+"/"+w.pod.Name] = w.anns
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLedgerPending(t *testing.T) {
	const span = time.Second
	p := func() *podBuilder { return makePod("default", "p").fraction("main", 30).gpu(gpuA) }
	trainer := func() *podBuilder { return makePod("default", "trainer").whole("main", 1) }
	tests := []struct {
		name        string
		steps       []step
		want        bool
		wantAwaited int // awaited allocations kept
	}{
		{name: "nothing told: not pending", steps: []step{seen(p().obj()), listed()}, want: false},
		{name: "an answer not confirmed", steps: []step{seen(p().obj()), allocated(gpuA, 30), listed()}, want: true},
		{name: "an answer confirmed", steps: []step{seen(p().obj()), allocated(gpuA, 30), listed(holdsUnits(p().obj(), "main", gpuA, 30))}, want: false},
		{name: "an unattributed answer", steps: []step{seen(), allocated(gpuA, 30), listed()}, want: true},
		{name: "awaited devices not listed", steps: []step{seen(trainer().obj()), awaited(gpuA), listed()}, want: true, wantAwaited: 1},
		{name: "awaited devices listed are forgotten",
			steps: []step{seen(trainer().obj()), awaited(gpuA), listed(holdsGPUs(trainer().obj(), "main", gpuA))}, want: false},
		{name: "awaited devices older than the burst are forgotten",
			steps: []step{seen(trainer().obj()), awaited(gpuA), listed(), after(span + time.Nanosecond)}, want: false},
		{name: "a listed pod the informer does not show yet", steps: []step{seen(), listed(holdsGPUs(trainer().obj(), "main", gpuA))}, want: true},
		{name: "a listed fraction of a pod the informer does not show yet", steps: []step{seen(), listed(holdsUnits(p().obj(), "main", gpuA, 30))}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lr := newLedgerRun(tt.steps...)
			if got := lr.l.pending(lr.now, span); got != tt.want {
				t.Errorf("pending() = %t, want %t", got, tt.want)
			}
			if got := len(lr.l.awaited); got != tt.wantAwaited {
				t.Errorf("%d awaited allocations kept, want %d", got, tt.wantAwaited)
			}
		})
	}
}
