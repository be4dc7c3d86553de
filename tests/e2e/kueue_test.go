package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// kueueWorkloads is Kueue's Workload resource.
var kueueWorkloads = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}

// kueueSetup is Kueue's side: one flavor, a ClusterQueue with two 50 %
// fractions' worth of gpufrac.io/gpu-fraction, a LocalQueue in default;
// and gpufrac's: a Queue whose quota Kueue keeps.
const kueueSetup = `
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: gpus}
spec:
  namespaceSelector: {}
  queueingStrategy: StrictFIFO
  resourceGroups:
  - coveredResources: [cpu, memory, gpufrac.io/gpu-fraction]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: "16"}
      - {name: memory, nominalQuota: 64Gi}
      - {name: gpufrac.io/gpu-fraction, nominalQuota: "100"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team, namespace: default}
spec: {clusterQueue: gpus}
---
apiVersion: gpufrac.io/v1alpha1
kind: Queue
metadata: {name: ml}
spec:
  admission: Kueue
  namespaces: [default]
`

// kueueJob is a Job for LocalQueue team whose one pod at a time asks for
// half a GPU through gpufrac-scheduler, created unsuspended: Kueue's
// webhook suspends it. kwok completes a Job's pod as soon as it runs, so
// the Job asks for many completions: it stays active, holding its quota,
// and each new pod is placed by gpufrac.
func kueueJob(name string) *batchv1.Job {
	tmpl := pod("tmpl", "ml").CPU("100m").Memory("64Mi").Fraction(50).Obj()
	tmpl.Spec.SchedulerName = api.SchedulerName
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"kueue.x-k8s.io/queue-name": "team"}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](1),
			Completions: ptr.To[int32](100000),
			Template:    corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels}, Spec: tmpl.Spec},
		},
	}
}

// jobState is what the test reads of a Job: suspended, its pods, and how
// many of them succeeded (each was placed and ran).
type jobState struct {
	suspended bool
	pods      []corev1.Pod
	succeeded int32
}

// ran tells whether the Job runs: unsuspended, and pods of it placed and run.
func (s jobState) ran() bool { return !s.suspended && s.succeeded > 0 }

// held tells whether Kueue holds the Job back: suspended, with no pods.
func (s jobState) held() bool { return s.suspended && len(s.pods) == 0 }

func kueueJobStates(ctx context.Context, c *cluster.Cluster, names []string) (map[string]jobState, error) {
	out := map[string]jobState{}
	for _, n := range names {
		j, err := c.Client.BatchV1().Jobs("default").Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + n})
		if err != nil {
			return nil, err
		}
		out[n] = jobState{suspended: ptr.Deref(j.Spec.Suspend, false), pods: pods.Items, succeeded: j.Status.Succeeded}
	}
	return out, nil
}

