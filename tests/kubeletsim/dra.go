package kubeletsim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// draRescanInterval is how often the plugin registry directory is scanned
// for new or removed registration sockets (the kubelet's plugin watcher
// uses fsnotify; polling keeps the simulator simple and is as good for
// tests).
const draRescanInterval = 50 * time.Millisecond

// ClaimGetter reads resource claims (a clientset's ResourceV1 claims).
type ClaimGetter interface {
	GetClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
}

// ErrClaimsNotReady means a pod's claims cannot be prepared yet: a claim
// from a template is not created, not allocated, or does not list the pod
// in reservedFor, or its driver has not registered. The kubelet keeps such
// a pod pending and retries (FailedPrepareDynamicResources), it does not
// fail it.
var ErrClaimsNotReady = errors.New("resource claims not ready")

// DRAPluginError is a DRA driver's refusal of a claim
// (NodePrepareResources' per-claim error), or the failure of the call.
type DRAPluginError struct {
	Driver string
	Claim  string // namespace/name
	Op     string // NodePrepareResources or NodeUnprepareResources
	Msg    string
}

func (e *DRAPluginError) Error() string {
	return fmt.Sprintf("DRA driver %s: %s for claim %s: %s", e.Driver, e.Op, e.Claim, e.Msg)
}

// draDriver is a registered DRA driver.
type draDriver struct {
	name      string
	regSocket string // the registration socket it came from
	// regFile is that socket's file when it registered: a socket replaced
	// at the same path (the driver restarted) registers again, as the
	// kubelet's plugin watcher re-registers on the new socket's create
	// event even when the simulator's scan missed the gap.
	regFile  os.FileInfo
	endpoint string
	conn     *grpc.ClientConn
	client   drapb.DRAPluginClient
}

// PreparedDevice is one device a DRA driver prepared for a claim.
type PreparedDevice struct {
	Driver, Pool, Device string
	ShareID              string
	Requests             []string
	CDIDeviceIDs         []string
}

// PreparedClaim is a claim the simulator prepared, and the pods using it.
type PreparedClaim struct {
	Namespace, Name string
	UID             types.UID
	Devices         []PreparedDevice
	// Pods are the UIDs of the pods it was prepared for.
	Pods []types.UID
}

// containerClaim is one claim a container uses: the claim's UID and the
// requests it uses (nil: all).
type containerClaim struct {
	claim    types.UID
	requests []string
}

// draPod is what the simulator prepared for one pod.
type draPod struct {
	ref PodRef
	// claims are the UIDs of the pod's prepared claims.
	claims []types.UID
	// containers: container name -> the claims it uses.
	containers map[string][]containerClaim
}

// draState is the DRA part of the simulator. Guarded by Kubelet.mu.
type draState struct {
	// drivers: driver name -> registered driver.
	drivers map[string]*draDriver
	// claims: claim UID -> prepared claim.
	claims map[types.UID]*PreparedClaim
	// pods: pod UID -> what was prepared for it.
	pods map[types.UID]*draPod
}

// startDRA starts the plugin watcher when DRA is configured.
func (k *Kubelet) startDRA(ctx context.Context) error {
	if k.opts.PluginRegistryDir == "" {
		return nil
	}
	if err := os.MkdirAll(k.opts.PluginRegistryDir, 0o750); err != nil {
		return fmt.Errorf("creating plugin registry directory %s: %w", k.opts.PluginRegistryDir, err)
	}
	k.life.Go(func() { k.watchPlugins(ctx) })
	return nil
}

