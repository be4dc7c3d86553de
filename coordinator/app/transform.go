package app

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// trimObject is the informers' transform: it drops what the coordinator
// never reads from the objects it caches, before they are stored. At 5,000
// nodes and 50,000 pods the informers' decoded pods were two thirds of the
// heap (docs/benchmarks-history.md, "Scale"); kube-controller-manager drops managed
// fields the same way.
//
// Every object loses its managed fields. Pods also lose what runs the
// containers but never places them (trimPod); nodes their image list and
// their conditions' heartbeat times. The
// coordinator never writes back an object it read from an informer (it
// patches, creates bindings, or gets a fresh object before an update), so
// nothing dropped here can be lost on the API server. It is idempotent and
// changes only the object it is given, which the informer has just decoded
// and nobody else holds yet (client-go's TransformFunc contract).
func trimObject(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		trimPod(o)
	case *corev1.Node:
		o.Status.Images = nil
		// The kubelet refreshes its conditions' heartbeats every few minutes
		// (nodeStatusReportFrequency) even when nothing changed: without
		// them such an update leaves the node as it was (changed).
		for i := range o.Status.Conditions {
			o.Status.Conditions[i].LastHeartbeatTime = metav1.Time{}
		}
	}
	return obj, nil
}

// changed tells whether an informer's update changed a pod or a node beyond
// its resourceVersion, as trimObject left them: an update of what the
// coordinator drops (a container's state, a node's heartbeat) is no change,
// and wakes no cycle (an idle cluster's cycles wait for one: see
// scheduler.Options.IdleResync). Other kinds always changed.
func changed(old, cur any) bool {
	switch c := cur.(type) {
	case *corev1.Pod:
		return changedBeyondVersion(old, c)
	case *corev1.Node:
		return changedBeyondVersion(old, c)
	}
	return true
}

// changedBeyondVersion compares cur with old (of cur's type, else changed)
// without their resourceVersions.
func changedBeyondVersion[T any, P interface {
	*T
	metav1.Object
}](old any, cur P) bool {
	o, ok := old.(P)
	if !ok {
		return true
	}
	a, b := *o, *cur // shallow copies: only their resourceVersion is set
	P(&a).SetResourceVersion("")
	P(&b).SetResourceVersion("")
	return !equality.Semantic.DeepEqual(&a, &b)
}

// trimPod drops what the coordinator never reads of a pod. Kept: metadata;
// of the spec everything but the volumes kube-scheduler's plugins never read
// (predicates.CheckedVolume: config maps, secrets, projected and downward API
// volumes, empty dirs, host paths), the pod's security context, DNS
// config, host aliases, image pull secrets, readiness gates and what runs
// each container; of each container its name, resources, restart policy
// (sidecars), env names (a container that sets NVIDIA_VISIBLE_DEVICES is
// refused: podrequest) and host ports; of the status all but the
// containers' states, the IPs, the start time and the conditions other
// than PodScheduled. What reads pods: api/request (resources, overhead,
// restart policies), podrequest (annotations, labels, env names, affinity,
// node selector, tolerations, priority, claims), state, scheduler,
// placeholder, consolidation, reservation and dra (node name, phase,
// the PodScheduled condition, claim statuses, gates, owner references).
func trimPod(p *corev1.Pod) {
	p.Spec.Volumes = checkedVolumes(p.Spec.Volumes)
	p.Spec.SecurityContext, p.Spec.DNSConfig, p.Spec.HostAliases = nil, nil, nil
	p.Spec.ImagePullSecrets, p.Spec.ReadinessGates = nil, nil
	for i := range p.Spec.InitContainers {
		trimContainer(&p.Spec.InitContainers[i])
	}
	for i := range p.Spec.Containers {
		trimContainer(&p.Spec.Containers[i])
	}
	for i := range p.Spec.EphemeralContainers {
		e := &p.Spec.EphemeralContainers[i]
		c := corev1.Container(e.EphemeralContainerCommon)
		trimContainer(&c)
		e.EphemeralContainerCommon = corev1.EphemeralContainerCommon(c)
	}
	if p.Status.Phase == corev1.PodFailed {
		// Whether a failed pod ever ran (predicates.NeverRan: a gang's
		// member that ran and failed is not rolled back with its gang).
		p.Status.ContainerStatuses = startedOnly(p.Status.ContainerStatuses)
		p.Status.InitContainerStatuses = startedOnly(p.Status.InitContainerStatuses)
	} else {
		p.Status.ContainerStatuses = nil
		p.Status.InitContainerStatuses = nil
	}
	p.Status.EphemeralContainerStatuses = nil
	p.Status.PodIPs, p.Status.PodIP = nil, ""
	p.Status.HostIPs, p.Status.HostIP = nil, ""
	p.Status.StartTime = nil
	p.Status.Conditions = scheduledOnly(p.Status.Conditions)
}

