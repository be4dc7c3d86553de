package draplugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// fakeAPI is an in-memory resource.k8s.io for the publisher and the
// server: ResourceSlices with generateName, resourceVersions, field
// selectors, delete preconditions and watches, and ResourceClaims. Each
// operation can be made to fail once (failNext); it records the writes.
type fakeAPI struct {
	mu     sync.Mutex
	slices map[string]*resourceapi.ResourceSlice
	claims map[string]*resourceapi.ResourceClaim // namespace/name -> claim
	rv     int
	seq    int
	// writes records "create <generateName>", "update <name>", "delete <name>".
	writes []string
	// fail: operation ("list", "watch", "create", "update", "delete",
	// "get") -> error returned once.
	fail     map[string]error
	watchers []*watch.RaceFreeFakeWatcher
	// dropTaints stores slices without device taints (DRADeviceTaints off).
	dropTaints bool
	// stampTaints sets TimeAdded on stored taints, as the API server does.
	stampTaints time.Time
	// refuse, when set, refuses writes every time it returns an error (an
	// admission policy, say): op is "create", "update" or "delete", s the
	// slice written (the stored one for a delete).
	refuse func(op string, s *resourceapi.ResourceSlice) error
}

var (
	_ SliceAPI    = (*fakeAPI)(nil)
	_ ClaimGetter = (*fakeAPI)(nil)
)

func newFakeAPI() *fakeAPI {
	return &fakeAPI{slices: map[string]*resourceapi.ResourceSlice{}, claims: map[string]*resourceapi.ResourceClaim{}, fail: map[string]error{}}
}

func (f *fakeAPI) failNext(op string, err error) {
	f.mu.Lock()
	f.fail[op] = err
	f.mu.Unlock()
}

func (f *fakeAPI) injectedLocked(op string) error {
	err := f.fail[op]
	delete(f.fail, op)
	return err
}

var sliceResource = schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}

func matches(sel string, s *resourceapi.ResourceSlice) bool {
	if sel == "" {
		return true
	}
	set, err := fields.ParseSelector(sel)
	if err != nil {
		panic(err)
	}
	node := ""
	if s.Spec.NodeName != nil {
		node = *s.Spec.NodeName
	}
	return set.Matches(fields.Set{resourceapi.ResourceSliceSelectorDriver: s.Spec.Driver, resourceapi.ResourceSliceSelectorNodeName: node})
}

func (f *fakeAPI) ListResourceSlices(_ context.Context, opts metav1.ListOptions) (*resourceapi.ResourceSliceList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injectedLocked("list"); err != nil {
		return nil, err
	}
	out := &resourceapi.ResourceSliceList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(f.rv)}}
	for _, s := range f.slices {
		if matches(opts.FieldSelector, s) {
			out.Items = append(out.Items, *s.DeepCopy())
		}
	}
	return out, nil
}

func (f *fakeAPI) WatchResourceSlices(_ context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injectedLocked("watch"); err != nil {
		return nil, err
	}
	w := watch.NewRaceFreeFake()
	f.watchers = append(f.watchers, w)
	return w, nil
}

// notifyLocked sends an event to every watcher (they see all slices; the
// publisher filters by list, not by event).
func (f *fakeAPI) notifyLocked(t watch.EventType, s *resourceapi.ResourceSlice) {
	for _, w := range f.watchers {
		if !w.IsStopped() {
			w.Action(t, s.DeepCopy())
		}
	}
}

func (f *fakeAPI) storeLocked(s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	f.rv++
	s.ResourceVersion = strconv.Itoa(f.rv)
	for i := range s.Spec.Devices {
		if f.dropTaints {
			s.Spec.Devices[i].Taints = nil
		}
		for j := range s.Spec.Devices[i].Taints {
			if s.Spec.Devices[i].Taints[j].TimeAdded == nil && !f.stampTaints.IsZero() {
				s.Spec.Devices[i].Taints[j].TimeAdded = &metav1.Time{Time: f.stampTaints}
			}
		}
	}
	f.slices[s.Name] = s
	return s.DeepCopy()
}