// watchPlugins registers DRA drivers whose registration sockets appear in
// the registry directory and forgets those whose socket goes away, until
// ctx ends.
func (k *Kubelet) watchPlugins(ctx context.Context) {
	logger := klog.FromContext(ctx)
	tick := time.NewTicker(draRescanInterval)
	defer tick.Stop()
	failed := map[string]time.Time{} // socket -> last failed registration
	for {
		entries, err := os.ReadDir(k.opts.PluginRegistryDir)
		if err != nil {
			logger.Error(err, "Reading the plugin registry directory failed", "dir", k.opts.PluginRegistryDir)
		}
		present := map[string]bool{}
		for _, e := range entries {
			if e.Type()&os.ModeSocket == 0 {
				continue
			}
			socket := filepath.Join(k.opts.PluginRegistryDir, e.Name())
			fi, err := os.Stat(socket)
			if err != nil {
				continue // gone since ReadDir
			}
			present[socket] = true
			if k.knownRegistration(socket, fi) || time.Since(failed[socket]) < time.Second {
				continue
			}
			if err := k.registerDRA(ctx, socket, fi); err != nil {
				failed[socket] = time.Now()
				logger.Error(err, "DRA plugin registration failed", "socket", socket)
			}
		}
		k.forgetGoneDrivers(ctx, present)
		select {
		case <-ctx.Done():
			k.closeDrivers()
			return
		case <-tick.C:
		}
	}
}

// knownRegistration tells whether a driver registered from socket, the
// file fi (not a socket since created at the same path: same inode and
// modification time).
func (k *Kubelet) knownRegistration(socket string, fi os.FileInfo) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, d := range k.dra.drivers {
		// The same inode is not enough: a file system may give a socket
		// created right after the old one was removed the old one's inode.
		if d.regSocket == socket && os.SameFile(d.regFile, fi) && d.regFile.ModTime().Equal(fi.ModTime()) {
			return true
		}
	}
	return false
}

// registerDRA follows the kubelet's plugin watcher: GetInfo on the
// registration socket, check the type and a supported version (v1.DRAPlugin
// first, as the kubelet prefers), connect to the endpoint, then
// NotifyRegistrationStatus.
func (k *Kubelet) registerDRA(ctx context.Context, socket string, fi os.FileInfo) error {
	logger := klog.FromContext(ctx)
	rctx, cancel := context.WithTimeout(ctx, k.opts.DialTimeout)
	defer cancel()
	regConn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dialing %s: %w", socket, err)
	}
	defer regConn.Close()
	reg := registerapi.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(rctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("GetInfo on %s: %w", socket, err)
	}
	notify := func(regErr error) error {
		st := &registerapi.RegistrationStatus{PluginRegistered: regErr == nil}
		if regErr != nil {
			st.Error = regErr.Error()
		}
		if _, err := reg.NotifyRegistrationStatus(rctx, st); err != nil {
			return fmt.Errorf("NotifyRegistrationStatus on %s: %w", socket, err)
		}
		return regErr
	}
	if info.GetType() != registerapi.DRAPlugin {
		return notify(fmt.Errorf("plugin type %q is not %s", info.GetType(), registerapi.DRAPlugin))
	}
	if !slices.Contains(info.GetSupportedVersions(), drapb.DRAPluginService) {
		return notify(fmt.Errorf("plugin %s supports %v, the simulator speaks %s", info.GetName(), info.GetSupportedVersions(), drapb.DRAPluginService))
	}
	if !filepath.IsAbs(info.GetEndpoint()) {
		return notify(fmt.Errorf("plugin %s endpoint %q is not an absolute path", info.GetName(), info.GetEndpoint()))
	}
	conn, err := grpc.NewClient("unix://"+info.GetEndpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return notify(fmt.Errorf("dialing DRA endpoint %s: %w", info.GetEndpoint(), err))
	}
	d := &draDriver{name: info.GetName(), regSocket: socket, regFile: fi, endpoint: info.GetEndpoint(), conn: conn, client: drapb.NewDRAPluginClient(conn)}
	if err := notify(nil); err != nil {
		conn.Close()
		return err
	}
	k.mu.Lock()
	if old := k.dra.drivers[d.name]; old != nil {
		old.conn.Close()
	}
	k.dra.drivers[d.name] = d
	k.broadcastLocked()
	k.mu.Unlock()
	logger.V(2).Info("Registered DRA driver", "driver", d.name, "endpoint", d.endpoint)
	return nil
}

