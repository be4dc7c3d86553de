package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

const (
	testDriver = "gpu.example.com"
	testNode   = "node-a"
)

// dev is a device with a memory capacity; taint adds an unhealthy taint.
func dev(name string, gib int64, taint bool) resourceapi.Device {
	d := resourceapi.Device{Name: name, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"memory": {Value: *k8sresource.NewQuantity(gib<<30, k8sresource.BinarySI)},
	}}
	if taint {
		d.Taints = []resourceapi.DeviceTaint{{Key: "example.com/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return d
}

// pool is a pool of slices, each with the devices named (80 GiB each).
func pool(sliceDevices ...[]string) Pool {
	var p Pool
	for _, names := range sliceDevices {
		var s Slice
		for _, n := range names {
			s.Devices = append(s.Devices, dev(n, 80, false))
		}
		p.Slices = append(p.Slices, s)
	}
	return p
}

// stored is a slice as the API server holds it: name, generation, count.
func stored(name string, gen, count int64, s Slice) resourceapi.ResourceSlice {
	return resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "7"},
		Spec: resourceapi.ResourceSliceSpec{Driver: testDriver, NodeName: ptr.To(testNode),
			Pool:    resourceapi.ResourcePool{Name: testNode, Generation: gen, ResourceSliceCount: count},
			Devices: s.Devices, SharedCounters: s.SharedCounters},
	}
}

// summary is a plan in words: "delete <name>", "update <name> gen=<g>
// count=<n> devices=<a,b>", "create <generateName> gen=<g> count=<n>
// devices=<...>".
func summary(pl poolPlan) []string {
	var out []string
	for _, s := range pl.deletes {
		out = append(out, "delete "+s.Name)
	}
	describe := func(verb, name string, s *resourceapi.ResourceSlice) string {
		var names []string
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
		return fmt.Sprintf("%s %s gen=%d count=%d devices=%s", verb, name, s.Spec.Pool.Generation, s.Spec.Pool.ResourceSliceCount, strings.Join(names, ","))
	}
	for _, u := range pl.updates {
		out = append(out, describe("update", u.slice.Name, u.slice))
	}
	for _, c := range pl.creates {
		out = append(out, describe("create", c.slice.GenerateName, c.slice))
	}
	return out
}

