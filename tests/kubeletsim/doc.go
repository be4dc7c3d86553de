// Package kubeletsim plays the kubelet's device-manager role over the real
// gRPC APIs, so a device plugin (gpufrac-node) can be tested without a kubelet.
//
// One Kubelet stands for one node. It serves the device-plugin Registration
// service on <Dir>/kubelet.sock and, when asked, the PodResources v1 service on
// its own socket. Plugins register, the simulator dials them back on
// <Dir>/<endpoint>, reads their options, follows ListAndWatch and admits
// containers with Allocate the way the kubelet's device manager does
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, v1.34):
//
//   - Registration checks the API version (v1beta1), that the resource is an
//     extended resource name and that the endpoint is a plain file name, then
//     connects and calls GetDevicePluginOptions before answering. A plugin must
//     therefore serve before it registers. A new registration for a resource
//     replaces the previous endpoint.
//   - Every ListAndWatch response replaces the resource's device list.
//     Capacity counts all devices, allocatable only the healthy ones.
//   - When a plugin's stream ends, all its devices turn unhealthy at once and
//     the resource is removed after Options.StopGracePeriod (five minutes, as
//     in the kubelet) unless the plugin registers again.
//   - Start and Restart remove every socket in Dir, as the kubelet does when
//     it starts, then create kubelet.sock. Plugins that watch Dir with fsnotify
//     see kubelet.sock created and must re-create their socket and register
//     again. After a Restart all resources report no devices until their
//     plugin re-registers; allocations survive, as with the kubelet's
//     checkpoint file.
//   - Allocate (admission of one container for one resource) picks from the
//     healthy devices no pod holds, asks GetPreferredAllocation when the plugin
//     offers it, calls Allocate and, when the plugin requires it,
//     PreStartContainer. Plugin errors come back as *PluginError carrying the
//     plugin's own message.
//   - AllocateInit admits a regular init container: its devices go on to
//     the pod's later containers first (the kubelet's devicesToReuse), so an
//     init and an app container asking one GPU each hold one; PodResources
//     does not list regular init containers.
//
// OnChange callbacks report every change of a resource's device list (use
// Counts for capacity and allocatable), so a node controller can patch the
// node status; Wait and WaitForResource block until a condition holds.
//
// Note for plugin authors: kubelet.sock appears when the socket is bound,
// a moment before it accepts connections, exactly as with a real kubelet. A
// plugin reacting to its creation must wait for the connection (gRPC
// WaitForReady or a blocking dial) rather than give up on "connection
// refused".
//
// Package kubeletsimtest holds a small fake plugin to exercise the
// simulator itself (and to stand in for a plugin in other tests).
//
// Several simulators can run in one process: they share no state. Sockets
// must live in short directories because a unix socket path is limited to
// 107 bytes; os.MkdirTemp("", "ks") is a good choice.
//
// Typical use in a test:
//
//	dir, _ := os.MkdirTemp("", "ks")
//	k := kubeletsim.New(kubeletsim.Options{
//		NodeName:           "node-a",
//		Dir:                dir,
//		PodResourcesSocket: filepath.Join(dir, "pr.sock"),
//	})
//	if err := k.Start(ctx); err != nil { ... }
//	defer k.Stop()
//	// start the device plugin with dir as its device-plugin directory
//	err := k.WaitForResource(ctx, "nvidia.com/gpu", func(s kubeletsim.ResourceState) bool {
//		return s.Allocatable == 8
//	})
//	alloc, err := k.Allocate(ctx, kubeletsim.PodRef{Namespace: "ns", Name: "p", UID: "u1"}, "main", "nvidia.com/gpu", 2)
//
// The simulator also plays the kubelet's DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra, v1.36) when Options.PluginRegistryDir
// and Options.Claims are set:
//
//   - It watches PluginRegistryDir (polling every 50 ms where the kubelet
//     uses fsnotify) for registration sockets, calls GetInfo
//     (pluginregistration v1), accepts type DRAPlugin with "v1.DRAPlugin"
//     among its versions and an absolute endpoint, connects to it and calls
//     NotifyRegistrationStatus. A socket replaced at its path (a restarted
//     driver) registers again. A removed socket unregisters the driver; a
//     Restart drops every driver so it registers again. Slices of a driver
//     that went away are left alone (the kubelet deletes them after a delay).
//   - PrepareClaims(pod) reads each of the pod's claims (spec.resourceClaims,
//     template claims through status.resourceClaimStatuses, and the
//     extended-resource claim), requires it allocated and the pod in
//     status.reservedFor, and calls NodePrepareResources once per driver for
//     the claims no other pod prepared yet. The CDI device IDs come back per
//     container (ContainerCDIDevices: the claims and requests each container
//     references, or the extended claim's request mappings) and in
//     PodResources' dynamic_resources. Not ready (ErrClaimsNotReady) and
//     driver errors (*DRAPluginError) leave the pod waiting; call again.
//   - UnprepareClaims(pod UID) calls NodeUnprepareResources for the claims no
//     other prepared pod uses.
//
// What the simulator leaves out: the topology manager (no NUMA alignment),
// and pods and containers without devices or claims in PodResources (only
// containers with allocations are listed). docs/status.md lists what the
// check against the real kubelet found (issue 26, tests/e2e TestSimDiff).
package kubeletsim