// forgetGoneDrivers drops drivers whose registration socket is gone (the
// kubelet then wipes their ResourceSlices after a delay; the simulator
// leaves slices to the test).
func (k *Kubelet) forgetGoneDrivers(ctx context.Context, present map[string]bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, d := range k.dra.drivers {
		if !present[d.regSocket] {
			d.conn.Close()
			delete(k.dra.drivers, name)
			klog.FromContext(ctx).V(2).Info("DRA driver went away", "driver", name)
			k.broadcastLocked()
		}
	}
}

func (k *Kubelet) closeDrivers() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for name, d := range k.dra.drivers {
		d.conn.Close()
		delete(k.dra.drivers, name)
	}
}

// DRADrivers lists the registered DRA drivers.
func (k *Kubelet) DRADrivers() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.dra.drivers))
}

// WaitForDRADriver blocks until driver is registered or ctx ends.
func (k *Kubelet) WaitForDRADriver(ctx context.Context, driver string) error {
	for {
		k.mu.Lock()
		_, ok := k.dra.drivers[driver]
		ch := k.changed
		k.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for DRA driver %s: %w", driver, ctx.Err())
		case <-ch:
		}
	}
}

// HasClaims tells whether a pod uses resource claims: its own, or the
// claim of its DRA-backed extended resources.
func HasClaims(pod *corev1.Pod) bool {
	return len(pod.Spec.ResourceClaims) > 0 || pod.Status.ExtendedResourceClaimStatus != nil
}

// claimRef is one claim of a pod as the pod names it.
type claimRef struct {
	podClaimName string // the entry in pod.spec.resourceClaims ("" for the extended-resource claim)
	name         string // the ResourceClaim's name
}

// podClaimNames lists the claims a pod uses, as the kubelet's DRA manager
// does: spec.resourceClaims (template claims by the name
// status.resourceClaimStatuses gives) and the extended-resource claim.
func podClaimNames(pod *corev1.Pod) ([]claimRef, error) {
	var out []claimRef
	for _, rc := range pod.Spec.ResourceClaims {
		switch {
		case rc.ResourceClaimName != nil:
			out = append(out, claimRef{podClaimName: rc.Name, name: *rc.ResourceClaimName})
		case rc.ResourceClaimTemplateName != nil:
			i := slices.IndexFunc(pod.Status.ResourceClaimStatuses, func(s corev1.PodResourceClaimStatus) bool { return s.Name == rc.Name })
			if i < 0 || pod.Status.ResourceClaimStatuses[i].ResourceClaimName == nil {
				return nil, fmt.Errorf("%w: the claim of pod %s/%s for %s is not created from template %s yet", ErrClaimsNotReady, pod.Namespace, pod.Name, rc.Name, *rc.ResourceClaimTemplateName)
			}
			out = append(out, claimRef{podClaimName: rc.Name, name: *pod.Status.ResourceClaimStatuses[i].ResourceClaimName})
		}
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil {
		out = append(out, claimRef{name: s.ResourceClaimName})
	}
	return out, nil
}

// PrepareClaims prepares a pod's resource claims before its containers
// start, as the kubelet's DRA manager does
// (k8s.io/kubernetes/pkg/kubelet/cm/dra/manager.go, v1.36): each claim is
// read from the API, must be allocated and list the pod in reservedFor;
// claims not prepared before are sent to their driver, one
// NodePrepareResources call per driver; a claim shared with a pod prepared
// before is prepared once. Errors matching ErrClaimsNotReady and
// *DRAPluginError leave the pod waiting: call again.
func (k *Kubelet) PrepareClaims(ctx context.Context, pod *corev1.Pod) error {
	if k.opts.Claims == nil {
		return errors.New("preparing claims: the simulator has no ClaimGetter (Options.Claims)")
	}
	refs, err := podClaimNames(pod)
	if err != nil {
		return err
	}
	claims := map[string]*resourceapi.ResourceClaim{} // claim name -> claim
	for _, r := range refs {
		c, err := k.opts.Claims.GetClaim(ctx, pod.Namespace, r.name)
		if err != nil {
			return fmt.Errorf("%w: reading claim %s/%s: %v", ErrClaimsNotReady, pod.Namespace, r.name, err)
		}
		if c.Status.Allocation == nil {
			return fmt.Errorf("%w: claim %s/%s is not allocated", ErrClaimsNotReady, c.Namespace, c.Name)
		}
		if !slices.ContainsFunc(c.Status.ReservedFor, func(ref resourceapi.ResourceClaimConsumerReference) bool { return ref.UID == pod.UID }) {
			return fmt.Errorf("%w: pod %s/%s is not allowed to use ResourceClaim %s: it is not in status.reservedFor", ErrClaimsNotReady, pod.Namespace, pod.Name, c.Name)
		}
		claims[r.name] = c
	}

	// Prepare, per driver, the claims no pod prepared before. The admission
	// lock keeps two pods sharing a claim from preparing it twice.
	k.admitMu.Lock()
	defer k.admitMu.Unlock()
	byDriver := map[string][]*resourceapi.ResourceClaim{}
	k.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(claims)) {
		c := claims[name]
		if _, done := k.dra.claims[c.UID]; done {
			continue
		}
		for _, driver := range claimDrivers(c) {
			byDriver[driver] = append(byDriver[driver], c)
		}
	}
	k.mu.Unlock()
	prepared := map[types.UID][]PreparedDevice{}
	for _, driver := range slices.Sorted(maps.Keys(byDriver)) {
		devs, err := k.nodePrepare(ctx, driver, byDriver[driver])
		if err != nil {
			return err
		}
		for uid, ds := range devs {
			prepared[uid] = append(prepared[uid], ds...)
		}
	}

	// Record them, and which container uses what.
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.dra.pods[pod.UID]
	if p == nil {
		p = &draPod{ref: PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}, containers: map[string][]containerClaim{}}
		k.dra.pods[pod.UID] = p
	}
	for _, c := range claims {
		pc := k.dra.claims[c.UID]
		if pc == nil {
			pc = &PreparedClaim{Namespace: c.Namespace, Name: c.Name, UID: c.UID, Devices: prepared[c.UID]}
			k.dra.claims[c.UID] = pc
		}
		if !slices.Contains(pc.Pods, pod.UID) {
			pc.Pods = append(pc.Pods, pod.UID)
		}
		if !slices.Contains(p.claims, c.UID) {
			p.claims = append(p.claims, c.UID)
		}
	}
	p.containers = containerClaims(pod, refs, claims)
	k.pods[pod.UID] = p.ref
	k.broadcastLocked()
	k.logger.V(2).Info("Prepared pod's claims", "pod", klog.KObj(pod), "podUID", pod.UID, "claims", len(claims))
	return nil
}

