package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func TestPendingAgeByReason(t *testing.T) {
	created := func(p *corev1.Pod, ago time.Duration) *corev1.Pod {
		p.CreationTimestamp = metav1.NewTime(time.Now().Add(-ago))
		return p
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)},
		[]*v1alpha1.Queue{queueOf("small", "1"), queueOf("other", "1")},
		created(builders.MakePod("too-big", "default").Queue("small").Fraction(150).UID("too-big").Obj(), 10*time.Minute),
		created(builders.MakePod("too-big-2", "default").Queue("small").Fraction(150).UID("too-big-2").Obj(), 2*time.Minute),
		created(gpuPod("fits", "small", 1), time.Hour),
		created(gpuPod("over", "small", 1), 3*time.Minute),
	)
	res := c.cycle()
	if got := res.Pending[api.ReasonInvalidRequest]; got != 2 {
		t.Fatalf("InvalidRequest pending = %d, want 2", got)
	}
	invalid := testutil.ToFloat64(c.s.metrics.pendingAge.WithLabelValues(api.ReasonInvalidRequest))
	if invalid < 600 || invalid > 660 {
		t.Errorf("oldest InvalidRequest age = %.1fs, want the older pod's 600s", invalid)
	}
	over := c.reason("over")
	age := testutil.ToFloat64(c.s.metrics.pendingAge.WithLabelValues(over))
	if age < 180 || age > 240 {
		t.Errorf("oldest %s age = %.1fs, want 180s", over, age)
	}
	// The bound pod is pending no more; a reason with no pod has no series.
	if n := testutil.CollectAndCount(c.s.metrics.pendingAge); n != 2 {
		t.Errorf("%d reasons with an age, want 2 (InvalidRequest, %s)", n, over)
	}
}

func TestStatusPatchClearsPendingGangs(t *testing.T) {
	// A merge patch without pendingGangs would leave the last count (say 2)
	// on a queue whose workloads were all placed.
	body, err := statusPatch(v1alpha1.QueueStatus{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `"pendingGangs":0`) {
		t.Errorf("status patch %s does not set pendingGangs to 0", body)
	}
}

func TestQueueMetrics(t *testing.T) {
	limited := builders.MakeQueue("small").GPUQuota("1").GPULimit("2").Namespaces("default").Obj()
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)},
		[]*v1alpha1.Queue{limited, queueOf("other", "3")},
		admitted(fracPod("running", "small", 50), "n1"),
		fracPod("fits", "small", 50),
		gpuPod("no-room", "small", 1),
		gpuPod("other-no-room", "other", 1),
		// A tenant writes its pods' queue label: a name that is no Queue
		// makes no series of its own.
		gpuPod("stray", "made-up-by-a-tenant", 1),
	)
	c.cycle()
	m := c.s.metrics
	for _, tt := range []struct {
		name string
		got  float64
		want float64
	}{
		{"small allocated", testutil.ToFloat64(m.queueAllocated.WithLabelValues("small")), 1},
		{"other allocated", testutil.ToFloat64(m.queueAllocated.WithLabelValues("other")), 0},
		{"small quota", testutil.ToFloat64(m.queueQuota.WithLabelValues("small")), 1},
		{"other quota", testutil.ToFloat64(m.queueQuota.WithLabelValues("other")), 3},
		{"small limit", testutil.ToFloat64(m.queueLimit.WithLabelValues("small")), 2},
		{"small pending", testutil.ToFloat64(m.queuePending.WithLabelValues("small", c.reason("no-room"))), 1},
		{"other pending", testutil.ToFloat64(m.queuePending.WithLabelValues("other", c.reason("other-no-room"))), 1},
		{"stray pending", testutil.ToFloat64(m.queuePending.WithLabelValues("", c.reason("stray"))), 1},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if n := testutil.CollectAndCount(m.queueLimit); n != 1 {
		t.Errorf("%d limit series, want 1 (a queue without a limit has none)", n)
	}
	if n := testutil.CollectAndCount(m.queuePending); n != 3 {
		t.Errorf("%d pending series, want 3 (small, other and \"\")", n)
	}
}

func TestQueueMetricsNameOnlyQueues(t *testing.T) {
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	m.queues([]queueFigures{{name: "a"}, {name: "broken", invalid: true}}, Result{QueuePending: map[QueueReason]int{
		{"a", "NoCapacity"}:           2,
		{"broken", "InvalidRequest"}:  1,
		{"not-a-queue", "NoCapacity"}: 3,
		{"", "NoCapacity"}:            1,
	}})
	for _, tt := range []struct {
		queue, reason string
		want          float64
	}{{"a", "NoCapacity", 2}, {"broken", "InvalidRequest", 1}, {"", "NoCapacity", 4}} {
		if got := testutil.ToFloat64(m.queuePending.WithLabelValues(tt.queue, tt.reason)); got != tt.want {
			t.Errorf("pending %q %s = %v, want %v", tt.queue, tt.reason, got, tt.want)
		}
	}
	if n := testutil.CollectAndCount(m.queuePending); n != 3 {
		t.Errorf("%d pending series, want 3", n)
	}
	if n := testutil.CollectAndCount(m.queueQuota); n != 1 {
		t.Errorf("%d quota series, want 1 (an invalid queue has none)", n)
	}
}
