package scheduler

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
)

// inflightTTL bounds how long an allocation the coordinator made counts
// while the claim informer does not show it (a write that never arrived).
const inflightTTL = 2 * time.Minute

// DRADeps are what the scheduler needs on nodes in mode dra (nil Deps.DRA:
// the cluster has none, claims are left to other schedulers).
type DRADeps struct {
	// Slices lists every ResourceSlice (the informer).
	Slices func() ([]*resourceapi.ResourceSlice, error)
	// Claims lists every ResourceClaim (the informer).
	Claims func() ([]*resourceapi.ResourceClaim, error)
	// GetClaim reads one claim from the informer.
	GetClaim func(namespace, name string) (*resourceapi.ResourceClaim, bool)
	// Classes are the DeviceClasses.
	Classes structured.DeviceClassLister
	// Writer persists allocations before binding (dra.Writer).
	Writer ClaimWriter
}

// ClaimWriter persists claim allocations for a pod before its binding and
// takes them back when the binding fails (dra.Writer).
type ClaimWriter interface {
	Write(ctx context.Context, pod *corev1.Pod, plans []dra.Planned) error
	Undo(ctx context.Context, pod *corev1.Pod, plans []dra.Planned)
}

// inflight is what the coordinator allocated for one pod and is writing or
// has written: it counts until the claim informer shows every claim
// allocated, so no later allocation gives the same share away.
type inflight struct {
	allocs []dra.Allocated // Name "" for an extended claim not created yet
	since  time.Time
}

// readDRA reads slices and claims, forgets in-flight allocations the
// informer now shows (or that are too old), and returns the cycle's view and
// what claims hold of each GPU. Nil without DRA.
func (s *Scheduler) readDRA(now time.Time) (*draCycle, dra.Usage, error) {
	if s.deps.DRA == nil {
		return nil, nil, nil
	}
	slices, err := s.deps.DRA.Slices()
	if err != nil {
		return nil, nil, fmt.Errorf("listing resource slices: %w", err)
	}
	claims, err := s.deps.DRA.Claims()
	if err != nil {
		return nil, nil, fmt.Errorf("listing resource claims: %w", err)
	}
	allocated := map[string]bool{} // namespace/name -> allocated
	for _, c := range claims {
		if c.Status.Allocation != nil {
			allocated[c.Namespace+"/"+c.Name] = true
		}
	}
	allocs := dra.AllocatedOf(claims)
	s.mu.Lock()
	for uid, f := range s.inflight {
		shown := true
		for _, a := range f.allocs {
			if a.Name == "" || !allocated[a.Namespace+"/"+a.Name] {
				shown = false
			}
		}
		if shown || now.Sub(f.since) > inflightTTL {
			delete(s.inflight, uid)
			continue
		}
		allocs = append(allocs, f.allocs...)
	}
	s.mu.Unlock()
	c := &draCycle{world: dra.World{Slices: slices, Classes: s.deps.DRA.Classes, Allocated: allocs}, devs: dra.IndexDevices(slices), claims: claims}
	for _, d := range c.devs {
		if d.MemoryBytes > 0 && (c.minGPUMemory == 0 || d.MemoryBytes < c.minGPUMemory) {
			c.minGPUMemory = d.MemoryBytes
		}
	}
	return c, dra.UsageOf(c.devs, allocs), nil
}

// kubeSchedulerPlacingClaims tells whether another scheduler (kube-scheduler)
// is still placing pods with resource claims: unbound, not ended, and not
// given up on (PodScheduled=False, Unschedulable). Its allocations in flight
// are invisible here until written, so while it works the coordinator keeps
// its own claims off nodes in mode dra: two allocators giving the same GPU
// away (each seeing it free) would leave both pods unable to start, the
// DRA driver refusing the second one prepared.
//
// Only pods kube-scheduler actually tries to place count: those of the
// default scheduler, without scheduling gates, whose claims exist (a claim
// from a template gets claimGrace to be made). kube-scheduler sets no
// condition on the others (another scheduler's name, gates, or a claim its
// PreEnqueue waits for), so any tenant's such pod would otherwise keep
// every claim of the coordinator waiting for good.
//
// Pods asking extended resources that kube-scheduler serves through claims
// it makes itself (KEP-5004: a DeviceClass's extendedResourceName, such as
// the chart's optional nvidia.com/gpu mapping, or any class's implicit
// deviceclass.resource.kubernetes.io/<class>) count as pods with claims.
func (s *Scheduler) kubeSchedulerPlacingClaims(pods iter.Seq[*corev1.Pod]) string {
	mapped := s.classResources()
	for p := range pods {
		if p.Spec.SchedulerName != corev1.DefaultSchedulerName || p.Spec.NodeName != "" ||
			(len(p.Spec.ResourceClaims) == 0 && !asksAny(p, mapped)) ||
			len(p.Spec.SchedulingGates) > 0 ||
			p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if !s.claimsMade(p) && s.clock.Since(p.CreationTimestamp.Time) > claimGrace {
			continue
		}
		givenUp := false
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				givenUp = true
			}
		}
		if !givenUp {
			return p.Namespace + "/" + p.Name
		}
	}
	return ""
}

