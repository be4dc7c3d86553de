package scheduler

import (
	"sync"
	"time"
)

// placeholderHints is what placeholders taught about where a group's pods
// should go, kept from one cycle to the next: the nodes where the group's
// placeholders landed or that Karpenter nominated for them, the NodeClaims
// Karpenter nominated (resolved to nodes once they have one), and when the
// group's landed placeholders were released (its cooldown). The event
// handler (OnEvent) and the cycle write it; it has a lock of its own,
// taken inside Scheduler.mu where the cycle reads the assumed pods with it
// (cooling), never the other way round.
type placeholderHints struct {
	mu sync.Mutex
	// preferred: placeholder group -> nodes where its placeholders landed
	// or that Karpenter nominated for them.
	preferred map[string][]string
	// claims: placeholder group -> NodeClaims Karpenter nominated for it.
	claims map[string][]string
	// released: placeholder group -> when its landed placeholders were deleted.
	released map[string]time.Time
}

func newPlaceholderHints() *placeholderHints {
	return &placeholderHints{preferred: map[string][]string{}, claims: map[string][]string{}, released: map[string]time.Time{}}
}

// nominated records the nodes and NodeClaims Karpenter nominated for
// group's placeholders.
func (h *placeholderHints) nominated(group string, nodes, claims []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range nodes {
		h.preferred[group] = appendUniqueStr(h.preferred[group], n)
	}
	for _, c := range claims {
		h.claims[group] = appendUniqueStr(h.claims[group], c)
	}
}

// landed records that a placeholder of group landed on node and was
// released at now: the group prefers node, and cools down from now.
func (h *placeholderHints) landed(group, node string, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.preferred[group] = appendUniqueStr(h.preferred[group], node)
	h.released[group] = now
}

// cooling tells whether group still waits for its pods to take the
// capacity its released placeholders found: released less than
// releaseCooldown before now, and one of its preferred nodes still busy
// (settling, or with a pod being bound).
func (h *placeholderHints) cooling(group string, now time.Time, busy func(node string) bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.released[group]) >= releaseCooldown {
		return false
	}
	for _, n := range h.preferred[group] {
		if busy(n) {
			return true
		}
	}
	return false
}

// of is group's preferred nodes and nominated NodeClaims (copies).
func (h *placeholderHints) of(group string) (nodes, claims []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.preferred[group]...), append([]string(nil), h.claims[group]...)
}

// hinted tells whether some group has preferred nodes or nominated NodeClaims.
func (h *placeholderHints) hinted() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.preferred) > 0 || len(h.claims) > 0
}

// nodes are the nodes some group prefers (nil when none).
func (h *placeholderHints) nodes() map[string]bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out map[string]bool
	for _, ns := range h.preferred {
		for _, n := range ns {
			if out == nil {
				out = map[string]bool{}
			}
			out[n] = true
		}
	}
	return out
}

// prune forgets the hints of groups not live (neither placeholders nor
// admitted pending work), nodes exists denies, and release times of such
// groups past their cooldown at now. live names the live groups; it is
// called only when some hint is kept, since naming a group costs a hash of
// its pods' constraints.
func (h *placeholderHints) prune(groups func() map[string]bool, exists func(node string) bool, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.preferred) == 0 && len(h.claims) == 0 && len(h.released) == 0 {
		return
	}
	live := groups()
	for g, ns := range h.preferred {
		kept := ns[:0]
		for _, n := range ns {
			if exists(n) {
				kept = append(kept, n)
			}
		}
		if !live[g] || len(kept) == 0 {
			delete(h.preferred, g)
			continue
		}
		h.preferred[g] = kept
	}
	for g := range h.claims {
		if !live[g] {
			delete(h.claims, g)
		}
	}
	for g, t := range h.released {
		if !live[g] && now.Sub(t) >= releaseCooldown {
			delete(h.released, g)
		}
	}
}

// empty tells whether no hint is kept.
func (h *placeholderHints) empty() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.preferred) == 0 && len(h.claims) == 0 && len(h.released) == 0
}