// claimDrivers lists the drivers of a claim's allocated devices.
func claimDrivers(c *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if !slices.Contains(out, r.Driver) {
			out = append(out, r.Driver)
		}
	}
	slices.Sort(out)
	return out
}

// containerClaims maps each container to the claims (and requests) it
// uses: containers[].resources.claims for the pod's own claims, and the
// request mappings of the extended-resource claim.
func containerClaims(pod *corev1.Pod, refs []claimRef, claims map[string]*resourceapi.ResourceClaim) map[string][]containerClaim {
	byPodName := map[string]types.UID{}
	var extended types.UID
	for _, r := range refs {
		if r.podClaimName == "" {
			extended = claims[r.name].UID
			continue
		}
		byPodName[r.podClaimName] = claims[r.name].UID
	}
	out := map[string][]containerClaim{}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, rc := range c.Resources.Claims {
			uid, ok := byPodName[rc.Name]
			if !ok {
				continue
			}
			cc := containerClaim{claim: uid}
			if rc.Request != "" {
				cc.requests = []string{rc.Request}
			}
			out[c.Name] = append(out[c.Name], cc)
		}
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && extended != "" {
		for _, m := range s.RequestMappings {
			out[m.ContainerName] = append(out[m.ContainerName], containerClaim{claim: extended, requests: []string{m.RequestName}})
		}
	}
	return out
}

