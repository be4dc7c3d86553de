package scheduler

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/coordinator/state"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// boundView is what readBound gave a cycle, in a form two reads compare by.
type boundView struct {
	usage  map[string][2]queue.Resources // queue -> used, used non-preemptible
	demand map[demandKey]int
	placed map[string]int    // gangID -> members placed
	pool   map[string]string // gangID -> pool
	census map[string]string // gangID -> its census, printed
	// unbound and holders are the pods collect reads: not shown bound, and placeholders.
	unbound, holders []string
	// live are the censuses' live members, the objects a rollback evicts
	// (not compared: a fresh read holds the same objects).
	live []*corev1.Pod
}

// readBoundView runs readBound over pods, as a cycle does, on books of queues.
func readBoundView(t *testing.T, s *Scheduler, pods []*corev1.Pod, assumed map[types.UID]state.Assumed, queues []*v1alpha1.Queue) boundView {
	t.Helper()
	b, err := newBooks(queues, nil)
	if err != nil {
		t.Fatal(err)
	}
	demand, gangs, err := s.readBound(nil, func() ([]*corev1.Pod, error) { return pods, nil }, assumed, b)
	if err != nil {
		t.Fatal(err)
	}
	v := boundView{usage: map[string][2]queue.Resources{}, demand: map[demandKey]int{}, placed: gangs.bound, pool: gangs.pool, census: map[string]string{}}
	for _, q := range queues {
		if used, np, ok := b.tree.Usage(q.Name); ok {
			v.usage[q.Name] = [2]queue.Resources{used, np}
		}
	}
	for _, d := range demand {
		v.demand[demandKeyOf(&d.req)] += d.n
	}
	for _, p := range s.bound.unbound {
		v.unbound = append(v.unbound, p.Name+"@"+p.ResourceVersion)
	}
	slices.Sort(v.unbound)
	for _, p := range s.bound.placeholders() {
		v.holders = append(v.holders, p.Name+"@"+p.ResourceVersion)
	}
	for id, c := range gangs.census {
		var live []string
		for _, p := range c.live {
			live = append(live, p.Name)
		}
		slices.Sort(live)
		v.live = append(v.live, c.live...)
		v.census[id] = fmt.Sprintf("%s min=%d held=%d ran=%d inflight=%d live=%v", c.name, c.min, c.held, c.ran, c.inflight, live)
	}
	return v
}

