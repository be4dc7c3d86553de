package scheduler

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/kubecheck"
)

// BenchmarkCycleKubeChecks is BenchmarkCycle's busy cycle (5,000 nodes of 8
// GPUs, 55,000 pods bound, 5,000 pending) with kube-scheduler's checks on
// (Deps.Kube) and a tenth of the pods using them (issue 28): a tenth of the
// bound pods and of the pending ones belong to 100 Deployment-like apps with
// a hard zone spread constraint (5 zones, maxSkew 1); half of those pending
// ones also mount a PVC bound to a local PV on one node. "off" is the same
// cluster with the checks off. Run with
//
//	go test ./coordinator/scheduler -run XXX -bench BenchmarkCycleKubeChecks -benchtime 5x -timeout 30m
func BenchmarkCycleKubeChecks(b *testing.B) {
	for _, on := range []bool{true, false} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			const n = 5000
			pods := scaleBenchPods(n, true, 1)
			var pvs []any
			k := 0
			for _, p := range pods {
				if p.Namespace != "bench" {
					continue
				}
				k++
				if k%10 != 0 || p.Labels[api.LabelPodGroup] != "" {
					continue
				}
				app := fmt.Sprintf("app-%02d", (k/10)%100)
				p.Labels["app"] = app
				p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
					WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
				if p.Spec.NodeName == "" && k%20 == 0 {
					node := scaleNodeName(k % n)
					pv, pvc := localVolume(p.Namespace, "data-"+p.Name, node)
					pvs = append(pvs, pv, pvc)
					p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}}}
				}
			}
			s := newBenchScheduler(b, n, pods, true)
			if on {
				s.deps.Kube = benchChecker(b, s, pvs)
			}
			ctx := b.Context()
			if testing.Verbose() {
				ctx = klog.NewContext(ctx, ktesting.NewLogger(b, ktesting.NewConfig(ktesting.Verbosity(2))))
			}
			forget := func() {
				drainBinds(s)
				s.mu.Lock()
				clear(s.assumed)
				s.mu.Unlock()
				s.plans, s.kubeCarried = nil, nil
				if s.deps.Kube != nil {
					// The bindings never happen: kube-scheduler's cache
					// forgets them too.
					for _, p := range pods {
						if p.Spec.NodeName == "" {
							s.deps.Kube.Forget(klog.Background(), p)
						}
					}
				}
			}
			timeCycles(b, s, ctx, forget)
		})
	}
}

// localVolume is a PV on node and a PVC in namespace bound to it.
func localVolume(namespace, name, node string) (*corev1.PersistentVolume, *corev1.PersistentVolumeClaim) {
	class := "local"
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-" + namespace + "-" + name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName:              class,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/" + name}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: namespace, Name: name},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(namespace + "/" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: pv.Name,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
	return pv, pvc
}

// benchChecker is a kube checker over s's nodes and bound pods (zones
// zone-0..4 by node index) and the volumes objs, as the informers would feed
// it.
func benchChecker(b *testing.B, s *Scheduler, objs []any) *kubecheck.Checker {
	b.Helper()
	client := fake.NewClientset()
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.PersistentVolume:
			if _, err := client.CoreV1().PersistentVolumes().Create(b.Context(), o, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		case *corev1.PersistentVolumeClaim:
			if _, err := client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(b.Context(), o, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	k, err := kubecheck.New(b.Context(), kubecheck.Options{Factory: factory, Client: client})
	if err != nil {
		b.Fatal(err)
	}
	factory.Start(b.Context().Done())
	if !toolscache.WaitForCacheSync(b.Context().Done(), kubecheck.Synced(factory)...) {
		b.Fatal("informers not synced")
	}
	logger := klog.Background()
	nh, ph := k.NodeHandler(logger), k.PodHandler(logger)
	nodes, _ := s.deps.Nodes.List(labels.Everything())
	for i, node := range nodes {
		node.Labels[corev1.LabelTopologyZone] = fmt.Sprintf("zone-%d", i%5)
		node.Labels[corev1.LabelHostname] = node.Name
		nh.OnAdd(node, false)
	}
	pods, _ := s.deps.Pods.List(labels.Everything())
	for _, p := range pods {
		ph.OnAdd(p, false)
	}
	return k
}