// startedOnly keeps of each container status its name and when it started
// (running, or terminated after a start): what predicates.NeverRan reads.
func startedOnly(sts []corev1.ContainerStatus) []corev1.ContainerStatus {
	if len(sts) == 0 {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(sts))
	for i, cs := range sts {
		out[i].Name = cs.Name
		if r := cs.State.Running; r != nil {
			out[i].State.Running = &corev1.ContainerStateRunning{StartedAt: r.StartedAt}
		}
		if t := cs.State.Terminated; t != nil {
			out[i].State.Terminated = &corev1.ContainerStateTerminated{StartedAt: t.StartedAt}
		}
		if t := cs.LastTerminationState.Terminated; t != nil {
			out[i].LastTerminationState.Terminated = &corev1.ContainerStateTerminated{StartedAt: t.StartedAt}
		}
	}
	return out
}

// checkedVolumes keeps the volumes kube-scheduler's volume plugins read
// (claims and attached disks), nil when there are none.
func checkedVolumes(vs []corev1.Volume) []corev1.Volume {
	n := 0
	for i := range vs {
		if predicates.CheckedVolume(&vs[i]) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(vs):
		return vs
	}
	out := make([]corev1.Volume, 0, n)
	for i := range vs {
		if predicates.CheckedVolume(&vs[i]) {
			out = append(out, vs[i])
		}
	}
	return out
}

// scheduledOnly keeps a pod's PodScheduled condition, the one the
// coordinator schedules by (its pending reasons, kube-scheduler's
// Unschedulable, consolidation's NoCapacity), and its DisruptionTarget, set
// as Kubernetes deletes it (lost non-preemptible work is reported by it); a
// running pod's Ready, Initialized, ContainersReady and
// PodReadyToStartContainers are a third of what is left of it.
func scheduledOnly(conds []corev1.PodCondition) []corev1.PodCondition {
	keep := func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodScheduled || c.Type == corev1.DisruptionTarget
	}
	n := 0
	for _, c := range conds {
		if keep(c) {
			n++
		}
	}
	switch n {
	case 0:
		return nil
	case len(conds):
		return conds
	}
	out := make([]corev1.PodCondition, 0, n)
	for _, c := range conds {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// trimContainer keeps a container's name, resources, restart policy, env
// names and host ports.
func trimContainer(c *corev1.Container) {
	*c = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy,
		RestartPolicyRules: c.RestartPolicyRules, Env: envNames(c.Env), Ports: hostPorts(c.Ports)}
}

// envNames keeps the names of env variables, not their values.
func envNames(env []corev1.EnvVar) []corev1.EnvVar {
	if len(env) == 0 {
		return nil
	}
	out := make([]corev1.EnvVar, len(env))
	for i, e := range env {
		out[i] = corev1.EnvVar{Name: e.Name}
	}
	return out
}

// hostPorts keeps the ports bound on the host.
func hostPorts(ports []corev1.ContainerPort) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, p := range ports {
		if p.HostPort != 0 {
			out = append(out, p)
		}
	}
	return out
}

// sharedMax bounds each of a sharer's tables; a full table is emptied and
// fills again (the objects keep what they share). sharedKeyMax is the
// longest content shared by its key: longer maps (a last-applied
// configuration) are rarely equal, and the table would hold them after
// their pods are gone.
const (
	sharedMax    = 4096
	sharedKeyMax = 1024
)

// sharer makes the informers' objects share equal parts, so tens of
// thousands of pods of a few shapes do not each hold their own copy: the
// decoder gives every pod its own resource maps (two maps of three
// quantities are about 1.4 kB), labels, annotations, default tolerations
// and strings. Equal maps and toleration lists are shared by content,
// strings through the unique package (its canonical strings are freed
// once no object holds them). Nothing that reads the informers' objects
// may change them (client-go's rule for listers), so sharing changes
// nothing they see; a shared slice has no spare capacity, so an append
// copies it. A sharer is safe for concurrent use: every informer of the
// coordinator calls its transform.
type sharer struct {
	mu          sync.Mutex
	lists       map[string]corev1.ResourceList
	strMaps     map[string]map[string]string
	tolerations map[string][]corev1.Toleration
	key         strings.Builder // under mu
}

func newSharer() *sharer {
	return &sharer{lists: map[string]corev1.ResourceList{}, strMaps: map[string]map[string]string{},
		tolerations: map[string][]corev1.Toleration{}}
}

// transform is the informers' transform: trimObject, then sharing.
func (s *sharer) transform(obj any) (any, error) {
	obj, err := trimObject(obj)
	if err != nil {
		return obj, err
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		s.sharePod(o)
	}
	return obj, nil
}

