package scheduler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
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

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/kubecheck"
)

// The differential test: generated clusters and pending pods, placed by one
// coordinator cycle (with Deps.Kube, a real kubecheck.Checker) and judged by
// kube-scheduler's full default Filter set run on its own snapshot. The GPU
// never decides: every pod asks one whole GPU and every node has eight,
// with at most a few taken.

// oracleFilters is kube-scheduler's default Filter set (v1.36, its default
// profile's filter plugins, in order; DynamicResources aside: no pod here
// has resource claims).
var oracleFilters = []string{
	names.NodeUnschedulable,
	names.NodeName,
	names.TaintToleration,
	names.NodeAffinity,
	names.NodePorts,
	names.NodeResourcesFit,
	names.VolumeRestrictions,
	names.NodeVolumeLimits,
	names.VolumeBinding,
	names.VolumeZone,
	names.PodTopologySpread,
	names.InterPodAffinity,
}

// swapLister is the oracle's snapshot, swapped for each question: the
// plugins keep the lister they were built with and ask it each time.
type swapLister struct{ s *internalcache.Snapshot }

func (l *swapLister) NodeInfos() fwk.NodeInfoLister           { return l.s.NodeInfos() }
func (l *swapLister) StorageInfos() fwk.StorageInfoLister     { return l.s.StorageInfos() }
func (l *swapLister) PodGroupStates() fwk.PodGroupStateLister { return l.s.PodGroupStates() }

// oracle is kube-scheduler's framework with oracleFilters (each enabled at
// every extension point it has, as kube-scheduler's MultiPoint does), with
// the default configuration of kube-scheduler v1.36 (latest.Default), on a
// snapshot made by internalcache.NewSnapshot.
type oracle struct {
	fw     framework.Framework
	lister *swapLister
}

func newOracle(ctx context.Context, client *fake.Clientset, factory informers.SharedInformerFactory) (*oracle, error) {
	cfg, err := latest.Default()
	if err != nil {
		return nil, err
	}
	profile := cfg.Profiles[0]
	profile.SchedulerName = "oracle"
	for i := range profile.PluginConfig {
		if args, ok := profile.PluginConfig[i].Args.(*config.PodTopologySpreadArgs); ok {
			// The system default constraints are ScheduleAnyway: they only
			// score (and would need Services and ReplicaSets).
			args.DefaultingType = config.ListDefaulting
			args.DefaultConstraints = nil
		}
	}
	var mp config.PluginSet
	for _, n := range append([]string{names.PrioritySort, names.DefaultBinder}, oracleFilters...) {
		mp.Enabled = append(mp.Enabled, config.Plugin{Name: n})
	}
	profile.Plugins = &config.Plugins{MultiPoint: mp}
	l := &swapLister{s: internalcache.NewEmptySnapshot()}
	fw, err := frameworkruntime.NewFramework(ctx, plugins.NewInTreeRegistry(), &profile,
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(factory),
		frameworkruntime.WithSnapshotSharedLister(l),
		frameworkruntime.WithSharedCSIManager(nodevolumelimits.NewCSIManager(factory.Storage().V1().CSINodes().Lister())),
	)
	if err != nil {
		return nil, err
	}
	for _, n := range oracleFilters {
		if !fw.HasFilterPlugins() || !slices.Contains(filterNames(fw), n) {
			return nil, fmt.Errorf("oracle: filter plugin %s not enabled (have %v)", n, filterNames(fw))
		}
	}
	return &oracle{fw: fw, lister: l}, nil
}

func filterNames(fw framework.Framework) []string {
	var out []string
	for _, p := range fw.ListPlugins().Filter.Enabled {
		out = append(out, p.Name)
	}
	return out
}

