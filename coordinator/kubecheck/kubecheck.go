// Package kubecheck makes the coordinator check what kube-scheduler checks
// beyond GPUs, CPU, memory, node selectors, node affinity and taints (which
// coordinator/placement checks itself): a pod's volumes (VolumeBinding,
// VolumeRestrictions, VolumeZone, NodeVolumeLimits), its topology spread
// constraints (PodTopologySpread), inter-pod affinity and anti-affinity
// (InterPodAffinity) and host ports (NodePorts). It runs kube-scheduler's own
// plugins in kube-scheduler's own framework, on kube-scheduler's own cache
// (pkg/scheduler/backend/cache) fed by the coordinator's informers, so what
// these checks mean is exactly what kube-scheduler v1.36 says they mean.
//
// A cycle pays for it only when a pending pod uses one of these features, or
// when a bound pod has a required anti-affinity that could reject any pod
// (Needs): then Begin brings the framework's snapshot up to date, only the
// nodes whose generation moved since the last cycle, as kube-scheduler does.
// Check runs the PreFilter plugins for one pod; plugins with nothing to
// check skip themselves, and a pod none of them checks costs nothing more.
// The per-node Filter runs only for the nodes placement asks about
// (PodCheck.Allows).
//
// Pods placed are assumed into the cache (Assume, kube-scheduler's
// AssumePod), so the next pod's spread and anti-affinity see them, until the
// informer shows them bound or Forget takes them back. Volumes are
// reserved (PodCheck.Reserve: kube-scheduler's assume cache of PVs and PVCs)
// when a pod is placed and bound (PodCheck.PreBind) before the pod, as
// kube-scheduler's VolumeBinding does; Unreserve rolls a reservation back.
package kubecheck

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"

	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// FilterPlugins are the kube-scheduler plugins the coordinator runs, in
// kube-scheduler's default order. Each also has a PreFilter; VolumeBinding
// also reserves and pre-binds. NodeResourcesFit ignores the GPU resources
// (groups nvidia.com and gpufrac.io: placement counts GPUs, shares, MIG
// devices and replicas itself) and checks the rest: ephemeral storage,
// huge pages, other extended resources, the node's pod count, and CPU and
// memory again.
var FilterPlugins = []string{
	names.NodeResourcesFit,
	names.NodePorts,
	names.VolumeRestrictions,
	names.NodeVolumeLimits,
	names.VolumeBinding,
	names.VolumeZone,
	names.PodTopologySpread,
	names.InterPodAffinity,
}

// Options configure a Checker.
type Options struct {
	// Factory is the informer factory the plugins take their listers from
	// (PVs, PVCs, StorageClasses, CSINodes, CSIDrivers,
	// CSIStorageCapacities, VolumeAttachments, namespaces, and the pods and
	// nodes VolumeBinding reads). Start it (again) after New: the plugins
	// register their informers in it.
	Factory informers.SharedInformerFactory
	// Client writes volume bindings (VolumeBinding's PreBind).
	Client kubernetes.Interface
	// BindTimeout bounds PreBind's wait for the PV controller to finish a
	// binding; 0 takes kube-scheduler's default (600 s).
	BindTimeoutSeconds int64
}

// Checker runs kube-scheduler's filter plugins for the coordinator. The
// event handlers (PodHandler, NodeHandler) may run on any goroutine; Begin,
// Check, Assume, Forget and End on the cycle's goroutine only; a PodCheck's
// Reserve, Unreserve and PreBind on any.
type Checker struct {
	fw    framework.Framework
	cache internalcache.Cache
	snap  *internalcache.Snapshot

	// antiAffinity counts the bound pods with a required pod anti-affinity
	// the cache holds: while there is one, any pod may be rejected by it.
	antiAffinity atomic.Int64
	// preFilters counts the pods whose PreFilter plugins ran (PreFilters).
	preFilters atomic.Uint64

	pvs     corelisters.PersistentVolumeLister
	pvcs    corelisters.PersistentVolumeClaimLister
	classes storagelisters.StorageClassLister
	// namespaces resolves affinity terms' namespace selectors (Topology).
	namespaces corelisters.NamespaceLister

	mu sync.Mutex // guards what follows
	// assumed: pods placed and assumed in the cache (kube-scheduler's
	// AssumePod), until the informer shows them bound (AddPod confirms
	// them) or Forget; each as assumed, on its node.
	assumed map[types.UID]*corev1.Pod
	// dirty: the cache changed by an Assume or Forget since the snapshot
	// was last brought up to date.
	dirty  bool
	began  bool
	synced []toolscache.InformerSynced // the plugins' informers (Ready)
	// counts: domain counts of this cycle (DomainTopology), until End.
	counts map[string]map[string]int
	index  *labelIndex
}

