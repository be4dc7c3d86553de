package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// workloadGates turns on Kubernetes 1.36's own gangs (KEP-4671): the API
// server serves scheduling.k8s.io/v1alpha2 Workloads and PodGroups and keeps
// pod.spec.schedulingGroup (GenericWorkload), and the Job controller makes a
// Workload and a PodGroup for a gang-shaped Job (WorkloadWithJob).
var workloadGates = map[string][]string{
	"kube-apiserver":          {"--feature-gates=GenericWorkload=true", "--runtime-config=scheduling.k8s.io/v1alpha2=true"},
	"kube-controller-manager": {"--feature-gates=GenericWorkload=true,WorkloadWithJob=true"},
}

// TestPodGroupGangs: with the gates on, an Indexed Job of four 1-GPU pods
// (parallelism = completions) gets its PodGroup from the Job controller and
// the coordinator places its pods as one gang (the gang is named after the
// PodGroup in their pending reasons while members are missing); a PodGroup
// of 8 made by hand that does not fit in the GPUs left binds none of its
// pods.
func TestPodGroupGangs(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{ExtraArgs: workloadGates})
	buildBinary(t, "gpufrac-coordinator")
	addGPUNodes(t, c, "a", "pool-a", 1) // 8 GPUs
	applyYAML(t, c, queuesYAML(map[string]string{"train": "16"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	ctx := t.Context()

	// The Job: its pods ask 1 GPU each through gpufrac-scheduler.
	tmpl := pod("tmpl", "train").GPUs(1).Obj()
	tmpl.Spec.SchedulerName = api.SchedulerName
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "default"},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To[int32](4),
			Completions:    ptr.To[int32](4),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			Template:       corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels}, Spec: tmpl.Spec},
		},
	}
	job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	if _, err := c.Client.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var group string
	waitFor(t, 90*time.Second, "the Job's four pods bound, in the Job controller's PodGroup", func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=trainer"})
		if err != nil || len(pods.Items) != 4 {
			return false, nil
		}
		for _, p := range pods.Items {
			sg := p.Spec.SchedulingGroup
			if sg == nil || sg.PodGroupName == nil {
				return false, fmt.Errorf("pod %s has no spec.schedulingGroup: the Job controller made no PodGroup (WorkloadWithJob)", p.Name)
			}
			group = *sg.PodGroupName
			if p.Spec.NodeName == "" {
				return false, nil
			}
		}
		return true, nil
	})
	pg, err := c.Client.SchedulingV1alpha2().PodGroups("default").Get(ctx, group, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Job's PodGroup %s: %v", group, err)
	}
	if g := pg.Spec.SchedulingPolicy.Gang; g == nil || g.MinCount != 4 {
		t.Fatalf("the Job's PodGroup %s has policy %+v, want a gang of 4", group, pg.Spec.SchedulingPolicy)
	}
	t.Logf("Job trainer: PodGroup %s (gang of %d), its 4 pods bound", group, pg.Spec.SchedulingPolicy.Gang.MinCount)
	podGroupCondition(t, c, group, metav1.ConditionTrue, "Scheduled")

	// A PodGroup of 8 made by hand: its first 7 members wait for the 8th,
	// and once all 8 exist the gang does not fit in the GPUs left (a filler
	// holds 2 of the 8, whether or not the Job's pods completed): none binds.
	create(t, c, pod("filler", "train").GPUs(2).Obj())
	running(t, c, 60*time.Second, "filler")
	big := builders.MakePodGroup("big", "default").Gang(8).Obj()
	if _, err := c.Client.SchedulingV1alpha2().PodGroups("default").Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var members []string
	for i := range 8 {
		members = append(members, fmt.Sprintf("big-%d", i))
	}
	for _, n := range members[:7] {
		create(t, c, pod(n, "train").GPUs(1).SchedulingGroup("big").Obj())
	}
	gangName := "default/" + podrequest.PodGroupGangPrefix + "big"
	waitFor(t, 30*time.Second, "the first 7 members to wait for the 8th", func(ctx context.Context) (bool, error) {
		for _, n := range members[:7] {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil || scheduledReason(p) != api.ReasonGangIncomplete || !strings.Contains(scheduledMessage(p), gangName) {
				return false, nil
			}
		}
		return true, nil
	})
	create(t, c, pod(members[7], "train").GPUs(1).SchedulingGroup("big").Obj())
	waitFor(t, 30*time.Second, "the whole PodGroup to report NoCapacity", func(ctx context.Context) (bool, error) {
		for _, n := range members {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil || scheduledReason(p) != api.ReasonNoCapacity {
				return false, nil
			}
		}
		return true, nil
	})
	for _, n := range members {
		p, _ := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
		if p.Spec.NodeName != "" {
			t.Errorf("%s was bound to %s although its PodGroup cannot fit whole", n, p.Spec.NodeName)
		}
	}
	podGroupCondition(t, c, "big", metav1.ConditionFalse, schedulingv1alpha2.PodGroupReasonUnschedulable)
	checkInvariants(t, c)
}

