package scheduler

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestLastSaid: a value said is not said again; a new one is; a failed
// write is forgotten so the next cycle says it again, unless something
// newer was said since; keep forgets the keys no longer live.
func TestLastSaid(t *testing.T) {
	type step struct {
		op, k, v string // op: say, failed, forget, keep (v: the live key)
		want     bool   // say's answer: news, to be written
	}
	cases := []struct {
		name  string
		steps []step
	}{{
		name: "the same value is not said again",
		steps: []step{
			{op: "say", k: "q", v: "a", want: true},
			{op: "say", k: "q", v: "a", want: false},
			{op: "say", k: "q", v: "b", want: true},
			{op: "say", k: "r", v: "b", want: true},
		},
	}, {
		name: "a failed write is said again",
		steps: []step{
			{op: "say", k: "q", v: "a", want: true},
			{op: "failed", k: "q", v: "a"},
			{op: "say", k: "q", v: "a", want: true},
		},
	}, {
		name: "an older failed write does not forget a newer value",
		steps: []step{
			{op: "say", k: "q", v: "a", want: true},
			{op: "say", k: "q", v: "b", want: true},
			{op: "failed", k: "q", v: "a"},
			{op: "say", k: "q", v: "b", want: false},
		},
	}, {
		name: "forget and keep",
		steps: []step{
			{op: "say", k: "q", v: "a", want: true},
			{op: "say", k: "r", v: "a", want: true},
			{op: "forget", k: "q"},
			{op: "say", k: "q", v: "a", want: true},
			{op: "keep", v: "r"},
			{op: "say", k: "r", v: "a", want: false},
			{op: "say", k: "q", v: "a", want: true},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLastSaid[string, string]()
			if !l.empty() {
				t.Fatal("a new record is not empty")
			}
			for i, st := range tc.steps {
				switch st.op {
				case "say":
					if got := l.say(st.k, st.v); got != st.want {
						t.Errorf("step %d: say(%s, %s) = %v, want %v", i, st.k, st.v, got, st.want)
					}
				case "failed":
					l.failed(st.k, st.v)
				case "forget":
					l.forget(st.k)
				case "keep":
					l.keep(func(k string) bool { return k == st.v })
				}
			}
		})
	}
}

// TestPodReasons: a pod told a reason is not told it again with the same
// message, nor within the refresh with another; after the refresh a new
// message is told; another reason is told at once; a failed write or a
// binding (unsay) lets the next cycle tell it again; forgetOld forgets
// what is a refresh old.
func TestPodReasons(t *testing.T) {
	const refresh = time.Minute
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		op          string // say, failed, unsay, forgetOld
		uid         types.UID
		reason, msg string
		t           time.Duration
		want        bool // say's answer: tell the pod
	}
	cases := []struct {
		name  string
		steps []step
	}{{
		name: "a said reason is not re-written",
		steps: []step{
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", want: true},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", t: refresh / 4, want: false},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m2", t: refresh / 2, want: false},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m2", t: refresh, want: true},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m2", t: 3 * refresh, want: false},
			{op: "say", uid: "p", reason: "QueueFull", msg: "m2", t: 3*refresh + time.Second, want: true},
		},
	}, {
		name: "a failed write or a binding lets it be told again",
		steps: []step{
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", want: true},
			{op: "failed", uid: "p", reason: "NoCapacity", msg: "m1"},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", want: true},
			{op: "failed", uid: "p", reason: "NoCapacity", msg: "older"},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", want: false},
			{op: "unsay", uid: "p"},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", want: true},
		},
	}, {
		name: "forgotten after the refresh",
		steps: []step{
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", want: true},
			{op: "say", uid: "q", reason: "NoCapacity", msg: "m1", t: time.Second, want: true},
			{op: "forgetOld", t: refresh},
			{op: "say", uid: "p", reason: "NoCapacity", msg: "m1", t: refresh, want: true},
			{op: "say", uid: "q", reason: "NoCapacity", msg: "m1", t: refresh, want: false},
		},
	}, {
		name: "a pod without a UID is always told",
		steps: []step{
			{op: "say", reason: "NoCapacity", msg: "m1", want: true},
			{op: "say", reason: "NoCapacity", msg: "m1", want: true},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newPodReasons(refresh)
			for i, st := range tc.steps {
				now := t0.Add(st.t)
				switch st.op {
				case "say":
					if got := r.say(st.uid, st.reason, st.msg, now); got != st.want {
						t.Errorf("step %d: say(%q, %s, %s) at +%v = %v, want %v", i, st.uid, st.reason, st.msg, st.t, got, st.want)
					}
				case "failed":
					r.failed(st.uid, st.reason, st.msg)
				case "unsay":
					r.unsay(st.uid)
				case "forgetOld":
					r.forgetOld(now)
				}
			}
		})
	}
}