// New builds the framework with the plugins of FilterPlugins, configured
// with kube-scheduler's defaults (PodTopologySpread without default
// constraints: they only ever score), and kube-scheduler's cache.
func New(ctx context.Context, opts Options) (*Checker, error) {
	if opts.Factory == nil {
		return nil, errors.New("kubecheck: an informer factory is required")
	}
	// The framework counts into kube-scheduler's metrics, which must be
	// made first (once per process; they live in component-base's legacy
	// registry, which the coordinator does not serve).
	schedmetrics.Register()
	cfg, err := latest.Default()
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler's default configuration: %w", err)
	}
	if len(cfg.Profiles) == 0 {
		return nil, errors.New("kube-scheduler's default configuration has no profile")
	}
	profile := cfg.Profiles[0]
	profile.SchedulerName = "gpufrac-kubecheck"
	for i := range profile.PluginConfig {
		switch args := profile.PluginConfig[i].Args.(type) {
		case *config.PodTopologySpreadArgs:
			// System default constraints are ScheduleAnyway: they score and
			// never filter, and would make the plugin watch Services,
			// ReplicaSets, StatefulSets and ReplicationControllers.
			args.DefaultingType = config.ListDefaulting
			args.DefaultConstraints = nil
		case *config.NodeResourcesFitArgs:
			args.IgnoredResourceGroups = append(args.IgnoredResourceGroups, "nvidia.com", "gpufrac.io")
		case *config.VolumeBindingArgs:
			if opts.BindTimeoutSeconds > 0 {
				args.BindTimeoutSeconds = opts.BindTimeoutSeconds
			}
		}
	}
	set := func(names ...string) config.PluginSet {
		var ps config.PluginSet
		for _, n := range names {
			ps.Enabled = append(ps.Enabled, config.Plugin{Name: n})
		}
		return ps
	}
	profile.Plugins = &config.Plugins{
		// The framework requires a queue sort and a bind plugin; neither runs.
		QueueSort: set(names.PrioritySort),
		PreFilter: set(FilterPlugins...),
		Filter:    set(FilterPlugins...),
		Reserve:   set(names.VolumeBinding),
		PreBind:   set(names.VolumeBinding),
		Bind:      set(names.DefaultBinder),
	}
	c := &Checker{
		pvs:        opts.Factory.Core().V1().PersistentVolumes().Lister(),
		pvcs:       opts.Factory.Core().V1().PersistentVolumeClaims().Lister(),
		classes:    opts.Factory.Storage().V1().StorageClasses().Lister(),
		namespaces: opts.Factory.Core().V1().Namespaces().Lister(),
		cache:      internalcache.New(ctx, nil, false),
		snap:       internalcache.NewEmptySnapshot(),
		assumed:    map[types.UID]*corev1.Pod{},
	}
	csiNodes := opts.Factory.Storage().V1().CSINodes().Lister()
	fw, err := frameworkruntime.NewFramework(ctx, plugins.NewInTreeRegistry(), &profile,
		frameworkruntime.WithClientSet(opts.Client),
		frameworkruntime.WithInformerFactory(opts.Factory),
		frameworkruntime.WithSnapshotSharedLister(c.snap),
		frameworkruntime.WithSharedCSIManager(nodevolumelimits.NewCSIManager(csiNodes)),
	)
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler's framework: %w", err)
	}
	c.fw = fw
	c.synced = Synced(opts.Factory)
	return c, nil
}

