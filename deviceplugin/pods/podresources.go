// Package pods connects the node agent to the pods on its node: the
// kubelet's PodResources API (which pod holds which device), the pod informer
// that tells the fraction resource which GPU the coordinator chose, and the
// write-back of the GPU each fraction or reservation pod actually got.
package pods

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Assignment is the GPU devices one container holds.
type Assignment struct {
	Namespace, Pod, Container string
	// Resource is the device-plugin resource, or api.DRADriver for the
	// devices of DRA claims (then Claims says which, DeviceIDs is empty).
	Resource  string
	DeviceIDs []string
	// Claims are the devices of gpufrac's DRA driver the container holds
	// through resource claims, from PodResources' dynamic resources.
	Claims []ClaimDevice
}

// ClaimDevice is one device (or one share of it) a container holds through
// a resource claim: the claim, and the driver's pool, device and share.
type ClaimDevice struct {
	ClaimNamespace, ClaimName string
	Pool, Device              string
	// ShareID is set for a share of a device that allows several
	// allocations.
	ShareID string
}

// PodResources reads the kubelet's PodResources API, caching List for a
// short time so allocation-path callers stay fast.
type PodResources struct {
	conn   *grpc.ClientConn
	client podresourcesapi.PodResourcesListerClient
	ttl    time.Duration
	clock  clock.PassiveClock
	// resourceNames are the resources whose devices are reported.
	fractionName, wholeName string

	// syncWait bounds the wait for a restarted kubelet's pods (kubeletSyncWait).
	syncWait time.Duration

	mu      sync.Mutex
	fetched time.Time
	cache   []Assignment
	// lastBusy is when a listing last showed devices, and busy whether the
	// last listing did; syncUntil, while set, is until when a listing
	// without them is taken again (the kubelet restarted while the node had
	// pods: see KubeletRestarted).
	lastBusy, syncUntil time.Time
	busy                bool
	// answered: devices an Allocate answer gave that no listing has shown
	// yet, oldest first (see Answered).
	answered []answeredDevices
}

// answeredDevices are the devices of one Allocate answer.
type answeredDevices struct {
	resource string
	ids      []string
	at       time.Time
}

// answeredTTL is how long devices an Allocate answer gave count as
// allocated without a listing showing them. The kubelet records an
// allocation right after Allocate returns; an answer it never records (the
// pod's admission failed on a later container) stops counting after this.
const answeredTTL = 30 * time.Second

// kubeletSyncWait bounds how long, after a kubelet restart, a listing
// without devices is taken again: a restarted kubelet keeps its pods'
// devices (its checkpoint) but lists no pod until its pod sources have
// synced, 0.9-1.0 s on the test bed's real kubelet (docs/status.md,
// issue 26). Read as an idle node, that listing gave a GPU carrying a
// fraction to a whole-GPU pod.
const kubeletSyncWait = 3 * time.Second

// busyLookback: a kubelet restart finds a node busy if its last listing
// showed devices, or one did this recently (a listing taken between the
// kubelet's restart and its socket's event may already be the empty one).
const busyLookback = 15 * time.Second

// answeredSettle is how long after an Allocate answer a listing that does
// not show its devices means they are gone, not yet recorded: the kubelet
// records an allocation as soon as Allocate returns.
const answeredSettle = 2 * time.Second

var _ resource.UsageSource = (*PodResources)(nil)

// podResourcesBackoff retries a lost kubelet socket quickly: it is local,
// and after a kubelet restart it is back within moments. gRPC's default
// (1 s, growing to 2 min) would leave List failing on the last dial error
// long after the kubelet serves again.
var podResourcesBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: time.Second,
}

// NewPodResources connects to the PodResources socket (the connection is lazy).
func NewPodResources(socket string, ttl time.Duration, clk clock.PassiveClock) (*PodResources, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(podResourcesBackoff))
	if err != nil {
		return nil, fmt.Errorf("connecting to PodResources at %s: %w", socket, err)
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &PodResources{
		conn:         conn,
		client:       podresourcesapi.NewPodResourcesListerClient(conn),
		ttl:          ttl,
		clock:        clk,
		syncWait:     kubeletSyncWait,
		fractionName: api.ResourceFraction,
		wholeName:    api.ResourceGPU,
	}, nil
}

// Close closes the connection.
func (p *PodResources) Close() error { return p.conn.Close() }

