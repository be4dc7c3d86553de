package placement

import (
	"fmt"
	"sort"
)

// Scalar resources are counted, not shaped: a MIG device or a time-sliced
// replica is one unit of a named resource, and a node has so many of each
// free (Node.Scalars). A request asking for some (Request.Scalars) fits a
// node only with all of them free there (Place treats the other nodes as
// ineligible: withScalars); Assume takes them, Forget gives
// them back, and Rollback restores them. No policy scores them: a request
// for scalars alone is scored like a CPU-only request, and ties go to the
// node that comes first.
//
// A snapshot without scalars (the openb simulator) keeps no scalar state at
// all, so the placement of GPUs and shares is exactly what it was.

// scalarAsk is one scalar resource a request asks for.
type scalarAsk struct {
	name string
	idx  int32 // index in Snapshot.scalarNames; -1 when no node has the resource
	n    int64
}

// initScalars interns the nodes' scalar resource names and copies their free
// units.
func (s *Snapshot) initScalars(nodes []*Node) error {
	seen := map[string]bool{}
	for i := range nodes {
		for name, n := range nodes[i].Scalars {
			if name == "" || n < 0 {
				return fmt.Errorf("building snapshot: node %q has %d units of resource %q", nodes[i].Name, n, name)
			}
			seen[name] = true
		}
	}
	if len(seen) == 0 {
		return nil
	}
	s.scalarNames = make([]string, 0, len(seen))
	for name := range seen {
		s.scalarNames = append(s.scalarNames, name)
	}
	sort.Strings(s.scalarNames)
	s.scalarIdx = make(map[string]int32, len(s.scalarNames))
	for k, name := range s.scalarNames {
		s.scalarIdx[name] = int32(k)
	}
	k := len(s.scalarNames)
	s.scal = make([]int64, len(nodes)*k)
	for i := range nodes {
		for name, n := range nodes[i].Scalars {
			s.scal[i*k+int(s.scalarIdx[name])] = n
		}
	}
	return nil
}

// nodeScalars returns node i's free units by scalar index; the slice aliases
// the snapshot. It is empty when the snapshot has no scalars.
func (s *Snapshot) nodeScalars(i int) []int64 {
	k := len(s.scalarNames)
	return s.scal[i*k : (i+1)*k]
}

// nodeScalarMap is node i's free units of the scalars it was built with.
func (s *Snapshot) nodeScalarMap(i int) map[string]int64 {
	meta := s.meta[i].Scalars
	if meta == nil {
		return nil
	}
	sc := s.nodeScalars(i)
	out := make(map[string]int64, len(meta))
	for name := range meta {
		out[name] = sc[s.scalarIdx[name]]
	}
	return out
}

// scalarAsks resolves r's scalar resources against the snapshot, sorted by
// name so that explanations are deterministic; nil when r asks for none.
func (s *Snapshot) scalarAsks(r *Request) []scalarAsk {
	if len(r.Scalars) == 0 {
		return nil
	}
	var asks []scalarAsk
	for name, n := range r.Scalars {
		if n <= 0 {
			continue
		}
		idx, ok := s.scalarIdx[name]
		if !ok {
			idx = -1
		}
		asks = append(asks, scalarAsk{name: name, idx: idx, n: n})
	}
	sort.Slice(asks, func(a, b int) bool { return asks[a].name < asks[b].name })
	return asks
}

// scalarsFit reports whether node i has every ask free, and otherwise the
// first ask (by name) it lacks.
func (s *Snapshot) scalarsFit(i int, asks []scalarAsk) (bool, int) {
	sc := s.nodeScalars(i)
	for a := range asks {
		if asks[a].idx < 0 || sc[asks[a].idx] < asks[a].n {
			return false, a
		}
	}
	return true, -1
}

// withScalars is the eligibility of a request asking for scalars: base
// (nil: every node eligible) with the nodes that lack a scalar rejected
// (rejectsScalar). Folding scalars into eligibility keeps Place's loop as
// it is for the requests without: the openb simulator's and whole-GPU and
// share placement pay nothing for them. It is not cached, as free units
// change with every Assume.
func (s *Snapshot) withScalars(base *eligibility, asks []scalarAsk) *eligibility {
	e := &eligibility{code: make([]uint8, len(s.nodes))}
	if base != nil {
		copy(e.code, base.code)
	}
	for i := range e.code {
		if e.code[i] != eligible {
			continue
		}
		if ok, _ := s.scalarsFit(i, asks); ok {
			e.any = true
		} else {
			e.code[i] = rejectsScalar
		}
	}
	return e
}

// checkScalars checks that taking (sign -1) or giving back (sign +1) the
// asks on node i leaves no count negative. Giving back is not bounded above:
// the snapshot knows what is free, not the node's allocatable.
func (s *Snapshot) checkScalars(i int, asks []scalarAsk, sign int) error {
	if len(asks) == 0 {
		return nil
	}
	sc := s.nodeScalars(i)
	for _, a := range asks {
		if a.idx < 0 {
			if sign < 0 {
				return fmt.Errorf("node has no resource %s: %w", a.name, ErrConflict)
			}
			return fmt.Errorf("giving back %d %s: no node has the resource: %w", a.n, a.name, ErrConflict)
		}
		if sc[a.idx]+int64(sign)*a.n < 0 {
			return fmt.Errorf("%d %s asked, %d free: %w", a.n, a.name, sc[a.idx], ErrConflict)
		}
	}
	return nil
}

// applyScalars takes (sign -1) or gives back (sign +1) the asks on node i;
// checkScalars has accepted them.
func (s *Snapshot) applyScalars(i int, asks []scalarAsk, sign int) {
	if len(asks) == 0 {
		return
	}
	sc := s.nodeScalars(i)
	for _, a := range asks {
		sc[a.idx] += int64(sign) * a.n
	}
}

// ScalarNames lists the scalar resources some node of the snapshot has, sorted.
func (s *Snapshot) ScalarNames() []string { return append([]string(nil), s.scalarNames...) }