// ErrNotReady is returned by Check while the informers the plugins read
// have not synced.
var ErrNotReady = errors.New("kube-scheduler's checks are not ready")

// Ready tells whether the informers the plugins read have synced. The
// coordinator does not wait for them before it schedules: pods that need no
// check go on while RBAC or the API keeps them from syncing.
func (c *Checker) Ready() bool {
	for _, synced := range c.synced {
		if !synced() {
			return false
		}
	}
	return true
}

// Synced are the informers the plugins read.
func Synced(f informers.SharedInformerFactory) []toolscache.InformerSynced {
	return []toolscache.InformerSynced{
		f.Core().V1().PersistentVolumes().Informer().HasSynced,
		f.Core().V1().PersistentVolumeClaims().Informer().HasSynced,
		f.Storage().V1().StorageClasses().Informer().HasSynced,
		f.Storage().V1().CSINodes().Informer().HasSynced,
		f.Storage().V1().CSIDrivers().Informer().HasSynced,
		f.Storage().V1().CSIStorageCapacities().Informer().HasSynced,
		f.Storage().V1().VolumeAttachments().Informer().HasSynced,
	}
}

// Needs tells whether one of the plugins may reject pod on some node: it
// has host ports, volumes kube-scheduler checks, hard spread constraints
// or a required inter-pod (anti-)affinity, or some pod bound or assumed has
// a required anti-affinity. A pod that needs nothing is not checked.
func (c *Checker) Needs(pod *corev1.Pod) bool {
	return c.antiAffinity.Load() > 0 || PodNeeds(pod) || asksOtherResources(pod)
}

// asksOtherResources tells whether pod asks for a resource placement does
// not count: not CPU or memory, nor in the GPU groups NodeResourcesFit
// ignores (ephemeral storage, huge pages, other extended resources).
func asksOtherResources(pod *corev1.Pod) bool {
	other := func(rl corev1.ResourceList) bool {
		for name := range rl {
			switch {
			case name == corev1.ResourceCPU || name == corev1.ResourceMemory:
			case strings.HasPrefix(string(name), "nvidia.com/") || strings.HasPrefix(string(name), "gpufrac.io/"):
			default:
				return true
			}
		}
		return false
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if other(cs[i].Resources.Requests) || other(cs[i].Resources.Limits) {
				return true
			}
		}
	}
	return other(pod.Spec.Overhead) || (pod.Spec.Resources != nil && other(pod.Spec.Resources.Requests))
}

// PodNeeds is Needs without the cluster's anti-affinity: what the pod
// itself asks that the plugins check (predicates.UsesKubeChecks).
func PodNeeds(pod *corev1.Pod) bool { return predicates.UsesKubeChecks(pod) }

// CheckedVolume tells whether kube-scheduler's volume plugins read v
// (predicates.CheckedVolume).
func CheckedVolume(v *corev1.Volume) bool { return predicates.CheckedVolume(v) }

// hasRequiredAntiAffinity tells whether pod has a required pod anti-affinity.
func hasRequiredAntiAffinity(pod *corev1.Pod) bool {
	a := pod.Spec.Affinity
	return a != nil && a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0
}