func (f *fakeAPI) CreateResourceSlice(_ context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, "create "+s.GenerateName)
	if err := f.injectedLocked("create"); err != nil {
		return nil, err
	}
	if err := f.refusedLocked("create", s); err != nil {
		return nil, err
	}
	s = s.DeepCopy()
	if s.Name == "" {
		f.seq++
		s.Name = s.GenerateName + fmt.Sprintf("x%d", f.seq)
	}
	if _, ok := f.slices[s.Name]; ok {
		return nil, apierrors.NewAlreadyExists(sliceResource, s.Name)
	}
	s.UID = types.UID("uid-" + s.Name)
	out := f.storeLocked(s)
	f.notifyLocked(watch.Added, out)
	return out, nil
}

func (f *fakeAPI) UpdateResourceSlice(_ context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, "update "+s.Name)
	if err := f.injectedLocked("update"); err != nil {
		return nil, err
	}
	if err := f.refusedLocked("update", s); err != nil {
		return nil, err
	}
	old, ok := f.slices[s.Name]
	if !ok {
		return nil, apierrors.NewNotFound(sliceResource, s.Name)
	}
	if old.ResourceVersion != s.ResourceVersion {
		return nil, apierrors.NewConflict(sliceResource, s.Name, fmt.Errorf("resourceVersion %s is not %s", s.ResourceVersion, old.ResourceVersion))
	}
	out := f.storeLocked(s.DeepCopy())
	f.notifyLocked(watch.Modified, out)
	return out, nil
}

func (f *fakeAPI) DeleteResourceSlice(_ context.Context, name string, opts metav1.DeleteOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, "delete "+name)
	if err := f.injectedLocked("delete"); err != nil {
		return err
	}
	if old, ok := f.slices[name]; ok {
		if err := f.refusedLocked("delete", old); err != nil {
			return err
		}
	}
	return f.deleteLocked(name, opts)
}

func (f *fakeAPI) refusedLocked(op string, s *resourceapi.ResourceSlice) error {
	if f.refuse == nil {
		return nil
	}
	return f.refuse(op, s)
}

func (f *fakeAPI) deleteLocked(name string, opts metav1.DeleteOptions) error {
	old, ok := f.slices[name]
	if !ok {
		return apierrors.NewNotFound(sliceResource, name)
	}
	if p := opts.Preconditions; p != nil {
		if (p.UID != nil && *p.UID != old.UID) || (p.ResourceVersion != nil && *p.ResourceVersion != old.ResourceVersion) {
			return apierrors.NewConflict(sliceResource, name, fmt.Errorf("precondition failed"))
		}
	}
	delete(f.slices, name)
	f.rv++
	f.notifyLocked(watch.Deleted, old)
	return nil
}

// put stores a slice as someone else would (no write recorded).
func (f *fakeAPI) put(s *resourceapi.ResourceSlice) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s = s.DeepCopy()
	s.UID = types.UID("uid-" + s.Name)
	f.notifyLocked(watch.Added, f.storeLocked(s))
}

// remove deletes a slice as someone else would.
func (f *fakeAPI) remove(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.deleteLocked(name, metav1.DeleteOptions{}); err != nil {
		panic(err)
	}
}

// stored returns the stored slices sorted by name.
func (f *fakeAPI) stored() []resourceapi.ResourceSlice {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []resourceapi.ResourceSlice
	for _, s := range f.slices {
		out = append(out, *s.DeepCopy())
	}
	slices.SortFunc(out, func(a, b resourceapi.ResourceSlice) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

func (f *fakeAPI) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.writes)
}

func (f *fakeAPI) GetResourceClaim(_ context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.injectedLocked("get"); err != nil {
		return nil, err
	}
	c, ok := f.claims[namespace+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
	}
	return c.DeepCopy(), nil
}

// eventually polls cond every 5 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
