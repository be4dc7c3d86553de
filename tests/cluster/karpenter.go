package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	nodedra "github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// CRDResource is apiextensions.k8s.io/v1 CustomResourceDefinitions.
func CRDResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
}

// NodePoolResource is Karpenter's karpenter.sh/v1 NodePools.
func NodePoolResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodepools"}
}

// NodeClaimResource is Karpenter's karpenter.sh/v1 NodeClaims.
func NodeClaimResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodeclaims"}
}

// KWOKNodeClassResource is the kwok provider's karpenter.kwok.sh/v1alpha1 KWOKNodeClasses.
func KWOKNodeClassResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "karpenter.kwok.sh", Version: "v1alpha1", Resource: "kwoknodeclasses"}
}

const (
	// NodeClassName is the name of the KWOKNodeClass every NodePool refers to.
	NodeClassName = "default"
	// DefaultConsolidateAfter is NodePool.ConsolidateAfter's zero value: short, so tests
	// see empty nodes go quickly.
	DefaultConsolidateAfter = 5 * time.Second
	// DefaultZone is the zone of an InstanceType without Zones.
	DefaultZone = "test-zone-a"
	// H100Product is the nvidia.com/gpu.product value of the default H100 instance types.
	H100Product = "NVIDIA-H100-80GB-HBM3"
)

// KarpenterOptions configures Karpenter's kwok provider.
type KarpenterOptions struct {
	// InstanceTypes is what the fake cloud sells. Empty means DefaultInstanceTypes().
	InstanceTypes []InstanceType
	// NodePools are created before Karpenter starts. Empty means DefaultNodePools(InstanceTypes).
	NodePools []NodePool
	// DRARequests runs Karpenter with --ignore-dra-requests=false: it then
	// simulates pods' resource claims against the published ResourceSlices
	// and the instance types' device templates (InstanceType.DRAGPUs).
	// False keeps Karpenter's default (claims are not simulated: pods with
	// claims get no capacity).
	DRARequests bool
}

// GPUCountLabel is the label with a GPU type's GPU count that every GPU
// offering carries, as AWS's provider gives its GPU types
// karpenter.k8s.aws/instance-gpu-count: what the coordinator's placeholders
// read by default (--gpu-count-label). The provider then puts it on the
// nodes it creates and takes it for a well-known label.
const GPUCountLabel = placeholder.DefaultGPUCountLabel

// Karpenter's capacity-type label and its values.
const (
	LabelCapacityType = "karpenter.sh/capacity-type"
	CapacitySpot      = "spot"
	CapacityOnDemand  = "on-demand"
)

// InstanceType is one machine type of the fake cloud. It becomes one entry of the
// provider's instance-types JSON (the format of its kwok/cloudprovider/instance_types.json),
// with one on-demand offering per zone (and a spot one where SpotPrice is set),
// labelled with its GPU count (GPUCountLabel).
type InstanceType struct {
	// Name is the instance type (node label node.kubernetes.io/instance-type).
	Name string
	// Resources is the machine's capacity: cpu, memory, pods (default 110), nvidia.com/gpu...
	Resources corev1.ResourceList
	// Price is the on-demand price per hour; Karpenter launches the cheapest type that fits.
	Price float64
	// SpotPrice, when set, adds a spot offering in each zone at this price
	// per hour; it must be below Price. For a NodePool that allows both
	// capacity types (CapacityTypes) the kwok provider launches the cheapest
	// offering the NodeClaim allows, so spot while it is offered (AWS's
	// provider prefers spot whenever a NodePool allows it). The provider
	// marks every offering available, so spot capacity running short is
	// modelled by withdrawing the offering (SetInstanceTypes without it).
	SpotPrice float64
	// Zones are the zones offering the type. Empty means DefaultZone.
	Zones []string
	// GPUProduct, when set, is added to every offering's requirements as
	// nvidia.com/gpu.product In [GPUProduct]. The provider then copies it onto the nodes
	// it creates, and Karpenter treats the key as well known, so pods may select on it.
	GPUProduct string
	// DRAGPUs, when set, is the number of mock H100s the type's nodes serve
	// through gpufrac's DRA driver (a node pool in mode dra, fraction views):
	// the provider learns their devices from ResourceSliceTemplates built by
	// the driver's own builder (deviceplugin/dra.Build), so the templates are
	// what gpufrac-node will publish. Such a type lists no nvidia.com/gpu.
	DRAGPUs int
}