// TestBoundLedgerMatchesAFreshReadThroughChurn: the ledger, kept up to date
// by the pod informer's events, charges the queues, weighs the demand and
// counts the gangs as a ledger read afresh from the same pods does, through
// pods made, bound, finished, deleted, made again under their name and
// changed by their authors, with pods being bound beside them, and nodes
// that move to another pool, go and come back under the gangs' members.
func TestBoundLedgerMatchesAFreshReadThroughChurn(t *testing.T) {
	nodes := []*corev1.Node{h100Node("n0", "a", 8), h100Node("n1", "a", 8), h100Node("n2", "b", 8)}
	queues := []*v1alpha1.Queue{queueOf("q1", "16"), queueOf("q2", "16")}
	for seed := range 10 {
		t.Run(strconv.Itoa(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 27))
			// The namespace's default queue changes under its pods without a
			// pod event: the parts that read it are read every cycle.
			namespaces, setDefaultQueue := defaultNamespace("q1")
			c := newClusterWith(t, Options{BindWorkers: 1}, Deps{Queues: staticQueues(queues), Namespaces: namespaces}, nodes)
			s := c.s
			rv, uid := 0, 0
			names := []string{}
			assumed := map[types.UID]state.Assumed{}
			// A pod as its author or a binding leaves it: each change is a new object.
			makePod := func(name string) *corev1.Pod {
				uid++
				ns := "default"
				holder := rng.IntN(8) == 0
				if holder {
					ns = api.ReservationNamespace
				}
				w := builders.MakePod(name, ns).UID(fmt.Sprintf("%s-%d", name, uid)).CPU("1")
				switch rng.IntN(3) {
				case 0:
					w = w.GPUs(1 + rng.IntN(2))
				case 1:
					w = w.Fraction(10 * (1 + rng.IntN(9)))
				}
				if rng.IntN(4) > 0 {
					w = w.Queue([]string{"q1", "q2"}[rng.IntN(2)])
				}
				if rng.IntN(3) == 0 {
					w = w.PodGroup("g" + strconv.Itoa(rng.IntN(3))).MinMember(2)
				}
				if rng.IntN(5) == 0 {
					w = w.SchedulerName("default-scheduler")
				}
				if rng.IntN(4) == 0 {
					w = w.GPUModels("NVIDIA-H100-80GB-HBM3")
				}
				if holder {
					w = w.SchedulerName(placeholder.SchedulerName).Label(api.LabelRole, api.RolePlaceholder).
						Label(placeholder.LabelGroup, "grp").Annotation(placeholder.AnnotationWorkloads, "q1|default/p0")
				}
				return w.Obj()
			}
			bind := func(p *corev1.Pod) {
				p.Spec.NodeName = nodes[rng.IntN(len(nodes))].Name
				if q := p.Labels[api.LabelQueue]; q != "" && p.Spec.SchedulerName == s.opts.SchedulerName {
					p.Annotations = withKey(p.Annotations, api.AnnotationAdmittedQueue, q)
					if g := p.Labels[api.LabelPodGroup]; g != "" && rng.IntN(2) == 0 {
						p.Annotations = withKey(p.Annotations, api.AnnotationAdmittedGang, g)
					}
				}
			}
			for step := range 250 {
				if rng.IntN(12) == 0 {
					// The nodes change under the gangs' members, without a
					// pod event: one moves to another pool, goes (a spot
					// node reclaimed, its pods left) or comes back.
					n := nodes[rng.IntN(len(nodes))]
					if _, shown, _ := c.nodes.Get(n); !shown {
						_ = c.nodes.Add(n)
					} else if rng.IntN(2) == 0 {
						_ = c.nodes.Delete(n)
					} else {
						moved := n.DeepCopy()
						moved.Labels[api.LabelNodePool] = []string{"a", "b", "c"}[rng.IntN(3)]
						_ = c.nodes.Update(moved)
					}
				}
				pods := c.pods.List()
				var cur *corev1.Pod
				if len(pods) > 0 {
					cur = pods[rng.IntN(len(pods))].(*corev1.Pod)
				}
				var next *corev1.Pod
				switch op := rng.IntN(10); {
				case op < 3 || cur == nil:
					name := fmt.Sprintf("p%d", len(names))
					names = append(names, name)
					next = makePod(name)
					if rng.IntN(2) == 0 {
						bind(next)
					}
				case op == 3:
					_ = c.pods.Delete(cur)
					delete(assumed, cur.UID)
				case op == 4:
					next = makePod(cur.Name) // made again under its name
				case op == 5 && cur.Spec.NodeName == "":
					next = cur.DeepCopy()
					bind(next)
				case op == 6:
					next = cur.DeepCopy()
					next.Status.Phase = []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed, corev1.PodRunning}[rng.IntN(3)]
				case op == 7:
					next = cur.DeepCopy()
					now := metav1.NewTime(time.Unix(int64(step), 0))
					next.DeletionTimestamp = &now
				case op == 8:
					// The author edits what is theirs after admission.
					next = cur.DeepCopy()
					next.Labels = withKey(next.Labels, api.LabelQueue, []string{"q1", "q2", "gone"}[rng.IntN(3)])
					next.Annotations = withKey(next.Annotations, api.AnnotationMinMember, strconv.Itoa(rng.IntN(4)))
				case op == 9 && rng.IntN(3) == 0:
					setDefaultQueue([]string{"q1", "q2", ""}[rng.IntN(3)])
				default:
					if cur.Spec.NodeName == "" && cur.Spec.SchedulerName == s.opts.SchedulerName {
						assumed[cur.UID] = state.Assumed{Node: nodes[rng.IntN(len(nodes))].Name}
					} else {
						next = cur.DeepCopy() // a resync: an equal object
					}
				}
				if next != nil {
					if rng.IntN(8) > 0 {
						rv++
						next.ResourceVersion = strconv.Itoa(rv) // kept by object, as informers' pods are
					}
					_ = c.pods.Update(next)
				}
				if step%3 != 0 {
					continue
				}
				list, _ := s.deps.Pods.List(labels.Everything())
				s.beginParses()
				got := readBoundView(t, s, list, assumed, queues)
				// It holds the informer's objects, not equal older ones.
				for _, held := range [][]*corev1.Pod{podsOfParts(s.bound.parts), slices.Collect(maps.Values(s.bound.unbound))} {
					for _, p := range held {
						if obj, ok, _ := c.pods.Get(p); !ok || obj.(*corev1.Pod) != p {
							t.Fatalf("step %d: the ledger holds an object of %s the informer replaced", step, p.Name)
						}
					}
				}
				// A rollback evicts the informer's objects, not older equal ones.
				for _, p := range got.live {
					if obj, ok, _ := c.pods.Get(p); !ok || obj.(*corev1.Pod) != p {
						t.Fatalf("step %d: a gang's census holds an object of %s the informer replaced", step, p.Name)
					}
				}
				kept := s.bound
				s.bound = newBoundLedger()
				want := readBoundView(t, s, list, assumed, queues)
				s.bound = kept
				got.live, want.live = nil, nil
				s.sweepParses()
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: the ledger read\n%+v\nread afresh\n%+v", step, got, want)
				}
			}
		})
	}
}