// allocatedGPUClaimNode is the node (the pool of gpufrac's driver) a claim
// among claims is allocated on, "" when none is allocated: a pod's GPU claim
// is allocated before the pod is bound when it is shared with a pod placed
// before, or when the coordinator wrote the allocation and stopped before
// the binding. The pod can run only there.
func allocatedGPUClaimNode(claims []*resourceapi.ResourceClaim) string {
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == api.DRADriver {
				return r.Pool
			}
		}
	}
	return ""
}

// extendedClaimOf is the extended-resource claim an earlier attempt made
// for pending pod and did not see through (the coordinator stopped, or a
// write or binding failed and its undo too, after the claim was created
// and before the pod was bound), nil when none: a claim with the
// extended-resource annotation whose controller is the pod; the one the
// pod's extendedResourceClaimStatus names first, then an allocated one. It
// is the pod's: taken up again, never made twice (one pod would hold two
// shares as long as it lives).
//
// Untrusted input: the annotation and the controller reference are the
// claim author's, and a tenant with edit rights writes both (issue 25). A
// claim is taken up only if dra.CheckExtendedClaim finds its spec exactly
// what the coordinator writes for the pod's resources; the first that is
// not comes back as forged, and the pod is refused while it exists (taken
// up, a pod asking 1 % held four whole GPUs, charged 0.01). The pod's
// extendedResourceClaimStatus is written only through pods/status (the
// coordinator's writer), out of edit's reach, but the claim it names may be
// a tenant's made under that name since: it is checked like the others.
func (v *draCycle) extendedClaimOf(pod *corev1.Pod) (own, forged *resourceapi.ResourceClaim, why error) {
	if v == nil {
		return nil, nil, nil
	}
	named := ""
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
		named = st.ResourceClaimName
	}
	rank := func(c *resourceapi.ResourceClaim) int {
		switch {
		case c.Name == named:
			return 0
		case c.Status.Allocation != nil:
			return 1
		}
		return 2
	}
	better := func(c, than *resourceapi.ResourceClaim) bool {
		return than == nil || rank(c) < rank(than) || (rank(c) == rank(than) && c.Name < than.Name)
	}
	for _, c := range v.claims {
		if c.Namespace != pod.Namespace || c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" || c.DeletionTimestamp != nil {
			continue
		}
		owner := metav1.GetControllerOf(c)
		if owner == nil || owner.UID != pod.UID {
			continue
		}
		if err := dra.CheckExtendedClaim(pod, c); err != nil {
			if better(c, forged) {
				forged, why = c, err
			}
			continue
		}
		if better(c, own) {
			own = c
		}
	}
	return own, forged, why
}

// forgedClaimMessage is the pending message of a pod refused for a claim
// that presents itself as its extended-resource claim (extendedClaimOf).
func forgedClaimMessage(c *resourceapi.ResourceClaim, why error) string {
	return fmt.Sprintf("resource claim %s carries annotation %s and names this pod as its controller, but is not the "+
		"extended-resource claim gpufrac writes for the pod's resources (%v); it is never allocated, and the pod waits "+
		"until it is deleted (gpufrac does not delete it)", c.Name, resourceapi.ExtendedResourceClaimAnnotation, why)
}

