package consolidation

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// movingWorkload is what the scheduler will place all or nothing once the
// pods are re-created: a gang's members, or one pod.
type movingWorkload struct {
	key  string
	gang bool
	reqs []placement.Request
	pods []*corev1.Pod
}

func (w *movingWorkload) milli() int64 {
	var m int64
	for i := range w.reqs {
		m += w.reqs[i].GPUMilli()
	}
	return m
}

// fits simulates the scheduler placing the moved pods on the cluster
// without the excluded nodes (the node to drain, the nodes draining, the
// drifted nodes: Cluster.Drifted), with
// the same placement policy: the coordinator's pods waiting for room first
// (they come first in its queue order and may take the room; failures are
// theirs), then the moved workloads, gangs first and larger first, gangs
// whole in one pool. It returns why the first workload that finds no room
// does not fit.
func (p *Planner) fits(v *view, exclude map[string]bool, moves []*corev1.Pod) error {
	moving := make(map[types.UID]bool, len(moves))
	for _, m := range moves {
		moving[m.UID] = true
	}
	nodes := make([]*corev1.Node, 0, len(v.c.Nodes))
	for _, n := range v.c.Nodes {
		if !exclude[n.Name] && !v.draining[n.Name] && !v.c.Drifted[n.Name] {
			nodes = append(nodes, n)
		}
	}
	pods := make([]*corev1.Pod, 0, len(v.c.Pods))
	for _, pod := range v.c.Pods {
		if !moving[pod.UID] {
			pods = append(pods, pod)
		}
	}
	snap, err := state.Build(state.Inputs{Nodes: nodes, Pods: pods, PoolLabel: p.opts.PoolLabel, TimesliceResource: p.opts.TimesliceResource})
	if err != nil {
		return fmt.Errorf("simulating the move: %w", err)
	}

	// 1. Pending work first; what finds no room waits for Karpenter anyway.
	for _, pod := range v.pending {
		pr := v.parsed[pod.UID]
		if pr.r.Gang != nil {
			continue // gangs wait for members or are placed whole: not simulated here
		}
		r := pr.r.Request
		if d, err := p.placeOne(snap, &r); err == nil {
			if err := snap.Assume(&r, d); err != nil {
				return fmt.Errorf("simulating pending pod %s/%s: %w", pod.Namespace, pod.Name, err)
			}
		}
	}

	// 2. The moved workloads.
	byKey := map[string]*movingWorkload{}
	var ws []*movingWorkload
	for _, pod := range moves {
		pr := v.parsed[pod.UID]
		key, gang := pod.Namespace+"/"+pod.Name, false
		if pr.r.Gang != nil {
			key, gang = pr.r.Gang.Key(), true
		}
		w := byKey[key]
		if w == nil {
			w = &movingWorkload{key: key, gang: gang}
			byKey[key] = w
			ws = append(ws, w)
		}
		w.reqs = append(w.reqs, pr.r.Request)
		w.pods = append(w.pods, pod)
	}
	sort.SliceStable(ws, func(i, j int) bool {
		if ws[i].gang != ws[j].gang {
			return ws[i].gang
		}
		if mi, mj := ws[i].milli(), ws[j].milli(); mi != mj {
			return mi > mj
		}
		return ws[i].key < ws[j].key
	})
	for _, w := range ws {
		if err := p.placeWorkload(snap, w); err != nil {
			return err
		}
	}
	return nil
}

// placeWorkload places a workload all or nothing; a gang stays in one pool
// (tried by name, the unlabelled pool last, as the scheduler does).
func (p *Planner) placeWorkload(snap *state.Snapshot, w *movingWorkload) error {
	pools := []string{""}
	if w.gang {
		pools = snap.Pools()
	}
	var lastErr error
	for _, pool := range pools {
		cp := snap.Checkpoint()
		err := p.placeAll(snap, w, pool)
		if err == nil {
			return snap.Commit(cp)
		}
		if rbErr := snap.Rollback(cp); rbErr != nil {
			return rbErr
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no node pool is left")
	}
	return lastErr
}

func (p *Planner) placeAll(snap *state.Snapshot, w *movingWorkload, pool string) error {
	for i := range w.reqs {
		r := w.reqs[i]
		if w.gang {
			r = placement.InPool(r, pool)
		}
		d, err := p.placeOne(snap, &r)
		if err != nil {
			if w.gang {
				return fmt.Errorf("gang %s (%d pods) would not fit on the other nodes: pod %s: %w", w.key, len(w.pods), w.pods[i].Name, err)
			}
			return fmt.Errorf("pod %s would not fit on the other nodes: %w", w.key, err)
		}
		if err := snap.Assume(&r, d); err != nil {
			return err
		}
	}
	return nil
}

// placeOne places r, keeping fractions off nodes that cannot take them
// (state.Snapshot.NoFraction), as the scheduler does.
func (p *Planner) placeOne(snap *state.Snapshot, r *placement.Request) (placement.Decision, error) {
	if r.ShareMilli == 0 || len(snap.NoFraction) == 0 {
		return p.placer.Place(snap.Snapshot, r)
	}
	return p.placer.Place(snap.Snapshot, withoutNodes(r, snap.NoFraction))
}

// withoutNodes returns a copy of r that excludes the named nodes.
func withoutNodes(r *placement.Request, exclude map[string]bool) *placement.Request {
	return placement.WithNodes(r, exclude, corev1.NodeSelectorOpNotIn)
}
