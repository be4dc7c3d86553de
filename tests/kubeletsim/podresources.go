package kubeletsim

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podResourcesServer serves the PodResources v1 API from the simulator's
// allocations. Like the kubelet it reports one ContainerDevices entry per
// device (and per NUMA node when the device has a topology); clients must
// group them. Containers using resource claims list their claims' devices
// in dynamic_resources (claim name and namespace, driver, pool, device,
// share and CDI devices), as the kubelet does since 1.34. Regular init
// containers are not listed (AllocateInit), as with the kubelet. Unlike the
// kubelet, pods appear only while they hold devices or prepared claims,
// only containers with devices or claims are listed, and entries are
// sorted so answers are reproducible. Like the kubelet, a restarted
// simulator lists no pod until its pods are known (Options.PodSyncDelay).
type podResourcesServer struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	k *Kubelet
}

// List returns every pod holding devices with its containers' devices.
func (s *podResourcesServer) List(_ context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.podsUnknownLocked() {
		return &podresourcesv1.ListPodResourcesResponse{}, nil
	}
	pods := slices.SortedFunc(maps.Values(k.pods), func(a, b PodRef) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: make([]*podresourcesv1.PodResources, 0, len(pods))}
	for _, pod := range pods {
		resp.PodResources = append(resp.PodResources, k.podResourcesLocked(pod))
	}
	return resp, nil
}

// Get returns one pod's devices; like the kubelet it fails for a pod it
// does not know.
func (s *podResourcesServer) Get(_ context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.podsUnknownLocked() {
		return nil, fmt.Errorf("pod %s in namespace %s not found", req.GetPodName(), req.GetPodNamespace())
	}
	for _, pod := range k.pods {
		if pod.Namespace == req.GetPodNamespace() && pod.Name == req.GetPodName() {
			return &podresourcesv1.GetPodResourcesResponse{PodResources: k.podResourcesLocked(pod)}, nil
		}
	}
	return nil, fmt.Errorf("pod %s in namespace %s not found", req.GetPodName(), req.GetPodNamespace())
}

// GetAllocatableResources returns the healthy devices of every resource.
func (s *podResourcesServer) GetAllocatableResources(_ context.Context, _ *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	resp := &podresourcesv1.AllocatableResourcesResponse{}
	for _, name := range slices.Sorted(maps.Keys(k.resources)) {
		e := k.resources[name]
		for _, id := range slices.Sorted(maps.Keys(e.devices)) {
			d := e.devices[id]
			if d.GetHealth() != v1beta1.Healthy {
				continue
			}
			resp.Devices = append(resp.Devices, containerDevices(name, id, d.GetTopology())...)
		}
	}
	return resp, nil
}

// podsUnknownLocked reports whether a restarted simulator does not know its
// pods yet (Options.PodSyncDelay). k.mu must be held.
func (k *Kubelet) podsUnknownLocked() bool { return k.clock.Now().Before(k.podsUnknownUntil) }

// podResourcesLocked builds a pod's entry from its allocations. k.mu must be held.
func (k *Kubelet) podResourcesLocked(pod PodRef) *podresourcesv1.PodResources {
	byContainer := map[string][]*allocRecord{}
	for key, rec := range k.allocs {
		// The kubelet lists no regular init container (they have ended).
		if key.uid == pod.UID && !rec.alloc.Init {
			byContainer[key.container] = append(byContainer[key.container], rec)
		}
	}
	out := &podresourcesv1.PodResources{Name: pod.Name, Namespace: pod.Namespace}
	names := slices.Collect(maps.Keys(byContainer))
	for _, name := range k.draContainersLocked(pod.UID) {
		if _, ok := byContainer[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		recs := byContainer[name]
		slices.SortFunc(recs, func(a, b *allocRecord) int { return cmp.Compare(a.alloc.Resource, b.alloc.Resource) })
		c := &podresourcesv1.ContainerResources{Name: name}
		for _, rec := range recs {
			for _, id := range rec.alloc.DeviceIDs {
				c.Devices = append(c.Devices, containerDevices(rec.alloc.Resource, id, rec.topology[id])...)
			}
		}
		c.DynamicResources = k.dynamicResourcesLocked(pod.UID, name)
		out.Containers = append(out.Containers, c)
	}
	return out
}

// containerDevices reports one device the way the kubelet does: one entry
// without topology, or one entry per NUMA node.
func containerDevices(resource, id string, topo *v1beta1.TopologyInfo) []*podresourcesv1.ContainerDevices {
	if topo == nil {
		return []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: []string{id}}}
	}
	out := make([]*podresourcesv1.ContainerDevices, 0, len(topo.GetNodes()))
	for _, n := range topo.GetNodes() {
		out = append(out, &podresourcesv1.ContainerDevices{
			ResourceName: resource,
			DeviceIds:    []string{id},
			Topology:     &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: n.GetID()}}},
		})
	}
	return out
}