// classResources are the extended resources DeviceClasses map
// (spec.extendedResourceName).
func (s *Scheduler) classResources() map[corev1.ResourceName]bool {
	out := map[corev1.ResourceName]bool{}
	if s.deps.DRA == nil || s.deps.DRA.Classes == nil {
		return out
	}
	classes, err := s.deps.DRA.Classes.List()
	if err != nil {
		return out
	}
	for _, c := range classes {
		if c.Spec.ExtendedResourceName != nil {
			out[corev1.ResourceName(*c.Spec.ExtendedResourceName)] = true
		}
	}
	return out
}

// asksAny tells whether a container of p asks one of the mapped extended
// resources or a class's implicit one.
func asksAny(p *corev1.Pod, mapped map[corev1.ResourceName]bool) bool {
	for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
		for _, rl := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range rl {
				if mapped[name] || strings.HasPrefix(string(name), resourceapi.ResourceDeviceClassPrefix) {
					return true
				}
			}
		}
	}
	return false
}

// claimGrace is how long a pod whose claims do not all exist counts as
// being placed by kube-scheduler: long enough for kube-controller-manager
// to make the claims of its templates.
const claimGrace = 30 * time.Second

// claimsMade tells whether every claim of p exists (as kube-scheduler's
// PreEnqueue requires before it tries to place p).
func (s *Scheduler) claimsMade(p *corev1.Pod) bool {
	names, err := podrequest.PodClaims(p)
	if err != nil {
		return false
	}
	for _, name := range names {
		c, ok := s.deps.DRA.GetClaim(p.Namespace, name)
		if !ok || c.DeletionTimestamp != nil {
			return false
		}
	}
	return true
}

// claimGPUMemory is the GPU memory a claim for bytes is charged against:
// its GPU's once allocated, else the smallest of gpufrac's GPUs.
func (v *draCycle) claimGPUMemory(c *resourceapi.ResourceClaim) int64 {
	if v == nil {
		return 0
	}
	if c.Status.Allocation != nil {
		for _, r := range c.Status.Allocation.Devices.Results {
			if d, ok := v.devs[dra.DeviceKey{Pool: r.Pool, Device: r.Device}]; ok && d.MemoryBytes > 0 {
				return d.MemoryBytes
			}
		}
	}
	return v.minGPUMemory
}

// allocateClaims allocates, for each pod of w placed on a node in mode dra,
// its unallocated claims (or, for a pod asking GPU extended resources, the
// extended-resource claim the coordinator makes for it) on the node and
// GPUs placement chose; if they do not fit those GPUs, on any GPU of the
// node (views a placement snapshot does not model: a GPU shared by percent
// takes no claim for bytes). The allocations count as in flight from here.
// It returns the plans per pod index, or an error (nothing kept) when a pod's
// claims fit nowhere on its node.
func (s *Scheduler) allocateClaims(ctx context.Context, v *draCycle, w *workload, ds []placement.Decision, snapDRA map[string]bool) (map[int][]dra.Planned, error) {
	if v == nil {
		return nil, nil
	}
	out := map[int][]dra.Planned{}
	var made []types.UID
	fail := func(err error) (map[int][]dra.Planned, error) {
		s.mu.Lock()
		for _, uid := range made {
			delete(s.inflight, uid)
		}
		s.mu.Unlock()
		return nil, err
	}
	for i, d := range ds {
		p := w.pods[i]
		if !snapDRA[d.Node] {
			continue
		}
		var plans []dra.Planned
		var pending []*resourceapi.ResourceClaim
		extended := false
		var mappings []corev1.ContainerExtendedResourceRequest
		switch {
		case len(p.Claims) > 0:
			for _, c := range p.Claims {
				if c.Status.Allocation != nil {
					plans = append(plans, dra.Planned{Claim: c}) // shared claim: reserve only
					continue
				}
				pending = append(pending, c)
			}
		case p.extended != nil:
			// An earlier attempt's extended claim: taken up again.
			_, m := dra.ExtendedClaim(p.pod)
			if p.extended.Status.Allocation != nil {
				plans = append(plans, dra.Planned{Claim: p.extended, Extended: true, Mappings: m})
			} else {
				pending, extended, mappings = []*resourceapi.ResourceClaim{p.extended}, true, m
			}
		case p.Request.GPUs > 0 || p.Request.ShareMilli > 0:
			c, m := dra.ExtendedClaim(p.pod)
			c.UID = p.pod.UID + "-extended" // for the allocator only; the API server gives the claim its own
			pending, extended, mappings = []*resourceapi.ResourceClaim{c}, true, m
		}
		if len(pending) > 0 {
			node, err := s.deps.Nodes.Get(d.Node)
			if err != nil {
				return fail(fmt.Errorf("reading node %s: %w", d.Node, err))
			}
			world := v.world
			s.mu.Lock()
			for _, f := range s.inflight {
				world.Allocated = append(world.Allocated, f.allocs...)
			}
			s.mu.Unlock()
			res, err := s.allocator.Allocate(ctx, world, node, pending, d.GPUs)
			moved := false
			if errors.Is(err, dra.ErrNoFit) && len(d.GPUs) > 0 {
				klog.FromContext(ctx).V(4).Info("Claims do not fit the GPUs placement chose; trying the node's others", "pod", klog.KObj(p.pod), "node", d.Node, "gpus", d.GPUs)
				res, err = s.allocator.Allocate(ctx, world, node, pending, nil)
				moved = true
			}
			if err != nil {
				return fail(fmt.Errorf("pod %s/%s: %w", p.pod.Namespace, p.pod.Name, err))
			}
			if gpus := v.gpusOf(res); moved && len(gpus) > 0 {
				// The pod's GPU is where its claims went: the binding's
				// gpufrac.io/gpu and the assumption name that GPU, not the
				// one placement chose.
				ds[i].GPUs = gpus
			}
			f := inflight{since: time.Now()}
			for j, c := range pending {
				alloc := res[j]
				plans = append(plans, dra.Planned{Claim: c, Allocation: &alloc, Extended: extended, Mappings: mappings})
				f.allocs = append(f.allocs, dra.Allocated{Namespace: c.Namespace, Name: c.Name, Allocation: &alloc})
			}
			s.mu.Lock()
			s.inflight[p.pod.UID] = f
			s.mu.Unlock()
			made = append(made, p.pod.UID)
		}
		if len(plans) > 0 {
			out[i] = plans
		}
	}
	return out, nil
}