// gpus is the type's GPU count: its nvidia.com/gpu, else DRAGPUs.
func (it InstanceType) gpus() int {
	if q, ok := it.Resources[api.ResourceGPU]; ok && q.Value() > 0 {
		return int(q.Value())
	}
	return max(it.DRAGPUs, 0)
}

// NodePool is a Karpenter NodePool using the cluster's KWOKNodeClass.
type NodePool struct {
	// Name is the NodePool's name (node label karpenter.sh/nodepool).
	Name string
	// Labels are put on every node of the pool (use api.LabelGPUNode: "true" for GPU pools
	// so that Options.OnNode sees their nodes).
	Labels map[string]string
	// Taints are put on every node of the pool.
	Taints []corev1.Taint
	// InstanceTypes restricts the pool to these instance types. Empty means any.
	InstanceTypes []string
	// Requirements are added to the pool's requirements (os linux and the
	// capacity types are always there).
	Requirements []corev1.NodeSelectorRequirement
	// CapacityTypes are the pool's karpenter.sh/capacity-type values: "spot",
	// "on-demand". Empty means on-demand only.
	CapacityTypes []string
	// ConsolidationPolicy is WhenEmpty or WhenEmptyOrUnderutilized (the default).
	ConsolidationPolicy string
	// ConsolidateAfter is how long a node must be consolidatable before Karpenter acts.
	// Zero means DefaultConsolidateAfter; negative means Never.
	ConsolidateAfter time.Duration
	// Weight orders pools when several fit (higher first).
	Weight int32
	// Limits caps the pool's total resources. Empty means no limit.
	Limits corev1.ResourceList
}

// DefaultInstanceTypes returns an 8×H100 machine, a 1×H100 machine (dearer per GPU)
// and a CPU-only machine.
func DefaultInstanceTypes() []InstanceType {
	return []InstanceType{
		{
			Name: "gpu-8x-h100",
			Resources: ResourceList(map[corev1.ResourceName]string{
				corev1.ResourceCPU: "192", corev1.ResourceMemory: "2048Gi", corev1.ResourcePods: "110", api.ResourceGPU: "8",
			}),
			Price:      98.32,
			GPUProduct: H100Product,
		},
		{
			Name: "gpu-1x-h100",
			Resources: ResourceList(map[corev1.ResourceName]string{
				corev1.ResourceCPU: "26", corev1.ResourceMemory: "234Gi", corev1.ResourcePods: "110", api.ResourceGPU: "1",
			}),
			Price:      14.19,
			GPUProduct: H100Product,
		},
		{
			Name: "cpu-8x",
			Resources: ResourceList(map[corev1.ResourceName]string{
				corev1.ResourceCPU: "8", corev1.ResourceMemory: "32Gi", corev1.ResourcePods: "110",
			}),
			Price: 0.34,
		},
	}
}

// DefaultNodePools returns a "gpu" NodePool over the instance types with GPUs, its
// nodes labelled api.LabelGPUNode=true, and, if there are CPU-only types, a "cpu" NodePool
// over those with a higher weight, so CPU pods land on CPU nodes.
func DefaultNodePools(types []InstanceType) []NodePool {
	var gpu, cpu []string
	for _, it := range types {
		if q, ok := it.Resources[api.ResourceGPU]; ok && !q.IsZero() {
			gpu = append(gpu, it.Name)
		} else {
			cpu = append(cpu, it.Name)
		}
	}
	var pools []NodePool
	if len(gpu) > 0 {
		pools = append(pools, NodePool{Name: "gpu", Labels: map[string]string{api.LabelGPUNode: "true"}, InstanceTypes: gpu})
	}
	if len(cpu) > 0 {
		pools = append(pools, NodePool{Name: "cpu", InstanceTypes: cpu, Weight: 10})
	}
	return pools
}