// nodePrepare calls one driver's NodePrepareResources for claims.
func (k *Kubelet) nodePrepare(ctx context.Context, driver string, claims []*resourceapi.ResourceClaim) (map[types.UID][]PreparedDevice, error) {
	k.mu.Lock()
	d := k.dra.drivers[driver]
	k.mu.Unlock()
	if d == nil {
		return nil, fmt.Errorf("%w: DRA driver %s is not registered", ErrClaimsNotReady, driver)
	}
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	rctx, cancel := context.WithTimeout(ctx, k.opts.RPCTimeout)
	defer cancel()
	resp, err := d.client.NodePrepareResources(rctx, req)
	if err != nil {
		return nil, &DRAPluginError{Driver: driver, Claim: claimNamesOf(claims), Op: "NodePrepareResources", Msg: err.Error()}
	}
	out := map[types.UID][]PreparedDevice{}
	for _, c := range claims {
		r, ok := resp.GetClaims()[string(c.UID)]
		if !ok {
			return nil, &DRAPluginError{Driver: driver, Claim: c.Namespace + "/" + c.Name, Op: "NodePrepareResources", Msg: "no result for the claim"}
		}
		if r.GetError() != "" {
			return nil, &DRAPluginError{Driver: driver, Claim: c.Namespace + "/" + c.Name, Op: "NodePrepareResources", Msg: r.GetError()}
		}
		for _, dev := range r.GetDevices() {
			out[c.UID] = append(out[c.UID], PreparedDevice{
				Driver: driver, Pool: dev.GetPoolName(), Device: dev.GetDeviceName(), ShareID: dev.GetShareId(),
				Requests: slices.Clone(dev.GetRequestNames()), CDIDeviceIDs: slices.Clone(dev.GetCdiDeviceIds()),
			})
		}
	}
	return out, nil
}

func claimNamesOf(claims []*resourceapi.ResourceClaim) string {
	names := make([]string, len(claims))
	for i, c := range claims {
		names[i] = c.Namespace + "/" + c.Name
	}
	return strings.Join(names, ",")
}

