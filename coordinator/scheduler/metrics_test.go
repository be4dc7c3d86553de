package scheduler

import (
	"strings"
	"testing"
	"time"

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