// startKarpenter installs the CRDs, writes the instance types, creates the
// KWOKNodeClass and NodePools, then starts the provider and waits for its /readyz.
func (c *Cluster) startKarpenter(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	began := time.Now()
	opts := *c.opts.Karpenter
	if len(opts.InstanceTypes) == 0 {
		opts.InstanceTypes = DefaultInstanceTypes()
	}
	if len(opts.NodePools) == 0 {
		opts.NodePools = DefaultNodePools(opts.InstanceTypes)
	}

	// 1. CRDs, established.
	if err := c.applyCRDs(ctx, filepath.Join(c.binDir, "karpenter-crds")); err != nil {
		return err
	}

	// 2. Instance types.
	itJSON, err := InstanceTypesJSON(opts.InstanceTypes)
	if err != nil {
		return err
	}
	itPath := filepath.Join(c.Dir, "karpenter-instance-types.json")
	if err := os.WriteFile(itPath, itJSON, 0o644); err != nil {
		return fmt.Errorf("writing instance types: %w", err)
	}
	c.instanceTypes = itPath
	env := []string{
		"KUBECONFIG=" + c.componentKubeconfig("karpenter"),
		"INSTANCE_TYPES_FILE_PATH=" + itPath,
	}
	templates, err := DRATemplatesJSON(opts.InstanceTypes)
	if err != nil {
		return err
	}
	if templates != nil {
		path := filepath.Join(c.Dir, "karpenter-dra-templates.json")
		if err := os.WriteFile(path, templates, 0o644); err != nil {
			return fmt.Errorf("writing DRA templates: %w", err)
		}
		env = append(env, "DRA_TEMPLATES_FILE_PATH="+path)
	}

	// 3. KWOKNodeClass and NodePools. The KWOKNodeClass CRD defaults its status to
	// Ready=True, which Karpenter needs before it uses a NodePool.
	objs := []*unstructured.Unstructured{NodeClassObject()}
	for _, np := range opts.NodePools {
		obj, err := NodePoolObject(np)
		if err != nil {
			return err
		}
		objs = append(objs, obj)
	}
	for _, obj := range objs {
		gvr := NodePoolResource()
		if obj.GetKind() == "KWOKNodeClass" {
			gvr = KWOKNodeClassResource()
		}
		if _, err := c.Dynamic.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}

	// 4. The provider.
	comp := component{
		name:  "karpenter",
		bin:   "karpenter-kwok",
		ports: 2,
		env:   env,
		args: func(ports []int) ([]string, error) {
			return []string{
				"--disable-leader-election",
				// Karpenter binds these on all interfaces (":<port>"); there is no flag for the address.
				"--metrics-port=" + strconv.Itoa(ports[0]),
				"--health-probe-port=" + strconv.Itoa(ports[1]),
				// Decide quickly: tests create pods one by one.
				"--batch-idle-duration=1s", "--batch-max-duration=3s",
				"--ignore-dra-requests=" + strconv.FormatBool(!opts.DRARequests),
			}, nil
		},
		ready: func(ctx context.Context, ports []int) error {
			return probeHTTP(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), nil)
		},
	}
	ports, proc, err := c.startComponent(ctx, comp)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.karpenter = &running{comp: comp, ports: ports, proc: proc}
	c.mu.Unlock()
	logger.V(2).Info("Karpenter ready", "duration", time.Since(began).Round(time.Millisecond))
	return nil
}