// UnprepareClaims unprepares a pod's claims once it ended, as the kubelet
// does: a claim still used by another prepared pod stays prepared; the
// others go to their drivers (NodeUnprepareResources). A pod without
// prepared claims is a no-op. On an error the claims stay recorded: call
// again.
func (k *Kubelet) UnprepareClaims(ctx context.Context, podUID types.UID) error {
	k.admitMu.Lock()
	defer k.admitMu.Unlock()
	k.mu.Lock()
	p := k.dra.pods[podUID]
	if p == nil {
		k.mu.Unlock()
		return nil
	}
	byDriver := map[string][]*PreparedClaim{}
	for _, uid := range p.claims {
		pc := k.dra.claims[uid]
		if pc == nil {
			continue
		}
		if slices.ContainsFunc(pc.Pods, func(u types.UID) bool { return u != podUID }) {
			continue
		}
		drivers := map[string]bool{}
		for _, d := range pc.Devices {
			drivers[d.Driver] = true
		}
		for drv := range drivers {
			byDriver[drv] = append(byDriver[drv], pc)
		}
	}
	k.mu.Unlock()
	for _, driver := range slices.Sorted(maps.Keys(byDriver)) {
		if err := k.nodeUnprepare(ctx, driver, byDriver[driver]); err != nil {
			return err
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, uid := range p.claims {
		pc := k.dra.claims[uid]
		if pc == nil {
			continue
		}
		pc.Pods = slices.DeleteFunc(pc.Pods, func(u types.UID) bool { return u == podUID })
		if len(pc.Pods) == 0 {
			delete(k.dra.claims, uid)
		}
	}
	delete(k.dra.pods, podUID)
	if !k.holdsAllocationsLocked(podUID) {
		delete(k.pods, podUID)
	}
	k.broadcastLocked()
	k.logger.V(2).Info("Unprepared pod's claims", "pod", p.ref.String(), "podUID", podUID)
	return nil
}

func (k *Kubelet) nodeUnprepare(ctx context.Context, driver string, claims []*PreparedClaim) error {
	k.mu.Lock()
	d := k.dra.drivers[driver]
	k.mu.Unlock()
	names := make([]string, len(claims))
	for i, c := range claims {
		names[i] = c.Namespace + "/" + c.Name
	}
	if d == nil {
		return fmt.Errorf("%w: DRA driver %s is not registered to unprepare %s", ErrClaimsNotReady, driver, strings.Join(names, ","))
	}
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	rctx, cancel := context.WithTimeout(ctx, k.opts.RPCTimeout)
	defer cancel()
	resp, err := d.client.NodeUnprepareResources(rctx, req)
	if err != nil {
		return &DRAPluginError{Driver: driver, Claim: strings.Join(names, ","), Op: "NodeUnprepareResources", Msg: err.Error()}
	}
	for _, c := range claims {
		if r := resp.GetClaims()[string(c.UID)]; r != nil && r.GetError() != "" {
			return &DRAPluginError{Driver: driver, Claim: c.Namespace + "/" + c.Name, Op: "NodeUnprepareResources", Msg: r.GetError()}
		}
	}
	return nil
}

// holdsAllocationsLocked tells whether a pod holds device-plugin devices.
// k.mu must be held.
func (k *Kubelet) holdsAllocationsLocked(uid types.UID) bool {
	for key := range k.allocs {
		if key.uid == uid {
			return true
		}
	}
	return false
}

// PreparedClaims returns the prepared claims, sorted by namespace and name.
func (k *Kubelet) PreparedClaims() []PreparedClaim {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]PreparedClaim, 0, len(k.dra.claims))
	for _, pc := range k.dra.claims {
		c := *pc
		c.Devices = slices.Clone(pc.Devices)
		c.Pods = slices.Clone(pc.Pods)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b PreparedClaim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// ContainerCDIDevices returns the CDI device IDs the container runtime would
// get for one container of a prepared pod: the devices of the claims (and
// requests) the container uses, in claim order.
func (k *Kubelet) ContainerCDIDevices(podUID types.UID, container string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, d := range k.containerDevicesLocked(podUID, container) {
		out = append(out, d.dev.CDIDeviceIDs...)
	}
	return out
}

// containerDevice is a device a container uses, with its claim.
type containerDevice struct {
	claim *PreparedClaim
	dev   PreparedDevice
}

func (k *Kubelet) containerDevicesLocked(podUID types.UID, container string) []containerDevice {
	p := k.dra.pods[podUID]
	if p == nil {
		return nil
	}
	var out []containerDevice
	for _, cc := range p.containers[container] {
		pc := k.dra.claims[cc.claim]
		if pc == nil {
			continue
		}
		for _, d := range pc.Devices {
			if cc.requests != nil && len(d.Requests) > 0 && !slices.ContainsFunc(d.Requests, func(r string) bool { return slices.Contains(cc.requests, r) }) {
				continue
			}
			out = append(out, containerDevice{claim: pc, dev: d})
		}
	}
	return out
}

// dynamicResourcesLocked is a container's PodResources dynamic_resources:
// one entry per claim, with its devices. k.mu must be held.
func (k *Kubelet) dynamicResourcesLocked(podUID types.UID, container string) []*podresourcesv1.DynamicResource {
	var out []*podresourcesv1.DynamicResource
	byClaim := map[types.UID]*podresourcesv1.DynamicResource{}
	for _, cd := range k.containerDevicesLocked(podUID, container) {
		dr := byClaim[cd.claim.UID]
		if dr == nil {
			dr = &podresourcesv1.DynamicResource{ClaimName: cd.claim.Name, ClaimNamespace: cd.claim.Namespace}
			byClaim[cd.claim.UID] = dr
			out = append(out, dr)
		}
		cr := &podresourcesv1.ClaimResource{DriverName: cd.dev.Driver, PoolName: cd.dev.Pool, DeviceName: cd.dev.Device}
		if cd.dev.ShareID != "" {
			share := cd.dev.ShareID
			cr.ShareId = &share
		}
		for _, id := range cd.dev.CDIDeviceIDs {
			cr.CdiDevices = append(cr.CdiDevices, &podresourcesv1.CDIDevice{Name: id})
		}
		dr.ClaimResources = append(dr.ClaimResources, cr)
	}
	return out
}

// draContainersLocked lists the containers of a pod that use claims.
func (k *Kubelet) draContainersLocked(podUID types.UID) []string {
	p := k.dra.pods[podUID]
	if p == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(p.containers))
}