// Invalidate drops the cache so the next call lists again.
func (p *PodResources) Invalidate() {
	p.mu.Lock()
	p.fetched = time.Time{}
	p.mu.Unlock()
}

// KubeletRestarted says the kubelet was restarted (its socket was created
// again). If the node had pods (the last listing showed devices, or one
// did within busyLookback), listings without devices are taken again
// for up to kubeletSyncWait, until the kubelet lists its pods: the devices
// it keeps for them are not free. The device plugins register again only
// after this call, so no admission of the new kubelet reads such a listing.
func (p *PodResources) KubeletRestarted() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fetched = time.Time{}
	if p.busy || (!p.lastBusy.IsZero() && p.clock.Since(p.lastBusy) < busyLookback) {
		p.syncUntil = p.clock.Now().Add(p.syncWait)
	}
}

// kubeletSyncPoll spaces the listings asked of a restarted kubelet until
// it lists its pods: 100 ms, each up to 10 % longer at random.
var kubeletSyncPoll = wait.Backoff{Duration: 100 * time.Millisecond, Jitter: 0.1}

// List returns every container's devices, from cache when fresh.
func (p *PodResources) List(ctx context.Context) ([]Assignment, error) {
	p.mu.Lock()
	if !p.fetched.IsZero() && p.clock.Since(p.fetched) < p.ttl {
		out := p.cache
		p.mu.Unlock()
		return out, nil
	}
	p.mu.Unlock()
	poll := kubeletSyncPoll
	for {
		out, err := p.fetch(ctx)
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		now := p.clock.Now()
		if len(out) > 0 {
			p.lastBusy, p.syncUntil = now, time.Time{}
		}
		syncing := !p.syncUntil.IsZero() && now.Before(p.syncUntil)
		if !syncing {
			p.busy = len(out) > 0
		}
		if !syncing {
			p.syncUntil = time.Time{}
			p.cache, p.fetched = out, now
			p.mu.Unlock()
			return out, nil
		}
		p.mu.Unlock()
		// The restarted kubelet has not listed its pods yet: ask again.
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("listing pod resources: waiting for the restarted kubelet's pods: %w", ctx.Err())
		case <-time.After(poll.Step()):
		}
	}
}

// fetch asks the kubelet for its listing.
func (p *PodResources) fetch(ctx context.Context) ([]Assignment, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// WaitForReady: a connection between two dials (the kubelet restarted)
	// waits for the socket within the deadline instead of failing at once.
	resp, err := p.client.List(ctx, &podresourcesapi.ListPodResourcesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, fmt.Errorf("listing pod resources: %w", err)
	}
	return assignmentsOf(resp), nil
}

// assignmentsOf turns a List answer into one Assignment per container and
// resource. The kubelet reports a device once per NUMA node it sits on, and
// recent kubelets one entry per device: entries are merged and device IDs
// deduplicated, so a container's count of units or GPUs is exact.
func assignmentsOf(resp *podresourcesapi.ListPodResourcesResponse) []Assignment {
	var out []Assignment
	for _, pr := range resp.GetPodResources() {
		for _, c := range pr.GetContainers() {
			byResource := map[string]int{} // resource name -> index in out
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if cr.GetDriverName() != api.DRADriver {
						continue
					}
					i, ok := byResource[api.DRADriver]
					if !ok {
						i = len(out)
						byResource[api.DRADriver] = i
						out = append(out, Assignment{
							Namespace: pr.GetNamespace(), Pod: pr.GetName(), Container: c.GetName(),
							Resource: api.DRADriver,
						})
					}
					out[i].Claims = append(out[i].Claims, ClaimDevice{
						ClaimNamespace: dr.GetClaimNamespace(), ClaimName: dr.GetClaimName(),
						Pool: cr.GetPoolName(), Device: cr.GetDeviceName(), ShareID: cr.GetShareId(),
					})
				}
			}
			for _, d := range c.GetDevices() {
				i, ok := byResource[d.GetResourceName()]
				if !ok {
					i = len(out)
					byResource[d.GetResourceName()] = i
					out = append(out, Assignment{
						Namespace: pr.GetNamespace(), Pod: pr.GetName(), Container: c.GetName(),
						Resource: d.GetResourceName(),
					})
				}
				out[i].DeviceIDs = append(out[i].DeviceIDs, d.GetDeviceIds()...)
			}
		}
	}
	for i := range out {
		slices.Sort(out[i].DeviceIDs)
		out[i].DeviceIDs = slices.Compact(out[i].DeviceIDs)
		slices.SortFunc(out[i].Claims, compareClaimDevices)
		out[i].Claims = slices.Compact(out[i].Claims)
	}
	return out
}