// SetInstanceTypes changes what the fake cloud sells, as a cloud's catalog
// or spot capacity changes (a spot offering withdrawn while its capacity is
// short): the provider's instance-types file is written again and the
// provider restarted, since the kwok provider reads the file only at start.
// Karpenter keeps its state in the API server, so NodeClaims and nodes are
// taken up again, but the kwok provider creates a launched NodeClaim's Node
// in the background: a restart in that moment would leave a NodeClaim
// whose node never comes. So it first waits (up to 60 s) until every
// NodeClaim not being deleted has its node registered. The instance types'
// names must stay those the NodePools name; DRA templates are not changed.
// Calls are serialized; each returns once the provider is ready again.
func (c *Cluster) SetInstanceTypes(ctx context.Context, types []InstanceType) error {
	c.karpenterMu.Lock()
	defer c.karpenterMu.Unlock()
	c.mu.Lock()
	rs := c.karpenter
	c.mu.Unlock()
	if rs == nil {
		return errors.New("setting instance types: Karpenter is not started")
	}
	data, err := InstanceTypesJSON(types)
	if err != nil {
		return err
	}
	if err := c.waitLaunchesDone(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("setting instance types: %w", err)
	}
	if err := os.WriteFile(c.instanceTypes, data, 0o644); err != nil {
		return fmt.Errorf("setting instance types: %w", err)
	}
	began := time.Now()
	if err := rs.proc.stop(10 * time.Second); err != nil {
		return fmt.Errorf("setting instance types: stopping Karpenter: %w", err)
	}
	// Fresh ports: the old ones may have been taken since (they came from
	// the ephemeral range), and nothing depends on their numbers.
	ports, p, err := c.startComponent(ctx, rs.comp)
	if err != nil {
		return fmt.Errorf("setting instance types: starting Karpenter again: %w", err)
	}
	c.mu.Lock()
	rs.proc, rs.ports = p, ports
	c.mu.Unlock()
	klog.FromContext(ctx).Info("Restarted Karpenter with new instance types", "pid", p.PID, "duration", time.Since(began).Round(time.Millisecond))
	return nil
}

// waitLaunchesDone waits until every NodeClaim not being deleted names its
// registered node (status.nodeName).
func (c *Cluster) waitLaunchesDone(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var pending []string
	for {
		l, err := c.Dynamic.Resource(NodeClaimResource()).List(ctx, metav1.ListOptions{})
		if err == nil {
			pending = pending[:0]
			for _, u := range l.Items {
				if n, _, _ := unstructured.NestedString(u.Object, "status", "nodeName"); n == "" && u.GetDeletionTimestamp() == nil {
					pending = append(pending, u.GetName())
				}
			}
			if len(pending) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("NodeClaims %v still launching after %s (last list error: %v)", pending, limit, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// applyCRDs creates every CRD in dir's *.yaml files and waits until each is established.
func (c *Cluster) applyCRDs(ctx context.Context, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("finding CRDs in %s (run make tools): %v", dir, err)
	}
	var names []string
	for _, f := range files {
		objs, err := ReadObjects(f)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if _, err := c.Dynamic.Resource(CRDResource()).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating CRD %s: %w", obj.GetName(), err)
			}
			names = append(names, obj.GetName())
		}
	}
	for _, name := range names {
		err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			crd, err := c.Dynamic.Resource(CRDResource()).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return ConditionTrue(crd, "Established"), nil
		})
		if err != nil {
			return fmt.Errorf("waiting for CRD %s to be established: %w", name, err)
		}
	}
	return nil
}

// ConditionTrue reports whether an unstructured object (a CRD, a NodeClaim, a
// NodePool...) has the status condition condType with status "True".
func ConditionTrue(obj *unstructured.Unstructured, condType string) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == condType {
			return m["status"] == "True"
		}
	}
	return false
}

// instanceTypeJSON is one entry of the provider's instance-types file.
type instanceTypeJSON struct {
	Name             string              `json:"name"`
	Offerings        []offeringJSON      `json:"offerings"`
	Architecture     string              `json:"architecture"`
	OperatingSystems []string            `json:"operatingSystems"`
	Resources        corev1.ResourceList `json:"resources"`
}