// admittedPod is a pod of queue q bound to node n by this scheduler, as an
// informer hands it out.
func admittedPod(name string) *corev1.Pod {
	p := builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("1").UID(name).Node("n").
		Annotation(api.AnnotationAdmittedQueue, "q").Obj()
	p.ResourceVersion = "1"
	return p
}

// defaultNamespace is a lister of namespace "default" naming queue as its
// default, and a func that names another (no pod event shows it).
func defaultNamespace(queue string) (corelisters.NamespaceLister, func(queue string)) {
	store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	set := func(q string) {
		_ = store.Update(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{api.LabelDefaultQueue: q}}})
	}
	set(queue)
	return corelisters.NewNamespaceLister(store), set
}

// withKey is m with k set to v (m copied, as a new object's map).
func withKey(m map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for a, b := range m {
		out[a] = b
	}
	out[k] = v
	return out
}

// TestBoundLedgerReadsOnlyWhatMoved: a cycle after which no pod event came
// reads no pod again; an event on one pod reads that pod; pods whose part
// depends on more than their object are read every cycle.
func TestBoundLedgerReadsOnlyWhatMoved(t *testing.T) {
	a, b := admittedPod("a"), admittedPod("b")
	noRV := admittedPod("hand-made")
	noRV.ResourceVersion = "" // not kept: read every cycle
	c := newCluster(t, "", []*corev1.Node{h100Node("n", "p", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, a, b, noRV)
	s := c.s
	read := func() []string {
		list, _ := s.deps.Pods.List(labels.Everything())
		s.beginParses()
		before := s.parses.cycle
		_ = readBoundView(t, s, list, nil, []*v1alpha1.Queue{queueOf("q", "8")})
		var out []string
		for p, e := range s.parses.entries {
			if e.cycle == before {
				out = append(out, p.Name)
			}
		}
		s.sweepParses()
		slices.Sort(out)
		return out
	}
	if got := read(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("first cycle read %v, want every pod kept [a b] (and the hand-made one afresh)", got)
	}
	if got := read(); len(got) != 0 {
		t.Errorf("a cycle without events read %v again, want none", got)
	}
	a2 := a.DeepCopy()
	a2.ResourceVersion = "2"
	a2.Labels = withKey(a2.Labels, "x", "y")
	_ = c.pods.Update(a2)
	if got := read(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("after an event on a, the cycle read %v, want [a]", got)
	}
	if n := len(s.bound.volatile); n != 1 || s.bound.volatile[noRV.UID] == nil {
		t.Errorf("volatile parts: %v, want the hand-made pod's alone", s.bound.volatile)
	}
}

// readOnce is one cycle's readBound of the listed pods, as the cycle runs it.
func readOnce(t *testing.T, c *cluster, list []*corev1.Pod, assumed map[types.UID]state.Assumed, queues []*v1alpha1.Queue) boundView {
	t.Helper()
	if list == nil {
		list, _ = c.s.deps.Pods.List(labels.Everything())
	}
	c.s.beginParses()
	defer c.s.sweepParses()
	return readBoundView(t, c.s, list, assumed, queues)
}

// TestBoundLedgerRereadsWhatItsEventsDoNotShow: a bound pod without a queue
// label is read with its namespace's default queue, which changes with no
// event on the pod: its part is read again every cycle. Its GPU models count
// in its demand only while its parse has a queue.
func TestBoundLedgerRereadsWhatItsEventsDoNotShow(t *testing.T) {
	namespaces, setDefaultQueue := defaultNamespace("q")
	queues := []*v1alpha1.Queue{queueOf("q", "8")}
	p := builders.MakePod("p", "default").GPUs(1).CPU("1").UID("p").Node("n").GPUModels("NVIDIA-H100-80GB-HBM3").Obj()
	p.ResourceVersion = "1"
	c := newClusterWith(t, Options{BindWorkers: 1}, Deps{Queues: staticQueues(queues), Namespaces: namespaces},
		[]*corev1.Node{h100Node("n", "p", 8)}, p)
	c.cycle() // the GPU models the parses check the pod's against
	models := func(v boundView) []string {
		var out []string
		for k, n := range v.demand {
			if n > 0 {
				out = append(out, k.models)
			}
		}
		return out
	}
	if got := models(readOnce(t, c, nil, nil, queues)); !slices.Equal(got, []string{"NVIDIA-H100-80GB-HBM3"}) {
		t.Fatalf("with a default queue the demand's models are %q, want the pod's", got)
	}
	setDefaultQueue("")
	if got := models(readOnce(t, c, nil, nil, queues)); !slices.Equal(got, []string{""}) {
		t.Errorf("without a default queue the demand's models are %q, want none (the plain request)", got)
	}
	setDefaultQueue("q")
	if got := models(readOnce(t, c, nil, nil, queues)); !slices.Equal(got, []string{"NVIDIA-H100-80GB-HBM3"}) {
		t.Errorf("with the default queue back the demand's models are %q, want the pod's", got)
	}
}

// TestBoundLedgerKeepsTheEventsOfARebuiltCycle: when the parse inputs change
// within a cycle (the snapshot tells new GPU models), readBound runs again
// and reads every pod afresh. A pod deleted after the cycle listed the pods,
// whose deletion the first run took, stays gone: the rebuild reads the
// ledger's own objects, not the older list.
func TestBoundLedgerKeepsTheEventsOfARebuiltCycle(t *testing.T) {
	queues := []*v1alpha1.Queue{queueOf("q", "8")}
	a, b := admittedPod("a"), admittedPod("b")
	c := newCluster(t, "", []*corev1.Node{h100Node("n", "p", 8)}, queues, a, b)
	if got := readOnce(t, c, nil, nil, queues).usage["q"][0].GPUMilli; got != 2000 {
		t.Fatalf("queue q charged %d milli-GPU, want 2000", got)
	}
	list, _ := c.s.deps.Pods.List(labels.Everything()) // the cycle's list: a and b
	_ = c.pods.Delete(b)
	c.s.beginParses()
	first := readBoundView(t, c.s, list, nil, queues)
	c.s.parses.gen++ // the snapshot told new parse inputs
	again := readBoundView(t, c.s, list, nil, queues)
	c.s.sweepParses()
	for name, v := range map[string]boundView{"first": first, "again": again} {
		if got := v.usage["q"][0].GPUMilli; got != 1000 {
			t.Errorf("%s run: queue q charged %d milli-GPU, want 1000 (b is deleted)", name, got)
		}
	}
}

// TestPodBeingBoundCountsOnceWhateverTheEventsShow: a pod being bound counts
// once, as bound or as being bound, whether or not the informer's handlers
// have seen its binding, which its lister may show first.
func TestPodBeingBoundCountsOnceWhateverTheEventsShow(t *testing.T) {
	queues := []*v1alpha1.Queue{queueOf("q", "8")}
	p := builders.MakePod("p", "default").Queue("q").GPUs(1).CPU("1").UID("p").Obj()
	p.ResourceVersion = "1"
	c := newCluster(t, "", []*corev1.Node{h100Node("n", "p", 8)}, queues, p)
	assumed := map[types.UID]state.Assumed{"p": {Node: "n"}}
	charged := func(when string, want int64) {
		t.Helper()
		if got := readOnce(t, c, nil, assumed, queues).usage["q"][0].GPUMilli; got != want {
			t.Errorf("%s: queue q charged %d milli-GPU, want %d", when, got, want)
		}
	}
	charged("being bound", 1000)
	shown := p.DeepCopy()
	shown.ResourceVersion, shown.Spec.NodeName = "2", "n"
	shown.Annotations = withKey(shown.Annotations, api.AnnotationAdmittedQueue, "q")
	_ = c.pods.(*feedStore).Indexer.Update(shown) // the lister shows the binding; no handler has run
	charged("shown bound by the lister alone", 1000)
	c.s.OnPodUpdate(p, shown, true) // the handler catches up
	charged("shown bound", 1000)
	delete(assumed, "p")
	charged("no longer assumed", 1000)

	// A pod being bound whose events no handler has seen at all, listed bound.
	late := builders.MakePod("late", "default").Queue("q").GPUs(1).CPU("1").UID("late").Node("n").
		Annotation(api.AnnotationAdmittedQueue, "q").Obj()
	late.ResourceVersion = "1"
	_ = c.pods.(*feedStore).Indexer.Add(late)
	assumed["late"] = state.Assumed{Node: "n"}
	charged("a pod listed bound before its events", 2000)
	c.s.OnPod(late)
	charged("its events handled", 2000)

	// A pod being bound that the cycle's list shows bound, whose deletion
	// the handlers took before the ledger saw it at all: it counts for the
	// cycle of that list alone, never after.
	gone := builders.MakePod("gone", "default").Queue("q").GPUs(1).CPU("1").UID("gone").Node("n").
		Annotation(api.AnnotationAdmittedQueue, "q").Obj()
	gone.ResourceVersion = "1"
	list, _ := c.s.deps.Pods.List(labels.Everything())
	assumed["gone"] = state.Assumed{Node: "n"}
	c.s.OnPodDelete(gone)
	if got := readOnce(t, c, append(list, gone), assumed, queues).usage["q"][0].GPUMilli; got != 3000 {
		t.Errorf("the cycle whose list shows the deleted pod bound: queue q charged %d milli-GPU, want 3000", got)
	}
	charged("the next cycle, its list without it", 2000)
}

// TestUpdatesThatChangeNothingAreNotTaken: an informer's update that
// changes nothing the scheduler reads (changed false: a heartbeat, a
// container's state) marks no pod for the ledger to read again and wakes
// no cycle; one that changes something does both.
func TestUpdatesThatChangeNothingAreNotTaken(t *testing.T) {
	queues := []*v1alpha1.Queue{queueOf("q", "8")}
	n := h100Node("n", "p", 8)
	p := admittedPod("a")
	c := newCluster(t, "", []*corev1.Node{n}, queues, p)
	if _, err := c.s.Cycle(t.Context()); err != nil {
		t.Fatal(err)
	}
	taken := func() (dirty int, events uint64) {
		d, _ := c.s.bound.takeDirty()
		return len(d), c.s.events.Load()
	}
	_, before := taken()
	p2, n2 := p.DeepCopy(), n.DeepCopy()
	p2.ResourceVersion, n2.ResourceVersion = "7", "7"
	c.s.OnPodUpdate(p, p2, false)
	c.s.OnNodeUpdate(n, n2, false)
	if dirty, events := taken(); dirty != 0 || events != before {
		t.Errorf("updates that change nothing: %d pods to read again, %d wake-ups; want none", dirty, events-before)
	}
	// The ledger holds the new object (reclaim matches the lister's
	// objects with it), read from nothing.
	c.s.OnPodUpdate(p, p2, false)
	_ = c.pods.(*feedStore).Indexer.Update(p2) // the informer's store, without its handler
	parsesBefore := len(c.s.parses.entries)
	if _, err := c.s.Cycle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if part := c.s.bound.parts[p.UID]; part == nil || part.pod != p2 || part.pi.pod != p2 {
		t.Errorf("the ledger does not hold the pod's latest object after an update that changed nothing")
	}
	if len(c.s.parses.entries) > parsesBefore {
		t.Errorf("%d pods parsed again after an update that changed nothing", len(c.s.parses.entries)-parsesBefore)
	}
	p3 := p2.DeepCopy()
	p3.ResourceVersion, p3.Labels = "8", withKey(p3.Labels, "team", "a")
	c.s.OnPodUpdate(p2, p3, true)
	n3 := n2.DeepCopy()
	n3.ResourceVersion, n3.Spec.Unschedulable = "8", true
	c.s.OnNodeUpdate(n2, n3, true)
	if dirty, events := taken(); dirty != 1 || events != before+2 {
		t.Errorf("updates that change something: %d pods to read again, %d wake-ups; want 1 and 2", dirty, events-before)
	}
}

// podsOfParts are the pods of the ledger's parts.
func podsOfParts(parts map[types.UID]*boundPart) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(parts))
	for _, part := range parts {
		out = append(out, part.pod)
	}
	return out
}