// judge runs PreFilter and then Filter on every node for pod, on the
// cluster of nodes and the (bound) pods, as kube-scheduler's
// findNodesThatFitPod does: node -> the reasons it is rejected (nil when
// it fits).
func (o *oracle) judge(ctx context.Context, pod *corev1.Pod, pods []*corev1.Pod, nodes []*corev1.Node) (map[string][]string, error) {
	o.lister.s = internalcache.NewSnapshot(pods, nodes)
	state := framework.NewCycleState()
	res, st, _ := o.fw.RunPreFilterPlugins(ctx, state, pod)
	out := map[string][]string{}
	if !st.IsSuccess() {
		if !st.IsRejected() {
			return nil, fmt.Errorf("oracle PreFilter: %w", st.AsError())
		}
		for _, n := range nodes {
			out[n.Name] = append([]string{"PreFilter " + st.Plugin() + ":"}, st.Reasons()...)
		}
		return out, nil
	}
	for _, n := range nodes {
		if !res.AllNodes() && !res.NodeNames.Has(n.Name) {
			out[n.Name] = []string{"PreFilter narrowed the nodes"}
			continue
		}
		info, err := o.lister.s.NodeInfos().Get(n.Name)
		if err != nil {
			return nil, err
		}
		st := o.fw.RunFilterPlugins(ctx, state, pod, info)
		switch {
		case st.IsSuccess():
			out[n.Name] = nil
		case st.IsRejected():
			out[n.Name] = append([]string{st.Plugin() + ":"}, st.Reasons()...)
		default:
			return nil, fmt.Errorf("oracle Filter on %s: %w", n.Name, st.AsError())
		}
	}
	return out, nil
}

// diffCase is one generated cluster: nodes, bound pods, pending pods and
// the volume objects (PVs, PVCs, StorageClasses).
type diffCase struct {
	seed    uint64
	policy  string
	nodes   []*corev1.Node
	bound   []*corev1.Pod
	pending []*corev1.Pod
	objs    []runtime.Object
}

var (
	diffApps  = []string{"web", "db", "cache"}
	hostPorts = []int32{8000, 8001, 9000}
)