// TestKueueAdmitsGpufracPlaces: Kueue keeps the quota (issue 30). With a
// ClusterQueue holding two 50 % fractions' worth of gpufrac.io/gpu-fraction,
// Kueue admits two of three fraction Jobs; gpufrac places their pods
// (Karpenter buys the node); the third stays suspended with no pods, and no
// NodeClaim or placeholder appears for it. A bare pod in the Kueue queue
// waits (NotAdmittedByKueue) although a GPU has room. When an admitted Job
// is deleted, Kueue admits the third and gpufrac places it.
func TestKueueAdmitsGpufracPlaces(t *testing.T) {
	t.Parallel()
	types := cluster.DefaultInstanceTypes()
	c := startCluster(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: cluster.DefaultNodePools(types)},
		NodeAgents: &cluster.NodeAgentOptions{StopGracePeriod: 5 * time.Second},
		Chart:      cluster.ChartOptions{Set: []string{"coordinator.kueue.enabled=true"}},
		Kueue:      &cluster.KueueOptions{},
	})
	buildBinary(t, "gpufrac-coordinator")
	applyYAML(t, c, []byte(kueueSetup))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	ctx := t.Context()

	names := []string{"job-a", "job-b", "job-c"}
	for _, n := range names {
		if _, err := c.Client.BatchV1().Jobs("default").Create(ctx, kueueJob(n), metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Job %s: %v", n, err)
		}
	}

	// Two admitted and running, one held.
	var held string
	waitFor(t, 4*time.Minute, "two of the three Jobs running, the third suspended with no pods", func(ctx context.Context) (bool, error) {
		states, err := kueueJobStates(ctx, c, names)
		if err != nil {
			return false, nil
		}
		runningJobs, heldJobs := 0, []string{}
		for n, s := range states {
			switch {
			case s.ran():
				runningJobs++
			case s.held():
				heldJobs = append(heldJobs, n)
			}
		}
		if runningJobs == 2 && len(heldJobs) == 1 {
			held = heldJobs[0]
			return true, nil
		}
		return false, nil
	})
	claimsBefore := nodeClaims(t, c)
	t.Logf("Kueue held %s; %d NodeClaims for the two admitted Jobs", held, claimsBefore)

	// A pod of the Kueue queue that no Workload covers.
	create(t, c, pod("bare", "ml").CPU("100m").Memory("64Mi").Fraction(10).Obj())

	// For a while: the held Job stays suspended with no pods, its Workload
	// not admitted; no NodeClaim is added, no placeholder made; the bare pod
	// waits with NotAdmittedByKueue.
	const window = 20 * time.Second
	for deadline := time.Now().Add(window); time.Now().Before(deadline); time.Sleep(time.Second) {
		states, err := kueueJobStates(ctx, c, []string{held})
		if err != nil {
			t.Fatal(err)
		}
		if s := states[held]; !s.held() {
			t.Fatalf("held Job %s: suspended %v with %d pods, want suspended with none", held, s.suspended, len(s.pods))
		}
		if n := nodeClaims(t, c); n > claimsBefore {
			t.Fatalf("%d NodeClaims, %d before: capacity was asked while Kueue held %s", n, claimsBefore, held)
		}
		for _, ph := range systemPods(t, c, api.RolePlaceholder) {
			if strings.Contains(ph.Annotations[placeholder.AnnotationWorkloads], "bare") {
				t.Fatalf("placeholder %s asks capacity for the bare pod", ph.Name)
			}
		}
	}
	bare, err := c.Client.CoreV1().Pods("default").Get(ctx, "bare", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bare.Spec.NodeName != "" || scheduledReason(bare) != api.ReasonNotAdmittedByKueue {
		t.Errorf("bare pod on %q, reason %q: want it pending with %s", bare.Spec.NodeName, scheduledReason(bare), api.ReasonNotAdmittedByKueue)
	}
	ws, err := c.Dynamic.Resource(kueueWorkloads).Namespace("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for _, w := range ws.Items {
		if cluster.ConditionTrue(&w, "Admitted") {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("%d Workloads admitted, want 2 (of %d)", admitted, len(ws.Items))
	}

	// One admitted Job goes: Kueue admits the held one, gpufrac places it.
	gone := names[slices.IndexFunc(names, func(n string) bool { return n != held })]
	if err := c.Client.BatchV1().Jobs("default").Delete(ctx, gone, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, fmt.Sprintf("Job %s admitted and its pods run after %s was deleted", held, gone), func(ctx context.Context) (bool, error) {
		states, err := kueueJobStates(ctx, c, []string{held})
		if err != nil {
			return false, nil
		}
		return states[held].ran(), nil
	})
	// The bare pod still waits.
	bare, err = c.Client.CoreV1().Pods("default").Get(ctx, "bare", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if bare.Spec.NodeName != "" || !strings.Contains(podScheduledMessage(bare), "has no controller") {
		t.Errorf("bare pod on %q (%s): want it pending for having no controller", bare.Spec.NodeName, podScheduledMessage(bare))
	}
}

// podScheduledMessage is the message of a pod's PodScheduled condition.
func podScheduledMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Message
		}
	}
	return ""
}