func compareClaimDevices(a, b ClaimDevice) int {
	return cmp.Or(cmp.Compare(a.ClaimNamespace, b.ClaimNamespace), cmp.Compare(a.ClaimName, b.ClaimName),
		cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device), cmp.Compare(a.ShareID, b.ShareID))
}

// Answered records the devices an Allocate answer just gave. The kubelet
// records the allocation only after Allocate returns, and a listing taken
// in between (the write-back, kicked by the same answer) is cached: until a
// listing shows the devices, or answeredTTL passes, Usage counts them, so
// the next admission never sees a GPU as freer than it is.
func (p *PodResources) Answered(resource string, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.answered = append(p.answered, answeredDevices{resource: resource, ids: slices.Clone(ids), at: p.clock.Now()})
	p.fetched = time.Time{}
}

// Usage implements resource.UsageSource: the kubelet's listing plus the
// devices answered but not listed yet.
func (p *PodResources) Usage(ctx context.Context) (map[string]resource.GPUUsage, error) {
	as, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	return UsageOf(append(slices.Clip(as), p.unlisted(as)...), p.wholeName, p.fractionName), nil
}

// unlisted returns the answered devices the listing as does not show, as
// assignments of a pod named "(being admitted)", and forgets the others.
func (p *PodResources) unlisted(as []Assignment) []Assignment {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.answered) == 0 {
		return nil
	}
	listed := map[string]map[string]bool{} // resource -> device ID -> listed
	for _, a := range as {
		if listed[a.Resource] == nil {
			listed[a.Resource] = map[string]bool{}
		}
		for _, id := range a.DeviceIDs {
			listed[a.Resource][id] = true
		}
	}
	now := p.clock.Now()
	var out []Assignment
	kept := p.answered[:0]
	for _, ans := range p.answered {
		if now.Sub(ans.at) >= answeredTTL {
			continue
		}
		var missing []string
		for _, id := range ans.ids {
			if !listed[ans.resource][id] {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			continue
		}
		if !p.fetched.IsZero() && p.fetched.Sub(ans.at) >= answeredSettle {
			// The kubelet has long recorded the allocation, and the listing
			// does not show it: the pod ended (or its admission failed). A
			// short pod that ended before any listing showed it would
			// otherwise hold its GPU against whole GPUs and reservations
			// for answeredTTL.
			continue
		}
		kept = append(kept, ans)
		out = append(out, Assignment{Pod: "(being admitted)", Resource: ans.resource, DeviceIDs: missing})
	}
	p.answered = kept
	return out
}

// UsageOf sums assignments into per-GPU usage: the pod holding each GPU
// whole, the fraction units and the time-sliced replicas on it.
func UsageOf(as []Assignment, wholeName, fractionName string) map[string]resource.GPUUsage {
	usage := map[string]resource.GPUUsage{}
	for _, a := range as {
		switch a.Resource {
		case wholeName:
			for _, id := range a.DeviceIDs {
				u := usage[id]
				u.WholeHolder = a.Namespace + "/" + a.Pod
				u.WholeHolderIsReservation = IsReservation(a.Namespace, a.Pod)
				usage[id] = u
			}
		default:
			// Fraction units, and time-sliced replicas of any resource
			// name (a renamed one, or one an earlier config served): both
			// are "<uuid>::<k>". MIG devices (MIG UUIDs) and other
			// devices do not parse and are left out.
			for _, id := range a.DeviceIDs {
				gpu, _, err := resource.ParseUnitID(id)
				if err != nil {
					continue
				}
				u := usage[gpu]
				if a.Resource == fractionName {
					u.Units++
				} else {
					u.Replicas++
				}
				usage[gpu] = u
			}
		}
	}
	return usage
}

// IsReservation tells whether a pod is a gpufrac reservation pod.
func IsReservation(namespace, name string) bool {
	return namespace == api.ReservationNamespace && strings.HasPrefix(name, api.ReservationNamePrefix)
}