// genCase makes case seed with npending pending pods.
func genCase(seed uint64, npending int) diffCase {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	chance := func(pct int) bool { return r.IntN(100) < pct }
	policies := []string{"gpufrac", "binpack", "spread", "bestfit"}
	tc := diffCase{seed: seed, policy: policies[seed%uint64(len(policies))]}

	nn := 2 + r.IntN(4)
	for i := range nn {
		n := h100Node(fmt.Sprintf("n%d", i), "a", 8)
		if !chance(10) {
			n.Labels[corev1.LabelTopologyZone] = pick("z1", "z2", "z3")
		}
		n.Labels["disk"] = pick("ssd", "hdd")
		n.Labels["tier"] = pick("gold", "silver")
		switch r.IntN(10) {
		case 0, 1:
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule})
		case 2:
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "special", Value: "true", Effect: corev1.TaintEffectNoExecute})
		case 3:
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "soft", Value: "x", Effect: corev1.TaintEffectPreferNoSchedule})
		}
		if chance(5) {
			n.Spec.Unschedulable = true
		}
		tc.nodes = append(tc.nodes, n)
	}
	nodeName := func() string { return tc.nodes[r.IntN(nn)].Name }
	topoKey := func() string {
		if chance(50) {
			return corev1.LabelHostname
		}
		return corev1.LabelTopologyZone
	}
	app := func() map[string]string { return map[string]string{"app": pick(diffApps...)} }
	classes := map[string]bool{}
	pvc := func(name string, rwop bool) *corev1.PersistentVolumeClaim {
		var pv *corev1.PersistentVolume
		var c *corev1.PersistentVolumeClaim
		if chance(70) {
			c, pv = boundPair(name, "pv-"+name, nodeName(), "local")
		} else {
			// A zonal volume (VolumeZone), no node affinity.
			zone := pick("z1", "z2", "z3")
			c, pv = boundPair(name, "pv-"+name, "", "zonal")
			pv.Spec.NodeAffinity = nil
			pv.Spec.Local = nil
			pv.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/data/" + name}
			pv.Labels = map[string]string{corev1.LabelTopologyZone: zone}
		}
		if rwop {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
			pv.Spec.AccessModes = c.Spec.AccessModes
		}
		classes[*c.Spec.StorageClassName] = true
		tc.objs = append(tc.objs, c, pv)
		return c
	}
	gcePD := func(p *corev1.Pod, disk string) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "pd-" + disk, VolumeSource: corev1.VolumeSource{
			GCEPersistentDisk: &corev1.GCEPersistentDiskVolumeSource{PDName: disk}}})
	}

	nb := r.IntN(7)
	var claims []string // claims of bound pods (RWOP may conflict)
	for i := range nb {
		p := kpod(fmt.Sprintf("b%d", i), i, app())
		if chance(30) {
			withHostPort(p, hostPorts[r.IntN(len(hostPorts))])
		}
		if chance(20) {
			antiAffine(p, topoKey(), app())
		}
		if chance(15) {
			c := pvc(fmt.Sprintf("b%d-data", i), chance(50))
			withClaim(p, c.Name)
			claims = append(claims, c.Name)
		}
		if chance(10) {
			gcePD(p, pick("disk-1", "disk-2"))
		}
		tc.bound = append(tc.bound, admitted(p, nodeName()))
	}

	for i := range npending {
		labels := app()
		p := kpod(fmt.Sprintf("p%d", i), nb+i, labels)
		if chance(35) {
			withHostPort(p, hostPorts[r.IntN(len(hostPorts))])
		}
		if chance(25) {
			sel := labels
			if chance(30) {
				sel = app()
			}
			spreadOver(p, corev1.LabelTopologyZone, int32(1+r.IntN(2)), sel)
		}
		if chance(15) {
			spreadOver(p, corev1.LabelHostname, 1, labels)
		}
		if chance(30) {
			antiAffine(p, topoKey(), app())
		}
		if chance(20) {
			affine(p, topoKey(), app())
		}
		if chance(20) {
			p.Spec.NodeSelector = map[string]string{"disk": "ssd"}
		}
		if chance(15) {
			op := corev1.NodeSelectorOpIn
			if chance(50) {
				op = corev1.NodeSelectorOpNotIn
			}
			p.Spec.Affinity = withNodeAffinity(p.Spec.Affinity, corev1.NodeSelectorRequirement{Key: "tier", Operator: op, Values: []string{"gold"}})
		}
		if chance(5) {
			p.Spec.Affinity = withNodeAffinity(p.Spec.Affinity, corev1.NodeSelectorRequirement{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpExists})
		}
		if chance(35) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "ml", Effect: corev1.TaintEffectNoSchedule})
		}
		if chance(10) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: "special", Operator: corev1.TolerationOpExists})
		}
		if chance(3) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists})
		}
		switch {
		case len(claims) > 0 && chance(10):
			withClaim(p, claims[r.IntN(len(claims))]) // maybe a ReadWriteOncePod claim in use
		case chance(25):
			withClaim(p, pvc(fmt.Sprintf("p%d-data", i), chance(20)).Name)
		}
		if chance(8) {
			gcePD(p, pick("disk-1", "disk-2"))
		}
		tc.pending = append(tc.pending, p)
	}
	for c := range classes {
		tc.objs = append(tc.objs, storageClass(c, noProvisioner, "WaitForFirstConsumer"))
	}
	return tc
}

func withNodeAffinity(a *corev1.Affinity, req corev1.NodeSelectorRequirement) *corev1.Affinity {
	if a == nil {
		a = &corev1.Affinity{}
	}
	if a.NodeAffinity == nil {
		a.NodeAffinity = &corev1.NodeAffinity{}
	}
	ns := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	if ns == nil {
		ns = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = ns
	}
	ns.NodeSelectorTerms[0].MatchExpressions = append(ns.NodeSelectorTerms[0].MatchExpressions, req)
	return a
}

// diffOutcome is what one case came to.
type diffOutcome struct {
	placed     int // pending pods the coordinator bound
	pending    int // pending pods it left pending
	infeasible int // pending pods left pending that the oracle finds no node for either
	// cordoned: pending pods the oracle would place only on cordoned nodes
	// (see runDiffCase).
	cordoned   int
	violations []string
}