// counted is what the cache is fed: pods bound to a node and not finished,
// as kube-scheduler's own event handlers feed its cache.
func counted(obj any) bool {
	p, ok := obj.(*corev1.Pod)
	return ok && p.Spec.NodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// PodHandler feeds the cache from a pod informer, as kube-scheduler's own
// event handlers feed its cache: pods bound to a node and not finished. A
// pod assumed (Assume) is confirmed when the informer shows it bound; one
// deleted or finished before it was shown bound is forgotten.
func (c *Checker) PodHandler(logger klog.Logger) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok && counted(p) {
				c.addPod(logger, p)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			if !ok1 || !ok2 {
				return
			}
			switch oc, nc := counted(o), counted(n); {
			case !oc && nc:
				c.addPod(logger, n)
			case oc && nc:
				if err := c.cache.UpdatePod(logger, o, n); err != nil {
					logger.Error(err, "kubecheck: updating a pod in kube-scheduler's cache", "pod", klog.KObj(n))
					return
				}
				if a, b := hasRequiredAntiAffinity(o), hasRequiredAntiAffinity(n); a != b {
					if b {
						c.antiAffinity.Add(1)
					} else {
						c.antiAffinity.Add(-1)
					}
				}
			case oc && !nc:
				c.removePod(logger, o)
			default:
				if n.Status.Phase == corev1.PodSucceeded || n.Status.Phase == corev1.PodFailed {
					c.Forget(logger, n)
				}
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			if counted(p) {
				c.removePod(logger, p)
				return
			}
			c.Forget(logger, p)
		},
	}
}

// addPod adds a pod the informer shows bound, confirming it if assumed.
func (c *Checker) addPod(logger klog.Logger, p *corev1.Pod) {
	c.mu.Lock()
	a, wasAssumed := c.assumed[p.UID]
	delete(c.assumed, p.UID)
	c.mu.Unlock()
	if wasAssumed && a.Spec.NodeName != p.Spec.NodeName {
		// Bound elsewhere than assumed (by someone else): the assumption
		// goes, the pod comes where it is.
		if err := c.cache.ForgetPod(logger, a); err != nil {
			logger.V(2).Info("kubecheck: forgetting an assumed pod", "pod", klog.KObj(p), "err", err)
		}
	}
	if err := c.cache.AddPod(logger, p); err != nil {
		logger.Error(err, "kubecheck: adding a pod to kube-scheduler's cache", "pod", klog.KObj(p))
		return
	}
	if wasAssumed && hasRequiredAntiAffinity(a) {
		c.antiAffinity.Add(-1) // counted by Assume
	}
	if hasRequiredAntiAffinity(p) {
		c.antiAffinity.Add(1)
	}
}

func (c *Checker) removePod(logger klog.Logger, p *corev1.Pod) {
	if err := c.cache.RemovePod(logger, p); err != nil {
		logger.Error(err, "kubecheck: removing a pod from kube-scheduler's cache", "pod", klog.KObj(p))
		return
	}
	if hasRequiredAntiAffinity(p) {
		c.antiAffinity.Add(-1)
	}
}

// NodeHandler feeds the cache from a node informer.
func (c *Checker) NodeHandler(logger klog.Logger) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*corev1.Node); ok {
				c.cache.AddNode(logger, n)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if ok1 && ok2 {
				c.cache.UpdateNode(logger, o, n)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				if err := c.cache.RemoveNode(logger, n); err != nil {
					logger.Error(err, "kubecheck: removing a node from kube-scheduler's cache", "node", klog.KObj(n))
				}
			}
		},
	}
}

// Begin starts a cycle's checks: the snapshot takes the nodes that changed
// since the last one (pods assumed included), as kube-scheduler's
// UpdateSnapshot does at the start of its cycles.
func (c *Checker) Begin(logger klog.Logger) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts, c.index = nil, nil
	c.began = true
	return c.updateLocked(logger)
}

func (c *Checker) updateLocked(logger klog.Logger) error {
	if err := c.cache.UpdateSnapshot(logger, c.snap); err != nil {
		return fmt.Errorf("updating kube-scheduler's snapshot: %w", err)
	}
	c.dirty = false
	return nil
}

// Began tells whether Begin ran since the last End.
func (c *Checker) Began() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.began
}

// End ends the cycle's checks (what was counted for placeholders).
func (c *Checker) End(klog.Logger) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.began = false
	c.counts, c.index = nil, nil
}