// offeringJSON is one offering; the provider spells these keys capitalised.
type offeringJSON struct {
	Price        float64                          `json:"Price"`
	Available    bool                             `json:"Available"`
	Requirements []corev1.NodeSelectorRequirement `json:"Requirements"`
}

// InstanceTypesJSON renders instance types in the format of the kwok provider's
// INSTANCE_TYPES_FILE_PATH file.
func InstanceTypesJSON(types []InstanceType) ([]byte, error) {
	out := make([]instanceTypeJSON, 0, len(types))
	for _, it := range types {
		if it.Name == "" {
			return nil, errors.New("rendering instance types: an instance type has no name")
		}
		if it.SpotPrice > 0 && it.SpotPrice >= it.Price {
			return nil, fmt.Errorf("rendering instance types: %s: spot price %v is not below the on-demand price %v (the provider would launch on-demand)", it.Name, it.SpotPrice, it.Price)
		}
		zones := it.Zones
		if len(zones) == 0 {
			zones = []string{DefaultZone}
		}
		entry := instanceTypeJSON{
			Name:             it.Name,
			Architecture:     "amd64",
			OperatingSystems: []string{"linux"},
			Resources:        it.Resources,
		}
		offer := func(capacityType, zone string, price float64) {
			reqs := []corev1.NodeSelectorRequirement{
				{Key: LabelCapacityType, Operator: corev1.NodeSelectorOpIn, Values: []string{capacityType}},
				{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{zone}},
			}
			if it.GPUProduct != "" {
				reqs = append(reqs, corev1.NodeSelectorRequirement{
					Key: api.LabelGPUProduct, Operator: corev1.NodeSelectorOpIn, Values: []string{it.GPUProduct},
				})
			}
			if n := it.gpus(); n > 0 {
				reqs = append(reqs, corev1.NodeSelectorRequirement{
					Key: GPUCountLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{strconv.Itoa(n)},
				})
			}
			entry.Offerings = append(entry.Offerings, offeringJSON{Price: price, Available: true, Requirements: reqs})
		}
		for _, zone := range zones {
			offer(CapacityOnDemand, zone, it.Price)
			if it.SpotPrice > 0 {
				offer(CapacitySpot, zone, it.SpotPrice)
			}
		}
		out = append(out, entry)
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("rendering instance types: %w", err)
	}
	return data, nil
}

// draTemplateJSON is one ResourceSliceTemplate in the shape the test bed's
// provider (tests/tools/karpenter/kwokdra) reads.
type draTemplateJSON struct {
	Driver         string                   `json:"driver"`
	Pool           string                   `json:"pool"`
	Devices        []resourceapi.Device     `json:"devices,omitempty"`
	SharedCounters []resourceapi.CounterSet `json:"sharedCounters,omitempty"`
}

// DRATemplatesJSON renders the device templates of the instance types with
// DRAGPUs (nil when there are none): what gpufrac-node's DRA driver
// publishes for that many mock H100s in mode fraction, built by the
// driver's own builder. The UUIDs are stand-ins; nothing selects on them
// before the node exists.
func DRATemplatesJSON(types []InstanceType) ([]byte, error) {
	out := map[string][]draTemplateJSON{}
	for _, it := range types {
		if it.DRAGPUs <= 0 {
			continue
		}
		gpus := make([]nodedra.GPU, it.DRAGPUs)
		for i := range gpus {
			gpus[i] = nodedra.GPU{
				GPU:  nvidia.GPU{Index: i, Minor: i, UUID: fmt.Sprintf("GPU-template-%s-%d", it.Name, i), Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 81559 << 20},
				Mode: config.ModeFraction, Healthy: true,
			}
		}
		p, err := nodedra.Build(it.Name, gpus)
		if err != nil {
			return nil, fmt.Errorf("building the DRA templates of %s: %w", it.Name, err)
		}
		for _, sl := range p.Resources.Pools[it.Name].Slices {
			out[it.Name] = append(out[it.Name], draTemplateJSON{Driver: api.DRADriver, Pool: it.Name, Devices: sl.Devices, SharedCounters: sl.SharedCounters})
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("rendering DRA templates: %w", err)
	}
	return data, nil
}

// NodeClassObject returns the KWOKNodeClass every NodePool refers to.
func NodeClassObject() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "karpenter.kwok.sh/v1alpha1",
		"kind":       "KWOKNodeClass",
		"metadata":   map[string]any{"name": NodeClassName},
	}}
}