// podGroupCondition waits until PodGroup name says PodGroupScheduled with
// status and reason, as gpufrac-coordinator writes it.
func podGroupCondition(t *testing.T, c *cluster.Cluster, name string, status metav1.ConditionStatus, reason string) {
	t.Helper()
	var last *metav1.Condition
	waitFor(t, 30*time.Second, fmt.Sprintf("PodGroup %s to say PodGroupScheduled=%s (%s)", name, status, reason), func(ctx context.Context) (bool, error) {
		pg, err := c.Client.SchedulingV1alpha2().PodGroups("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = apimeta.FindStatusCondition(pg.Status.Conditions, schedulingv1alpha2.PodGroupScheduled)
		return last != nil && last.Status == status && last.Reason == reason, nil
	})
	t.Logf("PodGroup %s: PodGroupScheduled=%s %s: %s", name, last.Status, last.Reason, last.Message)
}

// scheduledMessage is the message of p's PodScheduled=False condition.
func scheduledMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}

// TestPodGroupGangAsksKarpenterForTheWholeGroup (issue 30): a PodGroup of
// eight 1-GPU pods on a cluster with no GPU node waits whole while
// placeholders ask Karpenter for capacity for all eight, and binds all
// eight, in one node pool, once the nodes come. No member is bound alone
// meanwhile.
func TestPodGroupGangAsksKarpenterForTheWholeGroup(t *testing.T) {
	t.Parallel()
	types := cluster.DefaultInstanceTypes()
	c := startCluster(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: cluster.DefaultNodePools(types)},
		NodeAgents: &cluster.NodeAgentOptions{StopGracePeriod: 5 * time.Second},
		ExtraArgs:  workloadGates,
	})
	buildBinary(t, "gpufrac-coordinator")
	applyYAML(t, c, queuesYAML(map[string]string{"train": "16"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	ctx := t.Context()
	if _, err := c.Client.SchedulingV1alpha2().PodGroups("default").Create(ctx, builders.MakePodGroup("wide", "default").Gang(8).Obj(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var members []string
	for i := range 8 {
		n := fmt.Sprintf("wide-%d", i)
		members = append(members, n)
		create(t, c, pod(n, "train").GPUs(1).SchedulingGroup("wide").Obj())
	}
	// Capacity was asked for: a placeholder named the gang's workload, or
	// (a placeholder lives about a second, which a loaded machine's poll
	// can miss) a NodeClaim exists; the cluster had no GPU node before.
	asked := false
	waitFor(t, 4*time.Minute, "the PodGroup's 8 pods running", func(ctx context.Context) (bool, error) {
		for _, ph := range systemPods(t, c, api.RolePlaceholder) {
			if strings.Contains(ph.Annotations[placeholder.AnnotationWorkloads], "podgroup/wide") {
				asked = true
			}
		}
		asked = asked || nodeClaims(t, c) > 0
		bound, runningPods := 0, 0
		for _, n := range members {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Spec.NodeName != "" {
				bound++
			}
			if p.Status.Phase == corev1.PodRunning {
				runningPods++
			}
		}
		if bound > 0 && !asked {
			return false, fmt.Errorf("%d members bound before any placeholder asked Karpenter for the group", bound)
		}
		return runningPods == len(members), nil
	})
	pools := map[string]bool{}
	for _, n := range members {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pools[node.Labels["karpenter.sh/nodepool"]] = true
	}
	if len(pools) != 1 || pools[""] {
		t.Errorf("the PodGroup's pods are in node pools %v, want one of Karpenter's", pools)
	}
	t.Logf("PodGroup wide: 8 members bound on %d NodeClaims after placeholders asked for the group", nodeClaims(t, c))
	podGroupCondition(t, c, "wide", metav1.ConditionTrue, "Scheduled")
	checkInvariants(t, c)
}