// Assume puts pod on node in kube-scheduler's cache (its AssumePod): the
// checks of the pods placed after it see it (spread, anti-affinity, ports,
// volumes in use), in this cycle and the next ones, until the informer
// shows it bound or Forget takes it back (its binding failed, or it was not
// sent to binding).
func (c *Checker) Assume(logger klog.Logger, pod *corev1.Pod, node string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a, ok := c.assumed[pod.UID]; ok {
		if a.Spec.NodeName == node && a.ResourceVersion == pod.ResourceVersion {
			return nil // assumed as it is, where it is
		}
		c.forgetLocked(logger, a)
	}
	p := onNode(pod, node)
	if err := c.cache.AssumePod(logger, p); err != nil {
		return fmt.Errorf("kubecheck: assuming pod %s/%s on %s: %w", pod.Namespace, pod.Name, node, err)
	}
	c.assumed[p.UID] = p
	c.dirty = true
	if hasRequiredAntiAffinity(p) {
		c.antiAffinity.Add(1)
	}
	return nil
}

// AssumedAs is the pod with UID uid as it is assumed in the cache (its
// spec.nodeName the node), nil when it is not assumed.
func (c *Checker) AssumedAs(uid types.UID) *corev1.Pod {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.assumed[uid]
}

// onNode is pod with spec.nodeName node, as kube-scheduler assumes it. A
// shallow copy: the rest is the informer's object, which never changes, and
// which kube-scheduler's cache and plugins only read. A deep copy of every
// pod placed was an eighth of a busy cycle's allocations at 5,000 nodes.
func onNode(pod *corev1.Pod, node string) *corev1.Pod {
	p := *pod
	p.Spec.NodeName = node
	return &p
}

// Forget takes an Assume back (a rolled-back placement, a pod not sent to
// binding, a binding that failed); a pod not assumed is left alone.
func (c *Checker) Forget(logger klog.Logger, pod *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a, ok := c.assumed[pod.UID]; ok {
		c.forgetLocked(logger, a)
	}
}

func (c *Checker) forgetLocked(logger klog.Logger, a *corev1.Pod) {
	delete(c.assumed, a.UID)
	if err := c.cache.ForgetPod(logger, a); err != nil {
		logger.V(2).Info("kubecheck: forgetting an assumed pod", "pod", klog.KObj(a), "err", err)
	}
	c.dirty = true
	if hasRequiredAntiAffinity(a) {
		c.antiAffinity.Add(-1)
	}
}

// PodCheck is one pod's checks in one cycle, after its PreFilter.
type PodCheck struct {
	c     *Checker
	pod   *corev1.Pod
	state *framework.CycleState
	// only: the nodes PreFilter narrowed the pod to (nil: all).
	only sets.Set[string]
	// notNarrowed: why a node outside only is rejected.
	notNarrowed []string
	// rejected: PreFilter found the pod unschedulable on every node, for
	// these reasons.
	rejected []string
	memo     map[string][]string // node -> reasons it was rejected (nil: allowed)
	// pre: PreFilter ran (prefilter); none: it left nothing to check.
	pre, none bool
	// gone: pods taken as gone (Without), by node: the PreFilter state is
	// told of each removal and the node's info is checked without them, as
	// kube-scheduler's preemption checks a node without its victims.
	gone map[string][]*corev1.Pod

	assumedMu sync.Mutex
	assumed   *corev1.Pod // the pod on the node it was reserved on (on)
}

// PreFilters is how many times the PreFilter plugins ran, for a pod each:
// PodTopologySpread's walks every node and its pods.
func (c *Checker) PreFilters() uint64 { return c.preFilters.Load() }

// Check prepares pod's checks against the cycle's snapshot (Begin must have
// run), brought up to date with what was assumed since; the PreFilter
// plugins run on the first node asked about (Allows). It returns nil when no plugin has anything to check
// for pod: every node is allowed. An error means a plugin failed (not a
// rejection): the pod cannot be checked this cycle.
func (c *Checker) Check(ctx context.Context, pod *corev1.Pod) (*PodCheck, error) {
	if !c.Needs(pod) {
		return nil, nil
	}
	if !c.Ready() {
		return nil, fmt.Errorf("%w: PersistentVolumes, PersistentVolumeClaims, StorageClasses and CSI objects are not read yet (can the coordinator list and watch them?)", ErrNotReady)
	}
	c.mu.Lock()
	if c.dirty {
		if err := c.updateLocked(klog.FromContext(ctx)); err != nil {
			c.mu.Unlock()
			return nil, err
		}
	}
	c.mu.Unlock()
	return &PodCheck{c: c, pod: pod, memo: map[string][]string{}}, nil
}

