package e2e

import (
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// Issue 31: a burst of five 1-GPU pods, with the chart's defaults (no price
// table), buys five 1-GPU nodes ($70.95/h on the test bed) and not one 8-GPU
// node ($98.32/h, three GPUs idle): each placeholder prefers nodes of at
// most its GPUs (label karpenter.k8s.aws/instance-gpu-count, which the test
// bed's offerings carry as AWS's do), and Karpenter buys the cheapest such
// type by its provider's prices. With a price table
// that says otherwise (the admin's 8-GPU nodes cost $12/h, say a discount),
// the placeholders follow the table: one 8-GPU node. A NodePool of 8-GPU
// types only still buys one node for the burst, not one per placeholder.
func TestBurstBuysTheCheapestCapacity(t *testing.T) {
	t.Parallel()
	onlyEight := cluster.NodePool{Name: "gpu", Labels: map[string]string{api.LabelGPUNode: "true"}, InstanceTypes: []string{"gpu-8x-h100"}}
	for _, tc := range []struct {
		name  string
		chart cluster.ChartOptions
		pools []cluster.NodePool // empty: the test bed's
		want  map[string]int     // instance type -> nodes holding the burst
	}{
		{name: "the chart's defaults", want: map[string]int{"gpu-1x-h100": 5}},
		{name: "the chart's defaults, a NodePool of 8-GPU nodes only", pools: []cluster.NodePool{onlyEight}, want: map[string]int{"gpu-8x-h100": 1}},
		{
			name: "a price table where the 8-GPU node is cheaper",
			chart: cluster.ChartOptions{SetJSON: []string{`coordinator.prices={"instanceTypes":[` +
				`{"name":"gpu-8x-h100","gpus":8,"price":12},{"name":"gpu-1x-h100","gpus":1,"price":14.19}]}`}},
			want: map[string]int{"gpu-8x-h100": 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := karpenterClusterWith(t, tc.chart, tc.pools...)
			applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
			startCoordinator(t, c, "c1", "--leader-elect=false")
			var names []string
			for i := range 5 {
				names = append(names, fmt.Sprintf("burst-%d", i))
				create(t, c, pod(names[i], "team-a").GPUs(1).Obj())
			}
			pods := running(t, c, 3*time.Minute, names...)
			got := map[string]int{}
			nodes := map[string]bool{}
			price := 0.0
			for _, p := range pods {
				if nodes[p.Spec.NodeName] {
					continue
				}
				nodes[p.Spec.NodeName] = true
				n, err := c.Client.CoreV1().Nodes().Get(t.Context(), p.Spec.NodeName, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				got[n.Labels[corev1.LabelInstanceTypeStable]]++
				// The kwok provider labels its nodes with the offering's price.
				v, _ := strconv.ParseFloat(n.Labels["eks-node-viewer/instance-price"], 64)
				price += v
			}
			t.Logf("the burst runs on %v, $%.2f/h at the provider's prices", got, price)
			if !maps.Equal(got, tc.want) {
				t.Errorf("the burst runs on nodes of types %v, want %v", got, tc.want)
			}
			// Nothing else was bought for it (an 8-GPU NodeClaim beside the
			// 1-GPU nodes, say).
			claims := map[string]int{}
			l, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, nc := range l.Items {
				claims[nc.GetLabels()[corev1.LabelInstanceTypeStable]]++
			}
			if !maps.Equal(claims, tc.want) {
				t.Errorf("NodeClaims by instance type %v, want %v", claims, tc.want)
			}
			if ph := systemPods(t, c, api.RolePlaceholder); len(ph) != 0 {
				t.Errorf("%d placeholders left after the burst runs", len(ph))
			}
		})
	}
}