// NodePoolObject renders a NodePool as a karpenter.sh/v1 object.
func NodePoolObject(np NodePool) (*unstructured.Unstructured, error) {
	if np.Name == "" {
		return nil, errors.New("rendering NodePool: no name")
	}
	capacityTypes := []string{CapacityOnDemand}
	if len(np.CapacityTypes) > 0 {
		capacityTypes = slices.Clone(np.CapacityTypes)
	}
	reqs := []map[string]any{
		{"key": corev1.LabelOSStable, "operator": "In", "values": []string{"linux"}},
		{"key": LabelCapacityType, "operator": "In", "values": capacityTypes},
	}
	if len(np.InstanceTypes) > 0 {
		reqs = append(reqs, map[string]any{"key": corev1.LabelInstanceTypeStable, "operator": "In", "values": slices.Clone(np.InstanceTypes)})
	}
	for _, r := range np.Requirements {
		m := map[string]any{"key": r.Key, "operator": string(r.Operator)}
		if len(r.Values) > 0 {
			m["values"] = slices.Clone(r.Values)
		}
		reqs = append(reqs, m)
	}
	policy := np.ConsolidationPolicy
	if policy == "" {
		policy = "WhenEmptyOrUnderutilized"
	}
	consolidateAfter := "Never"
	switch {
	case np.ConsolidateAfter == 0:
		consolidateAfter = DefaultConsolidateAfter.String()
	case np.ConsolidateAfter > 0:
		consolidateAfter = np.ConsolidateAfter.String()
	}
	templateSpec := map[string]any{
		"nodeClassRef": map[string]any{"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NodeClassName},
		"requirements": reqs,
		"expireAfter":  "Never",
	}
	if len(np.Taints) > 0 {
		taints := make([]map[string]any, 0, len(np.Taints))
		for _, t := range np.Taints {
			m := map[string]any{"key": t.Key, "effect": string(t.Effect)}
			if t.Value != "" {
				m["value"] = t.Value
			}
			taints = append(taints, m)
		}
		templateSpec["taints"] = taints
	}
	templateMeta := map[string]any{}
	if len(np.Labels) > 0 {
		templateMeta["labels"] = maps.Clone(np.Labels)
	}
	spec := map[string]any{
		"template": map[string]any{
			"metadata": templateMeta,
			"spec":     templateSpec,
		},
		"disruption": map[string]any{
			"consolidationPolicy": policy,
			"consolidateAfter":    consolidateAfter,
			// Every node may go at once: tests have few nodes, and the default 10% budget
			// would still allow one, but say what we mean.
			"budgets": []map[string]any{{"nodes": "100%"}},
		},
	}
	if np.Weight != 0 {
		spec["weight"] = int64(np.Weight)
	}
	if len(np.Limits) > 0 {
		limits := map[string]any{}
		for name, q := range np.Limits {
			limits[string(name)] = q.String()
		}
		spec["limits"] = limits
	}
	// A JSON round trip turns the typed slices and maps above into the plain
	// []any / map[string]any that unstructured objects (and DeepCopy) require.
	raw, err := json.Marshal(map[string]any{
		"apiVersion": "karpenter.sh/v1",
		"kind":       "NodePool",
		"metadata":   map[string]any{"name": np.Name},
		"spec":       spec,
	})
	if err != nil {
		return nil, fmt.Errorf("rendering NodePool %s: %w", np.Name, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("rendering NodePool %s: %w", np.Name, err)
	}
	return obj, nil
}