// Without is pc as if the pods victims (bound) were gone: what reclaim asks
// before it evicts them. The result only answers Allows; nothing is
// reserved with it.
func (pc *PodCheck) Without(victims []*corev1.Pod) *PodCheck {
	if pc == nil || len(victims) == 0 {
		return pc
	}
	out := &PodCheck{c: pc.c, pod: pc.pod, memo: map[string][]string{}, gone: map[string][]*corev1.Pod{}}
	for _, v := range victims {
		if v.Spec.NodeName != "" {
			out.gone[v.Spec.NodeName] = append(out.gone[v.Spec.NodeName], v)
		}
	}
	return out
}

// prefilter runs the PreFilter plugins, once, on the first node asked about:
// a pod that waits for GPUs (no node has room for it) never pays them, and
// pays them again in each cycle only when a node could take it.
func (pc *PodCheck) prefilter(ctx context.Context) {
	if pc.pre {
		return
	}
	pc.pre = true
	pc.c.preFilters.Add(1)
	pc.state = framework.NewCycleState()
	res, st, narrowedBy := pc.c.fw.RunPreFilterPlugins(ctx, pc.state, pc.pod)
	if st.IsSuccess() {
		st = pc.removeGone(ctx)
	}
	switch {
	case st.IsSuccess():
	case st.IsRejected():
		pc.rejected = st.Reasons()
		if len(pc.rejected) == 0 {
			pc.rejected = []string{fmt.Sprintf("rejected by %s", st.Plugin())}
		}
		return
	default:
		pc.rejected = []string{fmt.Sprintf("kube-scheduler's PreFilter failed (%v)", st.AsError())}
		return
	}
	if !res.AllNodes() {
		pc.only = res.NodeNames
		pc.notNarrowed = []string{fmt.Sprintf("node(s) didn't satisfy plugin(s) %v", sets.List(narrowedBy))}
		return
	}
	// NodeResourcesFit never skips itself: with nothing else to check and
	// no resource placement does not count, there is nothing to check.
	skipped := pc.state.GetSkipFilterPlugins()
	pc.none = skipped.Len() >= len(FilterPlugins) || (skipped.Len() == len(FilterPlugins)-1 && !skipped.Has(names.NodeResourcesFit) && !asksOtherResources(pc.pod))
}

// removeGone tells the PreFilter state of each pod taken as gone
// (PreFilterExtensions.RemovePod: spread counts, anti-affinity terms).
func (pc *PodCheck) removeGone(ctx context.Context) *fwk.Status {
	for node, pods := range pc.gone {
		ni, err := pc.c.snap.NodeInfos().Get(node)
		if err != nil {
			continue
		}
		for _, v := range pods {
			pi, err := framework.NewPodInfo(v)
			if err != nil {
				return fwk.AsStatus(err)
			}
			if st := pc.c.fw.RunPreFilterExtensionRemovePod(ctx, pc.state, pc.pod, pi, ni); !st.IsSuccess() {
				return st
			}
		}
	}
	return nil
}

// active tells whether the pod's PreFilter ran and left something to do
// for Reserve and PreBind.
func (pc *PodCheck) active() bool {
	return pc != nil && pc.pre && pc.state != nil && !pc.none && pc.rejected == nil
}

