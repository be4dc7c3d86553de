package queue

import (
	"fmt"

	"github.com/gpufrac/gpufrac/api"
)

// Reason says why Check refused a request; it is the pod-condition reason.
type Reason string

// The reasons Check gives.
const (
	// ReasonOverLimit: the request would take the queue or an ancestor beyond a limit.
	ReasonOverLimit Reason = api.ReasonOverLimit
	// ReasonOverQuota: non-preemptible work beyond the deserved quota, or
	// preemptible work beyond the fair share.
	ReasonOverQuota Reason = api.ReasonOverQuota
	// ReasonInvalidRequest: the queue does not exist or has child queues.
	ReasonInvalidRequest Reason = api.ReasonInvalidRequest
)

// Verdict is Check's answer.
type Verdict struct {
	// Allowed says the queue admits the request now.
	Allowed bool
	// Reason is empty when Allowed.
	Reason Reason
	// Message explains the verdict with numbers, for the pod condition and
	// event. It is empty for requests admitted within the deserved quota.
	Message string
	// OverQuota is set on admitted requests that go beyond a deserved quota
	// (the leaf's or an ancestor's): the work is preemptible, may be reclaimed,
	// and must not make the cluster scale up.
	OverQuota bool
}

// Check decides whether a leaf queue admits req now, on top of the usage
// already assumed, and charges nothing. The rules, checked at the leaf and at
// every ancestor, for each resource req asks for:
//
//  1. usage + req above the limit: refused, OverLimit;
//  2. non-preemptible work: non-preemptible usage + req above the deserved
//     quota: refused, OverQuota (non-preemptible work never borrows);
//  3. preemptible work: usage + req above the deserved quota is admitted with
//     Verdict.OverQuota while it stays within the fair share from the last
//     FairShare call (the deserved quota when there was none); beyond it:
//     refused, OverQuota. At an ancestor, work that is within the leaf's
//     deserved quota is measured against the children's usage within their
//     own quotas, so a sibling borrowing idle quota never blocks a queue from
//     its deserved share (ReclaimVictims takes the loan back); only parents
//     whose children's quotas add up to more than their own can refuse it.
//
// An unknown or non-leaf queue is refused with ReasonInvalidRequest.
func (t *Tree) Check(queue string, req Resources, nonPreemptible bool) Verdict {
	leaf, err := t.leaf(queue)
	if err != nil {
		return Verdict{Reason: ReasonInvalidRequest, Message: err.Error()}
	}
	path := leaf.path()
	// 1. Limits.
	for _, n := range path {
		for d := range numDims {
			r := req.get(d)
			if r <= 0 {
				continue
			}
			used, limit := n.used.get(d), n.spec.Limit.get(d)
			if satAdd(used, r) > limit {
				return Verdict{Reason: ReasonOverLimit, Message: fmt.Sprintf(
					"%s: limit of %s %s; %s in use and %s more asked",
					describe(n, leaf), d.format(limit), d.label(), d.format(used), d.format(r))}
			}
		}
	}
	// 2. Non-preemptible work stays within the deserved quota.
	if nonPreemptible {
		for _, n := range path {
			for d := range numDims {
				r := req.get(d)
				if r <= 0 {
					continue
				}
				used, quota := n.usedNonPreemptible.get(d), n.spec.Quota.get(d)
				if satAdd(used, r) > quota {
					return Verdict{Reason: ReasonOverQuota, Message: fmt.Sprintf(
						"%s: non-preemptible pods use %s of %s deserved %s and %s more is asked; "+
							"non-preemptible work must fit in the deserved quota: wait for some to finish, or run this as preemptible",
						describe(n, leaf), d.format(used), d.format(quota), d.label(), d.format(r))}
				}
			}
		}
		return Verdict{Allowed: true}
	}
	// 3. Preemptible work may borrow up to the fair share.
	var over *Verdict
	for d := range numDims {
		r := req.get(d)
		if r <= 0 {
			continue
		}
		borrowing := false // the request went beyond a deserved quota below n
		for _, n := range path {
			used, quota := n.used.get(d), n.spec.Quota.get(d)
			after := satAdd(used, r)
			if !borrowing {
				// Within deserved so far: at an ancestor count only its
				// children's usage within their own quotas, so that a
				// sibling's borrowing does not count against this request
				// (ReclaimVictims takes it back when room runs out).
				if n != leaf {
					after = satAdd(n.deservedUsage(d), r)
				}
				if after <= quota {
					continue
				}
				borrowing = true
				after = satAdd(used, r)
			} else if after <= quota {
				continue
			}
			fair, known := t.fairShare(n, d)
			if after > fair {
				how := "its fair share is"
				if !known {
					how = "no fair share is known yet, so it is held to"
				}
				return Verdict{Reason: ReasonOverQuota, Message: fmt.Sprintf(
					"%s: %s of %s %s deserved in use and %s more asked, and %s %s while other queues wait",
					describe(n, leaf), d.format(used), d.format(quota), d.label(), d.format(r), how, d.format(fair))}
			}
			if over == nil {
				over = &Verdict{Allowed: true, OverQuota: true, Message: fmt.Sprintf(
					"%s: beyond its %s deserved %s (%s with this, fair share %s); runs preemptible and may be reclaimed",
					describe(n, leaf), d.format(quota), d.label(), d.format(after), d.format(fair))}
			}
		}
	}
	if over != nil {
		return *over
	}
	return Verdict{Allowed: true}
}

// deservedUsage is the part of n's usage of d that its children use within
// their own deserved quotas (recursively); a leaf's whole usage.
func (n *node) deservedUsage(d dim) int64 {
	if n.isLeaf() {
		return n.used.get(d)
	}
	var sum int64
	for _, c := range n.children {
		sum = satAdd(sum, min(c.deservedUsage(d), c.spec.Quota.get(d)))
	}
	return sum
}

// fairShare returns n's fair share of d from the last FairShare call, or its
// deserved quota (known false) when there is none.
func (t *Tree) fairShare(n *node, d dim) (int64, bool) {
	if s, ok := t.fair[n.spec.Name]; ok {
		return s.get(d), true
	}
	return n.spec.Quota.get(d), false
}

// describe names the queue a message is about, relative to the leaf asked for.
func describe(n, leaf *node) string {
	if n == leaf {
		return "queue " + n.spec.Name
	}
	return fmt.Sprintf("queue %s (an ancestor of %s)", n.spec.Name, leaf.spec.Name)
}