// runDiffCase runs one coordinator cycle over tc (with kube-scheduler's
// checks unless noKube) and judges each binding, in the order the cycle
// placed them, on the cluster as it was plus the pods placed before it; and,
// when exact (one pending pod), each pod left pending.
func runDiffCase(t *testing.T, tc diffCase, noKube bool) diffOutcome {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	all := append([]runtime.Object{}, tc.objs...)
	for _, n := range tc.nodes {
		all = append(all, n.DeepCopy())
	}
	for _, p := range append(slices.Clone(tc.bound), tc.pending...) {
		all = append(all, p.DeepCopy())
	}
	client := fake.NewClientset(all...)
	factory := informers.NewSharedInformerFactory(client, 0)
	var kube *kubecheck.Checker
	if !noKube {
		k, err := kubecheck.New(ctx, kubecheck.Options{Factory: factory, Client: client, BindTimeoutSeconds: 1})
		if err != nil {
			t.Fatal(err)
		}
		kube = k
	}
	orc, err := newOracle(ctx, client, factory)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	synced := kubecheck.Synced(factory)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		done := true
		for _, s := range synced {
			done = done && s()
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("informers not synced")
		}
	}
	deps := Deps{Queues: staticQueues([]*v1alpha1.Queue{queueOf("q", "1000")})}
	if kube != nil {
		logger := klog.Background()
		ph, nh := kube.PodHandler(logger), kube.NodeHandler(logger)
		for _, n := range tc.nodes {
			nh.OnAdd(n, true)
		}
		for _, p := range tc.bound {
			ph.OnAdd(p, true)
		}
		deps.Kube = kube
	}
	c := newClusterWith(t, Options{Policy: tc.policy, BindWorkers: 1}, deps, tc.nodes, append(slices.Clone(tc.bound), tc.pending...)...)
	if _, err := c.s.Cycle(ctx); err != nil {
		t.Fatalf("seed %d: cycle: %v", tc.seed, err)
	}
	var out diffOutcome
	pods := slices.Clone(tc.bound)
	bound := map[string]bool{}
	for done := false; !done; {
		select {
		case task := <-c.s.binds:
			verdict, err := orc.judge(ctx, task.pod, pods, tc.nodes)
			if err != nil {
				t.Fatalf("seed %d: %v", tc.seed, err)
			}
			if why := verdict[task.node]; why != nil {
				out.violations = append(out.violations, fmt.Sprintf("%s placed on %s, which kube-scheduler rejects: %v (it allows %v)",
					task.pod.Name, task.node, why, allowedNodes(verdict)))
			}
			if err := c.s.runBind(ctx, task); err != nil {
				out.violations = append(out.violations, fmt.Sprintf("%s: binding to %s failed: %v", task.pod.Name, task.node, err))
				continue
			}
			p := task.pod.DeepCopy()
			p.Spec.NodeName = task.node
			pods = append(pods, p)
			bound[p.Name] = true
			out.placed++
		default:
			done = true
		}
	}
	cordoned := map[string]bool{}
	for _, n := range tc.nodes {
		cordoned[n.Name] = n.Spec.Unschedulable
	}
	for _, p := range tc.pending {
		if bound[p.Name] {
			continue
		}
		out.pending++
		verdict, err := orc.judge(ctx, p, pods, tc.nodes)
		if err != nil {
			t.Fatalf("seed %d: %v", tc.seed, err)
		}
		ok := allowedNodes(verdict)
		if len(ok) == 0 {
			out.infeasible++
			continue
		}
		// A known difference, by design: kube-scheduler's NodeUnschedulable
		// lets a pod that tolerates node.kubernetes.io/unschedulable
		// (here: one that tolerates every taint) onto a cordoned node; the
		// coordinator never places a pod on one (state.Build leaves
		// cordoned nodes out: a cordon is how a node is drained).
		if !slices.ContainsFunc(ok, func(n string) bool { return !cordoned[n] }) {
			out.cordoned++
			continue
		}
		if len(tc.pending) == 1 {
			r, m := c.b.Reason(p.Name)
			out.violations = append(out.violations, fmt.Sprintf("%s left pending (%s: %s), kube-scheduler allows %v", p.Name, r, m, ok))
		}
	}
	return out
}