// Allows runs the Filter plugins for the pod on node. When the node is
// rejected, reasons say why in kube-scheduler's words.
func (pc *PodCheck) Allows(ctx context.Context, node string) (bool, []string) {
	if pc == nil {
		return true, nil
	}
	pc.prefilter(ctx)
	if pc.none {
		return true, nil
	}
	if pc.rejected != nil {
		return false, pc.rejected
	}
	if pc.only != nil && !pc.only.Has(node) {
		return false, pc.notNarrowed
	}
	if r, ok := pc.memo[node]; ok {
		return r == nil, r
	}
	r := pc.filter(ctx, node)
	pc.memo[node] = r
	return r == nil, r
}

func (pc *PodCheck) filter(ctx context.Context, node string) []string {
	if pc.only != nil && !pc.only.Has(node) {
		return pc.notNarrowed
	}
	info, err := pc.c.snap.NodeInfos().Get(node)
	if err != nil || info.Node() == nil {
		// A node the informer showed the coordinator before it reached
		// kube-scheduler's cache: checked in the next cycle.
		return []string{"node(s) were not yet known to the scheduler's cache"}
	}
	if gone := pc.gone[node]; len(gone) > 0 {
		clone := info.Snapshot()
		if ni, ok := clone.(*framework.NodeInfo); ok {
			for _, v := range gone {
				_ = ni.RemovePod(klog.FromContext(ctx), v)
			}
		}
		info = clone
	}
	st := pc.c.fw.RunFilterPlugins(ctx, pc.state, pc.pod, info)
	if st.IsSuccess() {
		return nil
	}
	reasons := st.Reasons()
	if len(reasons) == 0 {
		reasons = []string{fmt.Sprintf("node(s) were rejected by %s", st.Plugin())}
	}
	return reasons
}

// Reserve reserves the pod's volumes on node (kube-scheduler's assume cache
// of PVs and PVCs), so later pods' checks see them taken. As in
// kube-scheduler, Reserve and what follows it see the pod assumed on the
// node (spec.nodeName set): VolumeBinding's PreBind reads the node by it.
func (pc *PodCheck) Reserve(ctx context.Context, node string) error {
	if !pc.active() {
		return nil
	}
	if st := pc.c.fw.RunReservePluginsReserve(ctx, pc.state, pc.on(node), node); !st.IsSuccess() {
		return fmt.Errorf("reserving the volumes of pod %s/%s on %s: %w", pc.pod.Namespace, pc.pod.Name, node, st.AsError())
	}
	return nil
}

// on is the pod assumed on node, made once per node.
func (pc *PodCheck) on(node string) *corev1.Pod {
	pc.assumedMu.Lock()
	defer pc.assumedMu.Unlock()
	if pc.assumed == nil || pc.assumed.Spec.NodeName != node {
		pc.assumed = onNode(pc.pod, node)
	}
	return pc.assumed
}

// Unreserve takes a Reserve back.
func (pc *PodCheck) Unreserve(ctx context.Context, node string) {
	if !pc.active() {
		return
	}
	pc.c.fw.RunReservePluginsUnreserve(ctx, pc.state, pc.on(node), node)
}

// NeedsPreBind tells whether PreBind has volumes to bind (after Reserve).
func (pc *PodCheck) NeedsPreBind(ctx context.Context, node string) bool {
	if !pc.active() {
		return false
	}
	st := pc.c.fw.RunPreBindPreFlights(ctx, pc.state, pc.on(node), node)
	return st.IsSuccess()
}

// PreBind binds the pod's volumes reserved on node and waits until the PV
// controller has finished: the pod is bound only after.
func (pc *PodCheck) PreBind(ctx context.Context, node string) error {
	if !pc.active() {
		return nil
	}
	if st := pc.c.fw.RunPreBindPlugins(ctx, pc.state, pc.on(node), node); !st.IsSuccess() {
		return fmt.Errorf("binding the volumes of pod %s/%s on %s: %w", pc.pod.Namespace, pc.pod.Name, node, st.AsError())
	}
	return nil
}

// Histogram renders reasons counted by node as kube-scheduler's FitError
// does ("2 node(s) didn't match pod topology spread constraints, 1 ...").
func Histogram(counts map[string]int) string {
	parts := make([]string, 0, len(counts))
	for r, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, r))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