func TestPlanPool(t *testing.T) {
	two := pool([]string{"gpu-0"}, []string{"gpu-1"})
	timeAdded := metav1.NewTime(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	tainted := Pool{Slices: []Slice{{Devices: []resourceapi.Device{dev("gpu-0", 80, true)}}}}
	storedTaint := tainted.Slices[0]
	storedTaint.Devices = []resourceapi.Device{*storedTaint.Devices[0].DeepCopy()}
	storedTaint.Devices[0].Taints[0].TimeAdded = &timeAdded
	for _, tc := range []struct {
		name     string
		want     Pool
		existing []resourceapi.ResourceSlice
		plan     []string
	}{{
		name: "first publish creates every slice at generation 1, named by index",
		want: two,
		plan: []string{
			"create 00000-gpu.example.com-node-a- gen=1 count=2 devices=gpu-0",
			"create 00001-gpu.example.com-node-a- gen=1 count=2 devices=gpu-1",
		},
	}, {
		name:     "unchanged: nothing to write",
		want:     two,
		existing: []resourceapi.ResourceSlice{stored("00000-a", 3, 2, two.Slices[0]), stored("00001-b", 3, 2, two.Slices[1])},
	}, {
		name:     "one slice changed: updated in place, generation kept",
		want:     pool([]string{"gpu-0"}, []string{"gpu-1", "gpu-2"}),
		existing: []resourceapi.ResourceSlice{stored("00000-a", 3, 2, two.Slices[0]), stored("00001-b", 3, 2, two.Slices[1])},
		plan:     []string{"update 00001-b gen=3 count=2 devices=gpu-1,gpu-2"},
	}, {
		name:     "two slices changed: generation bumped, both updated",
		want:     pool([]string{"gpu-9"}, []string{"gpu-8"}),
		existing: []resourceapi.ResourceSlice{stored("00000-a", 3, 2, two.Slices[0]), stored("00001-b", 3, 2, two.Slices[1])},
		plan: []string{
			"update 00000-a gen=4 count=2 devices=gpu-9",
			"update 00001-b gen=4 count=2 devices=gpu-8",
		},
	}, {
		name:     "a slice added: generation bumped, the old slice updated, the new created",
		want:     two,
		existing: []resourceapi.ResourceSlice{stored("00000-a", 1, 1, two.Slices[0])},
		plan: []string{
			"update 00000-a gen=2 count=2 devices=gpu-0",
			"create 00001-gpu.example.com-node-a- gen=2 count=2 devices=gpu-1",
		},
	}, {
		name:     "a slice removed: deleted first, the other updated with the new count",
		want:     pool([]string{"gpu-0"}),
		existing: []resourceapi.ResourceSlice{stored("00000-a", 1, 2, two.Slices[0]), stored("00001-b", 1, 2, two.Slices[1])},
		plan:     []string{"delete 00001-b", "update 00000-a gen=1 count=1 devices=gpu-0"},
	}, {
		name: "older generations, foreign names and duplicate indices are deleted; the new generation is written whole",
		want: two,
		existing: []resourceapi.ResourceSlice{
			stored("00000-a", 5, 2, two.Slices[0]), stored("00000-z", 5, 2, two.Slices[0]),
			stored("00001-old", 4, 2, two.Slices[1]), stored("node-a-gpu.example.com-x7k2p", 5, 2, two.Slices[1]),
		},
		plan: []string{
			"delete 00000-z", "delete 00001-old", "delete node-a-gpu.example.com-x7k2p",
			"update 00000-a gen=6 count=2 devices=gpu-0",
			"create 00001-gpu.example.com-node-a- gen=6 count=2 devices=gpu-1",
		},
	}, {
		name:     "a taint time the API server set is no change",
		want:     tainted,
		existing: []resourceapi.ResourceSlice{stored("00000-a", 1, 1, storedTaint)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := summary(planPool(testDriver, testNode, testNode, tc.want, tc.existing))
			if diff := cmp.Diff(tc.plan, got); diff != "" {
				t.Errorf("plan (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestPlanPoolKeepsTaintTimes: an update (here for another device) keeps
// the time the API server gave an unchanged taint.
func TestPlanPoolKeepsTaintTimes(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	old := Slice{Devices: []resourceapi.Device{dev("gpu-0", 80, true)}}
	old.Devices[0].Taints[0].TimeAdded = &at
	want := Pool{Slices: []Slice{{Devices: []resourceapi.Device{dev("gpu-0", 80, true), dev("gpu-1", 80, true)}}}}
	pl := planPool(testDriver, testNode, testNode, want, []resourceapi.ResourceSlice{stored("00000-a", 1, 1, old)})
	if len(pl.updates) != 1 {
		t.Fatalf("plan %v: want one update", summary(pl))
	}
	devs := pl.updates[0].slice.Spec.Devices
	if got := devs[0].Taints[0].TimeAdded; got == nil || !got.Equal(&at) {
		t.Errorf("gpu-0's taint time = %v, want %v kept", got, at)
	}
	if got := devs[1].Taints[0].TimeAdded; got != nil {
		t.Errorf("gpu-1's new taint has time %v, want none (the API server sets it)", got)
	}
	if want.Slices[0].Devices[0].Taints[0].TimeAdded != nil {
		t.Error("planPool changed the wanted devices")
	}
}

// errorLog records the errors a publisher reports.
type errorLog struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorLog) add(_ context.Context, err error, _ string) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

func (l *errorLog) all() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

// startPublisher runs a publisher over api until the test ends; nodeUID
// fails with the errors queued in it before answering "node-uid".
func startPublisher(t *testing.T, api *fakeAPI, uidErrs ...error) (*Publisher, *errorLog) {
	t.Helper()
	var mu sync.Mutex
	return runPublisher(t, api, func(context.Context) (types.UID, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(uidErrs) > 0 {
			err := uidErrs[0]
			uidErrs = uidErrs[1:]
			return "", err
		}
		return "node-uid", nil
	})
}

// runPublisher runs a publisher over api with nodeUID until the test ends.
func runPublisher(t *testing.T, api *fakeAPI, nodeUID func(context.Context) (types.UID, error)) (*Publisher, *errorLog) {
	t.Helper()
	log := &errorLog{}
	p, err := NewPublisher(PublisherOptions{
		Driver: testDriver, Node: testNode, API: api, OnError: log.add, NodeUID: nodeUID,
		SyncDelay: 20 * time.Millisecond, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p, log
}

// published tells whether api holds exactly want's slices of testNode's
// pool at one generation, in index order.
func published(api *fakeAPI, want Pool) bool {
	got := api.stored()
	if len(got) != len(want.Slices) {
		return false
	}
	for i, s := range got {
		if !strings.HasPrefix(s.Name, encodeIndex(i, 5)+"-") || s.Spec.Pool.Generation != got[0].Spec.Pool.Generation ||
			s.Spec.Pool.ResourceSliceCount != int64(len(want.Slices)) || !devicesEqual(s.Spec.Devices, want.Slices[i].Devices) {
			return false
		}
	}
	return true
}

func TestPublisherPublishesAndFollowsChanges(t *testing.T) {
	api := newFakeAPI()
	// Another node's slice and another driver's slice on this node stay.
	other := stored("00000-other-node", 1, 1, pool([]string{"x"}).Slices[0])
	other.Spec.NodeName = ptr.To("node-b")
	api.put(&other)
	foreign := stored("00000-foreign-driver", 1, 1, pool([]string{"y"}).Slices[0])
	foreign.Spec.Driver = "other.example.com"
	api.put(&foreign)
	// A pool of this node and driver no longer published goes.
	stale := stored("00000-stale-pool", 1, 1, pool([]string{"z"}).Slices[0])
	stale.Spec.Pool.Name = "old-pool"
	api.put(&stale)

	p, _ := startPublisher(t, api)
	want := pool([]string{"gpu-0", "gpu-1"}, []string{"gpu-2"})
	p.Publish(DriverResources{Pools: map[string]Pool{testNode: want}})
	eventually(t, "the pool published", func() bool {
		var own []resourceapi.ResourceSlice
		for _, s := range api.stored() {
			if s.Spec.Driver == testDriver && ptr.Deref(s.Spec.NodeName, "") == testNode {
				own = append(own, s)
			}
		}
		return len(own) == 2 && own[0].Spec.Pool.Name == testNode && own[1].Spec.Pool.Name == testNode
	})
	for _, s := range api.stored() {
		switch {
		case s.Name == other.Name || s.Name == foreign.Name:
			continue
		case s.Name == stale.Name:
			t.Errorf("the stale pool's slice %s was left", s.Name)
		}
		wantOwner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: testNode, UID: "node-uid", Controller: ptr.To(true)}}
		if diff := cmp.Diff(wantOwner, s.OwnerReferences); diff != "" {
			t.Errorf("slice %s owner (-want,+got):\n%s", s.Name, diff)
		}
	}
	api.remove(other.Name)
	api.remove(foreign.Name)
	eventually(t, "exactly the wanted slices", func() bool { return published(api, want) })

	// Changing the published devices updates, adding a slice bumps the
	// generation, and the caller's later changes do not leak in.
	next := pool([]string{"gpu-0"}, []string{"gpu-1"}, []string{"gpu-2"})
	p.Publish(DriverResources{Pools: map[string]Pool{testNode: next}})
	next.Slices[0].Devices[0].Name = "changed-after-publish"
	want = pool([]string{"gpu-0"}, []string{"gpu-1"}, []string{"gpu-2"})
	eventually(t, "the new pool", func() bool { return published(api, want) })
	if g := api.stored()[0].Spec.Pool.Generation; g != 2 {
		t.Errorf("generation %d after adding a slice, want 2", g)
	}

	// Settled: no more writes.
	n := len(api.recorded())
	time.Sleep(100 * time.Millisecond)
	if got := api.recorded(); len(got) != n {
		t.Errorf("writes after settling: %v", got[n:])
	}
}

// TestPublisherPutsBackWhatOthersDelete: the kubelet wipes a driver's
// slices when it thinks the driver gone; they come back.
func TestPublisherPutsBackWhatOthersDelete(t *testing.T) {
	api := newFakeAPI()
	p, _ := startPublisher(t, api)
	want := pool([]string{"gpu-0"}, []string{"gpu-1"})
	p.Publish(DriverResources{Pools: map[string]Pool{testNode: want}})
	eventually(t, "the pool published", func() bool { return published(api, want) })
	for _, s := range api.stored() {
		api.remove(s.Name)
	}
	eventually(t, "the pool published again", func() bool { return published(api, want) })
}

// TestPublisherRetries: a failed list, node read, create, update or delete
// is reported as recoverable and retried until the slices are right.
func TestPublisherRetries(t *testing.T) {
	for _, op := range []string{"list", "watch", "create", "update", "delete", "node"} {
		t.Run(op, func(t *testing.T) {
			api := newFakeAPI()
			// Something to update and something to delete.
			api.put(ptr.To(stored("00000-a", 1, 2, pool([]string{"old"}).Slices[0])))
			api.put(ptr.To(stored("00005-b", 1, 2, pool([]string{"gone"}).Slices[0])))
			injected := apierrors.NewServiceUnavailable("injected " + op)
			var uidErrs []error
			if op == "node" {
				uidErrs = append(uidErrs, injected)
			} else {
				api.failNext(op, injected)
			}
			p, log := startPublisher(t, api, uidErrs...)
			want := pool([]string{"gpu-0"}, []string{"gpu-1"})
			p.Publish(DriverResources{Pools: map[string]Pool{testNode: want}})
			eventually(t, "the pool published", func() bool { return published(api, want) })
			errs := log.all()
			if len(errs) == 0 {
				t.Fatal("no error reported")
			}
			if !errors.Is(errs[0], ErrRecoverable) || !apierrors.IsServiceUnavailable(errs[0]) {
				t.Errorf("reported %v, want the injected error as recoverable", errs[0])
			}
		})
	}
}

// TestPublisherAcceptsDroppedFields: an API server with DRADeviceTaints off
// stores tainted devices without taints; the publisher reports it once and
// does not write the slice again and again.
func TestPublisherAcceptsDroppedFields(t *testing.T) {
	api := newFakeAPI()
	api.dropTaints = true
	p, log := startPublisher(t, api)
	p.Publish(DriverResources{Pools: map[string]Pool{testNode: {Slices: []Slice{{Devices: []resourceapi.Device{dev("gpu-0", 80, true)}}}}}})
	eventually(t, "the dropped fields reported", func() bool { return len(log.all()) > 0 })
	var dropped *DroppedFieldsError
	if err := log.all()[0]; !errors.As(err, &dropped) || !errors.Is(err, ErrRecoverable) {
		t.Fatalf("reported %v, want a recoverable DroppedFieldsError", err)
	}
	if got := dropped.DisabledFeatures(); !slices.Equal(got, []string{"DRADeviceTaints"}) {
		t.Errorf("disabled features %v, want [DRADeviceTaints]", got)
	}
	time.Sleep(150 * time.Millisecond) // several sync delays
	if got := api.recorded(); len(got) != 1 {
		t.Errorf("writes %v, want the one create", got)
	}
	if n := len(log.all()); n != 1 {
		t.Errorf("%d errors reported, want 1: %v", n, log.all())
	}
}

func TestDroppedFieldsDisabledFeatures(t *testing.T) {
	base := dev("gpu-0", 80, true)
	base.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0"}}
	base.AllowMultipleAllocations = ptr.To(true)
	want := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: []resourceapi.Device{base},
		SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0"}}}}
	for _, tc := range []struct {
		name string
		drop func(s *resourceapi.ResourceSlice)
		want []string
	}{
		{"taints", func(s *resourceapi.ResourceSlice) { s.Spec.Devices[0].Taints = nil }, []string{"DRADeviceTaints"}},
		{"counter sets", func(s *resourceapi.ResourceSlice) { s.Spec.SharedCounters = nil }, []string{"DRAPartitionableDevices"}},
		{"counter consumption", func(s *resourceapi.ResourceSlice) { s.Spec.Devices[0].ConsumesCounters = nil }, []string{"DRAPartitionableDevices"}},
		{"multiple allocations", func(s *resourceapi.ResourceSlice) { s.Spec.Devices[0].AllowMultipleAllocations = nil }, []string{"DRAConsumableCapacity"}},
		{"nothing known", func(*resourceapi.ResourceSlice) {}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := want.DeepCopy()
			tc.drop(got)
			e := &DroppedFieldsError{PoolName: "p", DesiredSlice: want, ActualSlice: got}
			if diff := cmp.Diff(tc.want, e.DisabledFeatures()); diff != "" {
				t.Errorf("(-want,+got):\n%s", diff)
			}
			if tc.want == nil && !strings.Contains(e.Error(), "unknown") {
				t.Errorf("error %q does not say the feature is unknown", e.Error())
			}
		})
	}
}

func TestIndexNames(t *testing.T) {
	for _, tc := range []struct {
		slices, index int
		name          string
	}{{1, 0, "00000"}, {16, 15, "0000f"}, {1 << 20, 1, "00001"}, {1<<20 + 1, 1, "000001"}} {
		l := indexLength(tc.slices)
		if got := encodeIndex(tc.index, l); got != tc.name {
			t.Errorf("encodeIndex(%d) of %d slices = %q, want %q", tc.index, tc.slices, got, tc.name)
		}
		if i, ok := decodeIndex(tc.name+"-gpu.example.com-node-a-x", l); !ok || i != tc.index {
			t.Errorf("decodeIndex(%q) = %d, %v", tc.name, i, ok)
		}
	}
	for _, bad := range []string{"0000-x", "000000-x", "0000g-x", "00000"} {
		if _, ok := decodeIndex(bad, 5); ok {
			t.Errorf("decodeIndex(%q) accepted", bad)
		}
	}
}

// ownPool returns the stored slices of pool name on testNode.
func ownPool(api *fakeAPI, name string) []resourceapi.ResourceSlice {
	var out []resourceapi.ResourceSlice
	for _, s := range api.stored() {
		if s.Spec.Driver == testDriver && ptr.Deref(s.Spec.NodeName, "") == testNode && s.Spec.Pool.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// TestPublisherPoolErrorsDoNotBlockOthers: a slice of this node and driver
// in a pool it does not publish, which it may not delete (gpufrac's
// admission policy 7 refuses gpufrac-node every slice whose pool is not
// named after its node), must not keep the node's own pool from being
// published and kept: the resourceslice controller syncs each pool on its
// own.
func TestPublisherPoolErrorsDoNotBlockOthers(t *testing.T) {
	api := newFakeAPI()
	api.refuse = func(_ string, s *resourceapi.ResourceSlice) error {
		if s.Spec.Pool.Name != testNode {
			return apierrors.NewForbidden(sliceResource, s.Name, errors.New("may publish only the pool named after its node"))
		}
		return nil
	}
	// "a-stray" sorts before "node-a".
	stray := stored("00000-stray", 1, 1, pool([]string{"x"}).Slices[0])
	stray.Spec.Pool.Name = "a-stray"
	api.put(&stray)

	p, log := startPublisher(t, api)
	want := pool([]string{"gpu-0"}, []string{"gpu-1"})
	p.Publish(DriverResources{Pools: map[string]Pool{testNode: want}})
	eventually(t, "the node's pool published beside the stray pool", func() bool {
		own := ownPool(api, testNode)
		return len(own) == 2 && devicesEqual(own[0].Spec.Devices, want.Slices[0].Devices) && devicesEqual(own[1].Spec.Devices, want.Slices[1].Devices)
	})
	eventually(t, "the refused delete reported", func() bool {
		for _, err := range log.all() {
			if apierrors.IsForbidden(err) && errors.Is(err, ErrRecoverable) {
				return true
			}
		}
		return false
	})
	// Wiped by the kubelet, the node's slices still come back.
	for _, s := range ownPool(api, testNode) {
		api.remove(s.Name)
	}
	eventually(t, "the node's pool published again", func() bool { return len(ownPool(api, testNode)) == 2 })
}

// TestPublisherOwnerFollowsNodeUID: a Node deleted and registered again
// under the same name has a new UID; slices created afterwards with the old
// one would be deleted by the garbage collector (their owner is gone) and
// re-created, forever. The publisher reads the UID again for new slices.
func TestPublisherOwnerFollowsNodeUID(t *testing.T) {
	api := newFakeAPI()
	var mu sync.Mutex
	uid := types.UID("uid-1")
	p, _ := runPublisher(t, api, func(context.Context) (types.UID, error) {
		mu.Lock()
		defer mu.Unlock()
		return uid, nil
	})
	owners := func() []types.UID {
		var out []types.UID
		for _, s := range api.stored() {
			for _, o := range s.OwnerReferences {
				out = append(out, o.UID)
			}
		}
		return out
	}
	want := pool([]string{"gpu-0"}, []string{"gpu-1"})
	p.Publish(DriverResources{Pools: map[string]Pool{testNode: want}})
	eventually(t, "the pool published, owned by uid-1", func() bool {
		return published(api, want) && slices.Equal(owners(), []types.UID{"uid-1", "uid-1"})
	})
	// The Node is re-created; the garbage collector deletes the slices of
	// the old one.
	mu.Lock()
	uid = "uid-2"
	mu.Unlock()
	for _, s := range api.stored() {
		api.remove(s.Name)
	}
	eventually(t, "the pool published again, owned by uid-2", func() bool {
		return published(api, want) && slices.Equal(owners(), []types.UID{"uid-2", "uid-2"})
	})
}