// gpusOf lists the GPUs (UUIDs, sorted) that allocation results hold
// devices of, as the published slices name them; results of other drivers
// (whose pool and device names may be gpufrac's: devices are keyed without
// their driver), admin-access results (which hold nothing, as in
// dra.UsageOf) and devices not published are left out.
func (v *draCycle) gpusOf(res []resourceapi.AllocationResult) []string {
	var out []string
	for _, a := range res {
		for _, r := range a.Devices.Results {
			if r.Driver != api.DRADriver || r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			if d, ok := v.devs[dra.DeviceKey{Pool: r.Pool, Device: r.Device}]; ok && d.GPU != "" && !slices.Contains(out, d.GPU) {
				out = append(out, d.GPU)
			}
		}
	}
	slices.Sort(out)
	return out
}

// writeClaims persists a pod's planned claims before its binding; the
// extended claim's name, known once it is created, goes to its in-flight
// record.
func (s *Scheduler) writeClaims(ctx context.Context, pod *corev1.Pod, plans []dra.Planned) error {
	if err := s.deps.DRA.Writer.Write(ctx, pod, plans); err != nil {
		s.dropInflight(pod.UID)
		return err
	}
	s.mu.Lock()
	if f, ok := s.inflight[pod.UID]; ok {
		for i := range f.allocs {
			for _, p := range plans {
				if p.Extended && f.allocs[i].Name == "" {
					f.allocs[i].Name = p.Claim.Name
				}
			}
		}
		s.inflight[pod.UID] = f
	}
	s.mu.Unlock()
	return nil
}

func (s *Scheduler) dropInflight(uid types.UID) {
	s.mu.Lock()
	delete(s.inflight, uid)
	s.mu.Unlock()
}

// describeClaims names a pod's planned claims for logs.
func describeClaims(plans []dra.Planned) string {
	var parts []string
	for _, p := range plans {
		name := p.Claim.Name
		if p.Extended {
			name = "(extended resources)"
		}
		if p.Allocation != nil {
			var devs []string
			for _, r := range p.Allocation.Devices.Results {
				devs = append(devs, r.Device)
			}
			name += "=" + strings.Join(devs, "+")
		}
		parts = append(parts, name)
	}
	return strings.Join(parts, ", ")
}