// TestPodMadeAgainUnderItsNameForgetsTheOld: an informer may show a pod
// deleted and made again under its name as one update (a relist after
// missed events): the old pod's binding in flight is forgotten, as on its
// deletion, so that it neither counts nor keeps the cluster from idling.
func TestPodMadeAgainUnderItsNameForgetsTheOld(t *testing.T) {
	queues := []*v1alpha1.Queue{queueOf("q", "8")}
	old := gpuPod("p", "q", 1)
	old.ResourceVersion = "1"
	c := newCluster(t, "", []*corev1.Node{h100Node("n", "p", 8)}, queues, old)
	c.s.mu.Lock()
	c.s.assumed[old.UID] = assumedPod{Assumed: state.Assumed{Node: "n"}}
	c.s.mu.Unlock()
	again := gpuPod("p", "q", 1)
	again.UID, again.ResourceVersion = "p-again", "2"
	_ = c.pods.Update(again)
	c.s.mu.Lock()
	_, held := c.s.assumed[old.UID]
	c.s.mu.Unlock()
	if held {
		t.Error("the old pod's binding in flight is still held after it was made again under its name")
	}
}

// TestPodBeingBoundIsReadByName: a pod being bound that the ledger has not
// seen (its events not handled yet) is read from the lister by the name its
// assumption records, not from a list of every pod: counted as being bound,
// or as bound when the lister shows it bound, never when the lister no
// longer has it or has another pod of that name.
func TestPodBeingBoundIsReadByName(t *testing.T) {
	queues := []*v1alpha1.Queue{queueOf("q", "8")}
	c := newCluster(t, "", []*corev1.Node{h100Node("n", "p", 8)}, queues)
	listed := 0
	list := func() ([]*corev1.Pod, error) {
		listed++
		return c.s.deps.Pods.List(labels.Everything())
	}
	charged := func(when string, assumed map[types.UID]state.Assumed, want int64) {
		t.Helper()
		c.s.beginParses()
		books, err := newBooks(queues, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.s.readBound(nil, list, assumed, books); err != nil {
			t.Fatal(err)
		}
		c.s.sweepParses()
		var got int64
		if used, _, ok := books.tree.Usage("q"); ok {
			got = used.GPUMilli
		}
		if got != want {
			t.Errorf("%s: queue q charged %d milli-GPU, want %d", when, got, want)
		}
	}
	charged("nothing assumed", nil, 0) // the ledger's first read lists
	listed = 0
	p := builders.MakePod("p", "default").Queue("q").GPUs(1).CPU("1").UID("p").Obj()
	p.ResourceVersion = "1"
	_ = c.pods.(*feedStore).Indexer.Add(p) // in the lister; no handler has run
	named := map[types.UID]state.Assumed{"p": {Node: "n", Pod: types.NamespacedName{Namespace: "default", Name: "p"}}}
	charged("being bound, its events not handled", named, 1000)
	shown := p.DeepCopy()
	shown.ResourceVersion, shown.Spec.NodeName = "2", "n"
	shown.Annotations = withKey(shown.Annotations, api.AnnotationAdmittedQueue, "q")
	_ = c.pods.(*feedStore).Indexer.Update(shown)
	charged("shown bound by the lister alone", named, 1000)
	other := builders.MakePod("p", "default").Queue("q").GPUs(1).CPU("1").UID("p2").Obj()
	_ = c.pods.(*feedStore).Indexer.Update(other)
	charged("another pod of that name", named, 0)
	_ = c.pods.(*feedStore).Indexer.Delete(other)
	charged("deleted", named, 0)
	if listed != 0 {
		t.Errorf("the pods were listed %d times; a pod being bound with a name is read by it", listed)
	}
}