// allowedNodes are the nodes a verdict allows, sorted.
func allowedNodes(verdict map[string][]string) []string {
	var out []string
	for n, why := range verdict {
		if why == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// violationKind is the plugin and reason a violation of runDiffCase names
// ("InterPodAffinity: node(s) didn't satisfy existing pods anti-affinity
// rules"), or "left pending".
func violationKind(v string) string {
	const mark = "which kube-scheduler rejects: ["
	i := strings.Index(v, mark)
	if i < 0 {
		return "left pending"
	}
	rest := v[i+len(mark):]
	if j := strings.Index(rest, "] ("); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// describe prints a case compactly, for a failure's message.
func (tc diffCase) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "case seed %d, policy %s\n", tc.seed, tc.policy)
	for _, n := range tc.nodes {
		fmt.Fprintf(&b, "  node %s zone=%q disk=%s tier=%s taints=%v unschedulable=%v\n", n.Name,
			n.Labels[corev1.LabelTopologyZone], n.Labels["disk"], n.Labels["tier"], taintsOf(n), n.Spec.Unschedulable)
	}
	for _, p := range tc.bound {
		fmt.Fprintf(&b, "  bound %s on %s: %s\n", p.Name, p.Spec.NodeName, podSummary(p))
	}
	for _, p := range tc.pending {
		fmt.Fprintf(&b, "  pending %s: %s\n", p.Name, podSummary(p))
	}
	for _, o := range tc.objs {
		switch o := o.(type) {
		case *corev1.PersistentVolumeClaim:
			fmt.Fprintf(&b, "  pvc %s -> %s %v\n", o.Name, o.Spec.VolumeName, o.Spec.AccessModes)
		case *corev1.PersistentVolume:
			where := fmt.Sprint(o.Labels)
			if o.Spec.NodeAffinity != nil {
				where = o.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]
			}
			fmt.Fprintf(&b, "  pv %s on %s\n", o.Name, where)
		}
	}
	return b.String()
}

func taintsOf(n *corev1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		out = append(out, t.ToString())
	}
	return out
}

func podSummary(p *corev1.Pod) string {
	var parts []string
	parts = append(parts, fmt.Sprintf("labels=%v", p.Labels["app"]))
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.HostPort > 0 {
				parts = append(parts, fmt.Sprintf("hostPort=%d", port.HostPort))
			}
		}
	}
	for _, s := range p.Spec.TopologySpreadConstraints {
		parts = append(parts, fmt.Sprintf("spread(%s skew %d %v)", s.TopologyKey, s.MaxSkew, s.LabelSelector.MatchLabels))
	}
	if a := p.Spec.Affinity; a != nil {
		if a.PodAntiAffinity != nil {
			for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
				parts = append(parts, fmt.Sprintf("anti(%s %v)", term.TopologyKey, term.LabelSelector.MatchLabels))
			}
		}
		if a.PodAffinity != nil {
			for _, term := range a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
				parts = append(parts, fmt.Sprintf("affinity(%s %v)", term.TopologyKey, term.LabelSelector.MatchLabels))
			}
		}
		if a.NodeAffinity != nil {
			parts = append(parts, fmt.Sprintf("nodeAffinity(%v)", a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions))
		}
	}
	if len(p.Spec.NodeSelector) > 0 {
		parts = append(parts, fmt.Sprintf("nodeSelector=%v", p.Spec.NodeSelector))
	}
	for _, t := range p.Spec.Tolerations {
		parts = append(parts, fmt.Sprintf("tolerates(%s %s %s %s)", t.Key, t.Operator, t.Value, t.Effect))
	}
	for _, v := range p.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			parts = append(parts, "pvc="+v.PersistentVolumeClaim.ClaimName)
		case v.GCEPersistentDisk != nil:
			parts = append(parts, "gcePD="+v.GCEPersistentDisk.PDName)
		}
	}
	return strings.Join(parts, " ")
}