// sharePod shares p's maps, tolerations and the strings most pods repeat.
func (s *sharer) sharePod(p *corev1.Pod) {
	s.mu.Lock()
	p.Labels = s.strMap(p.Labels)
	p.Annotations = s.strMap(p.Annotations)
	p.Spec.NodeSelector = s.strMap(p.Spec.NodeSelector)
	p.Spec.Overhead = s.list(p.Spec.Overhead)
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			c := &cs[i]
			c.Resources.Limits = s.list(c.Resources.Limits)
			c.Resources.Requests = s.list(c.Resources.Requests)
			c.Name = str(c.Name)
			for k := range c.Env {
				c.Env[k].Name = str(c.Env[k].Name)
			}
		}
	}
	p.Spec.Tolerations = s.tolerationList(p.Spec.Tolerations)
	s.mu.Unlock()

	p.Namespace, p.GenerateName = str(p.Namespace), str(p.GenerateName)
	for i := range p.OwnerReferences {
		r := &p.OwnerReferences[i]
		r.APIVersion, r.Kind, r.Name = str(r.APIVersion), str(r.Kind), str(r.Name)
	}
	sp := &p.Spec
	sp.NodeName, sp.SchedulerName, sp.PriorityClassName = str(sp.NodeName), str(sp.SchedulerName), str(sp.PriorityClassName)
	sp.ServiceAccountName, sp.DeprecatedServiceAccount = str(sp.ServiceAccountName), str(sp.DeprecatedServiceAccount)
	sp.RestartPolicy, sp.DNSPolicy = corev1.RestartPolicy(str(string(sp.RestartPolicy))), corev1.DNSPolicy(str(string(sp.DNSPolicy)))
	st := &p.Status
	st.Phase, st.QOSClass = corev1.PodPhase(str(string(st.Phase))), corev1.PodQOSClass(str(string(st.QOSClass)))
	st.Reason, st.NominatedNodeName = str(st.Reason), str(st.NominatedNodeName)
	for i := range st.Conditions {
		c := &st.Conditions[i]
		c.Type, c.Status = corev1.PodConditionType(str(string(c.Type))), corev1.ConditionStatus(str(string(c.Status)))
		c.Reason, c.Message = str(c.Reason), str(c.Message)
	}
}

// str returns the canonical copy of v.
func str(v string) string {
	if v == "" {
		return ""
	}
	return unique.Make(v).Value()
}

// strMap returns the shared map equal to m (m itself the first time).
// Called with mu held.
func (s *sharer) strMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return m
	}
	size := 0
	keys := make([]string, 0, len(m))
	for k, v := range m {
		keys = append(keys, k)
		if size += len(k) + len(v); size > sharedKeyMax {
			return m
		}
	}
	slices.Sort(keys)
	s.key.Reset()
	for _, k := range keys {
		s.field(k)
		s.field(m[k])
	}
	return share(s.strMaps, s.key.String(), m)
}

// list returns the shared resource list equal to l (l itself the first
// time). Quantities are equal when they print the same in the same format.
// Called with mu held.
func (s *sharer) list(l corev1.ResourceList) corev1.ResourceList {
	if len(l) == 0 {
		return l
	}
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	slices.Sort(names)
	s.key.Reset()
	for _, n := range names {
		q := l[n]
		s.field(string(n))
		s.field(q.String())
		s.field(string(q.Format))
	}
	return share(s.lists, s.key.String(), l)
}

// tolerationList returns the shared list equal to ts (ts itself, without
// spare capacity, the first time). Called with mu held.
func (s *sharer) tolerationList(ts []corev1.Toleration) []corev1.Toleration {
	if len(ts) == 0 {
		return ts
	}
	s.key.Reset()
	for _, t := range ts {
		s.field(t.Key)
		s.field(string(t.Operator))
		s.field(t.Value)
		s.field(string(t.Effect))
		if t.TolerationSeconds != nil {
			s.field(strconv.FormatInt(*t.TolerationSeconds, 10))
		} else {
			s.field("-")
		}
	}
	return share(s.tolerations, s.key.String(), ts[:len(ts):len(ts)])
}

// field appends v to the key being built, length first, so that no two
// different lists of fields make the same key.
func (s *sharer) field(v string) {
	s.key.WriteString(strconv.Itoa(len(v)))
	s.key.WriteByte(':')
	s.key.WriteString(v)
}

// share returns table's value for key, after storing v under it when there
// is none (emptying a full table first); v itself when key is too long.
func share[V any](table map[string]V, key string, v V) V {
	if len(key) > sharedKeyMax {
		return v
	}
	if old, ok := table[key]; ok {
		return old
	}
	if len(table) >= sharedMax {
		clear(table)
	}
	table[key] = v
	return v
}