// diffCases is how many cases the differential tests run (fewer with -short).
func diffCases() int {
	if testing.Short() {
		return 50
	}
	return 400
}

// TestCoordinatorAgreesWithKubeScheduler: for generated clusters (nodes
// with zones, labels, taints, some cordoned; bound pods with labels, host
// ports, anti-affinity, claims and disks) and one pending pod (host ports,
// zone and hostname spread, pod (anti-)affinity, node selector and
// affinity, tolerations, claims bound to local or zonal PVs, ReadWriteOncePod
// claims, GCE disks), the coordinator's cycle and kube-scheduler's full
// default Filter set agree: every node the coordinator binds a pod to passes
// every filter, and a pod kube-scheduler finds a node for is not left
// pending. The GPU never decides (one asked, eight per node).
//
// Its subtest runs the same cases without Deps.Kube, and shows that the test
// can fail: the coordinator before issue 28 disagrees.
func TestCoordinatorAgreesWithKubeScheduler(t *testing.T) {
	n := diffCases()
	var placed, pending, infeasible, cordoned, bad int
	for seed := range uint64(n) {
		tc := genCase(seed, 1)
		o := runDiffCase(t, tc, false)
		placed, pending, infeasible, cordoned = placed+o.placed, pending+o.pending, infeasible+o.infeasible, cordoned+o.cordoned
		if len(o.violations) > 0 {
			bad++
			t.Errorf("seed %d: %s\n%s", seed, strings.Join(o.violations, "\n"), tc.describe())
		}
	}
	t.Logf("%d cases: %d pods bound, %d left pending (%d of them infeasible for kube-scheduler too, %d feasible only on a cordoned node), %d cases in disagreement",
		n, placed, pending, infeasible, cordoned, bad)
	if pending == 0 || placed == 0 || infeasible == 0 {
		t.Errorf("the generator made %d bound and %d pending pods (%d infeasible): it should make both", placed, pending, infeasible)
	}

	t.Run("without kube checks fails", func(t *testing.T) {
		var violations, bad int
		var first string
		kinds := map[string]int{}
		for seed := range uint64(n) {
			tc := genCase(seed, 1)
			o := runDiffCase(t, tc, true)
			violations += len(o.violations)
			for _, v := range o.violations {
				kinds[violationKind(v)]++
			}
			if len(o.violations) > 0 {
				bad++
				if first == "" {
					first = fmt.Sprintf("seed %d: %s", seed, o.violations[0])
				}
			}
		}
		t.Logf("without Deps.Kube: %d violations in %d of %d cases, by the plugin that rejects the node: %v; the first: %s", violations, bad, n, kinds, first)
		if violations == 0 {
			t.Error("without kube-scheduler's checks the coordinator agreed with kube-scheduler on every case: the differential test cannot fail")
		}
	})
}

// TestCoordinatorAgreesWithKubeSchedulerInABurst: the same with three to
// five pending pods per case, placed in one cycle. Each binding is judged on
// the cluster plus the pods the cycle placed before it (pods left pending
// are not judged: with several, whether one had a node depends on the
// order).
func TestCoordinatorAgreesWithKubeSchedulerInABurst(t *testing.T) {
	n := diffCases() / 2
	var placed, bad int
	kinds := map[string]int{}
	for seed := range uint64(n) {
		tc := genCase(1_000_000+seed, 3+int(seed%3))
		o := runDiffCase(t, tc, false)
		placed += o.placed
		for _, v := range o.violations {
			kinds[violationKind(v)]++
		}
		if len(o.violations) > 0 {
			bad++
			t.Errorf("seed %d: %s\n%s", tc.seed, strings.Join(o.violations, "\n"), tc.describe())
		}
	}
	t.Logf("%d cases: %d pods bound, %d cases in disagreement, by the plugin that rejects the node: %v", n, placed, bad, kinds)
}
