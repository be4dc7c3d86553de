// Package attack is the trust-boundary suite of issue 12: on the local test
// bed, with the real gpufrac-node on every GPU node, the real
// gpufrac-coordinator as its ServiceAccount and gpufrac's admission policies
// installed as the Helm chart (deployments/helm/gpufrac) ships them, an ordinary tenant (a
// ServiceAccount token with the bootstrap "edit" role in its own namespace,
// nothing more) tries to take another team's GPU, quota or node, and
// gpufrac-node's own credentials try to write outside their node. Every
// attempt is refused with a message that names the rule (or is made
// harmless), and afterwards the victims' GPUs and queue are as before.
//
// One control plane serves every subtest: they share the victims and check
// them once at the end.
package attack

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/restricted"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// attackerNS is the tenant's namespace; queue team-a lets it in.
	attackerNS = "team-a-ns"
	// victimNS is the other team's namespace; queue team-b lets it in.
	victimNS = "team-b-ns"
	// victimNode holds the victims; attackerNode is the other GPU node.
	victimNode   = "gpu-victim"
	attackerNode = "gpu-other"
	// tenantSA is the attacker's ServiceAccount in attackerNS.
	tenantSA = "tenant"
)

// binDir holds gpufrac-node and gpufrac-coordinator built from the working
// tree by TestMain (empty with -short).
var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		var err error
		if binDir, err = os.MkdirTemp("", "gpufrac-attack-bin-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, cmd := range []string{"gpufrac-node", "gpufrac-coordinator"} {
			build := exec.Command("go", "build", "-o", filepath.Join(binDir, cmd), "github.com/gpufrac/gpufrac/cmd/"+cmd)
			build.Stdout, build.Stderr = os.Stderr, os.Stderr
			if err := build.Run(); err != nil {
				fmt.Fprintln(os.Stderr, "building", cmd+":", err)
				os.Exit(1)
			}
		}
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// bed is the shared test bed: admin, tenant and the victims' state before the attacks.
type bed struct {
	c      *cluster.Cluster
	tenant kubernetes.Interface
	// victims: pod name -> the pod as it ran before the attacks.
	victims map[string]*corev1.Pod
	// victimDevices: pod name -> the devices it held in the kubelet simulator.
	victimDevices map[string][]string
	// victimGPUs are the GPUs the victims (and their reservation) hold.
	victimGPUs []string
	// teamB is queue team-b's status before the attacks.
	teamB v1alpha1.QueueStatus
}

func TestTenantCannotTakeAnotherTeamsGPUQueueOrNode(t *testing.T) {
	if testing.Short() {
		t.Skip("attack suite: needs the local cluster (make tools)")
	}
	t.Parallel()
	b := setUp(t)

	t.Run("protocol annotations on create", func(t *testing.T) {
		for _, tc := range []struct {
			key, value, phrase string
		}{
			{api.AnnotationGPU, b.victimGPUs[0], "is written only by gpufrac-coordinator"},
			{api.AnnotationAdmittedQueue, "team-b", "is written only by gpufrac-coordinator"},
			{api.AnnotationAdmittedPreemptible, "false", "is written only by gpufrac-coordinator"},
			{api.AnnotationAllocatedGPU, b.victimGPUs[0], "is written only by gpufrac-node"},
			{api.AnnotationReservedGPU, b.victimGPUs[0], "is written only by gpufrac-node"},
		} {
			t.Run(tc.key, func(t *testing.T) {
				p := tenantPod("ann-create").Fraction(10).Annotation(tc.key, tc.value).Obj()
				_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
				refused(t, err, "gpufrac-protocol-annotations", "annotation "+tc.key+" "+tc.phrase)
			})
		}
	})

	t.Run("protocol annotations on update", func(t *testing.T) {
		p := create(t, b.tenant, tenantPod("benign").CPU("100m").Obj())
		for _, key := range []string{api.AnnotationGPU, api.AnnotationAdmittedQueue, api.AnnotationAdmittedPreemptible, api.AnnotationAllocatedGPU, api.AnnotationReservedGPU} {
			t.Run(key, func(t *testing.T) {
				_, err := b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), p.Name, types.MergePatchType,
					mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: b.victimGPUs[0]}}}),
					metav1.PatchOptions{})
				refused(t, err, "gpufrac-protocol-annotations", "annotation "+key+" is written only by")
			})
		}
	})

	t.Run("protocol annotations through pods/status", func(t *testing.T) {
		// The status subresource writes a pod's metadata too. Tenants with
		// edit rights cannot write it, but an operator's ServiceAccount in
		// their namespace often may.
		p := create(t, b.tenant, tenantPod("status-writer").CPU("100m").Obj())
		revoke := b.grant(t, attackerNS, "status-writer", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch", "update"}})
		defer revoke()
		waitFor(t, 10*time.Second, "the right to write pods/status", func(ctx context.Context) (bool, error) {
			_, err := b.tenant.CoreV1().Pods(attackerNS).Patch(ctx, p.Name, types.MergePatchType,
				mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{"probe": "1"}}}), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
			return err == nil, nil
		})
		for _, key := range []string{api.AnnotationAdmittedQueue, api.AnnotationAdmittedPreemptible, api.AnnotationGPU, api.AnnotationAllocatedGPU} {
			_, err := b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), p.Name, types.MergePatchType,
				mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: "team-b"}}}), metav1.PatchOptions{}, "status")
			refused(t, err, "gpufrac-protocol-annotations", "annotation "+key+" is written only by")
		}
	})

	t.Run("a bound pod's metadata edited after admission", func(t *testing.T) {
		// gpufrac.io/preemptible "false" added after admission must not
		// protect borrowed capacity, and a pod made unparsable must stay
		// charged: the books read the binding's record.
		p := create(t, b.tenant, tenantPod("edited").GPUs(1).Obj())
		var before v1alpha1.QueueStatus
		waitFor(t, 30*time.Second, "the pod bound and charged to team-a", func(ctx context.Context) (bool, error) {
			got, err := b.c.Client.CoreV1().Pods(attackerNS).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil || got.Spec.NodeName == "" || got.Annotations[api.AnnotationAdmittedPreemptible] != "true" {
				return false, nil
			}
			before, err = queueStatus(ctx, b.c, "team-a")
			gpu := before.Allocated[v1alpha1.ResourceGPU]
			return err == nil && gpu.MilliValue() >= 1000, nil
		})
		for _, v := range []string{"false", "maybe"} {
			if _, err := b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), p.Name, types.MergePatchType,
				mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationPreemptible: v}}}), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			// A pod admitted after the edit shows a cycle has seen it.
			marker := create(t, b.tenant, tenantPod("marker-"+v).CPU("100m").Obj())
			var after v1alpha1.QueueStatus
			waitFor(t, 30*time.Second, "a cycle after the edit", func(ctx context.Context) (bool, error) {
				got, err := b.c.Client.CoreV1().Pods(attackerNS).Get(ctx, marker.Name, metav1.GetOptions{})
				if err != nil || got.Spec.NodeName == "" {
					return false, nil
				}
				after, err = queueStatus(ctx, b.c, "team-a")
				cpu, cpuBefore := after.Allocated[v1alpha1.ResourceCPU], before.Allocated[v1alpha1.ResourceCPU]
				return err == nil && cpu.MilliValue() == cpuBefore.MilliValue()+100, nil
			})
			for what, pair := range map[string][2]string{
				"allocated":                 {gpuOf(before.Allocated), gpuOf(after.Allocated)},
				"allocated non-preemptible": {gpuOf(before.AllocatedNonPreemptible), gpuOf(after.AllocatedNonPreemptible)},
			} {
				if pair[0] != pair[1] {
					t.Errorf("preemptible %q: team-a %s GPU %s, was %s", v, what, pair[1], pair[0])
				}
			}
			before = after
		}
	})

	t.Run("nodeName plus a spoofed GPU", func(t *testing.T) {
		// The report of issue 12: a fraction pinned to the victim's node and
		// GPU, by the default scheduler's nodeName path.
		p := builders.MakePod("squatter", attackerNS).SchedulerName(corev1.DefaultSchedulerName).Fraction(10).
			Annotation(api.AnnotationGPU, b.victimGPUs[0]).Obj()
		p.Spec.NodeName = victimNode
		// It breaks two policies; the API server names one of them.
		_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refusedByOneOf(t, err,
			rule{"gpufrac-protocol-annotations", "annotation gpufrac.io/gpu is written only by gpufrac-coordinator"},
			rule{"gpufrac-scheduling", "set spec.schedulerName: gpufrac-scheduler"})
		// Without the annotation: still the coordinator's to place (two
		// rules of one policy; it says the first).
		p.Annotations = nil
		_, err = b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refused(t, err, "gpufrac-scheduling", "set spec.schedulerName: gpufrac-scheduler")
		p.Spec.SchedulerName = api.SchedulerName
		p.Labels = map[string]string{api.LabelQueue: "team-a"}
		_, err = b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refused(t, err, "gpufrac-scheduling", "spec.nodeName is set by gpufrac-coordinator")
	})

	t.Run("default scheduler plus fraction", func(t *testing.T) {
		p := builders.MakePod("kube-frac", attackerNS).SchedulerName(corev1.DefaultSchedulerName).Fraction(50).Obj()
		_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refused(t, err, "gpufrac-scheduling", "pods asking gpufrac.io/gpu-fraction are placed by gpufrac-coordinator: set spec.schedulerName: gpufrac-scheduler")
		// In an init container too.
		p = builders.MakePod("kube-frac-init", attackerNS).SchedulerName(corev1.DefaultSchedulerName).InitContainer("init").Fraction(50).Obj()
		_, err = b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refused(t, err, "gpufrac-scheduling", "set spec.schedulerName: gpufrac-scheduler")
	})

	t.Run("a queue label without the coordinator", func(t *testing.T) {
		// kube-scheduler would place it and the label used to charge the
		// queue (its own here, so that only this rule applies: another
		// team's queue is the next subtest).
		p := builders.MakePod("label-only", attackerNS).SchedulerName(corev1.DefaultSchedulerName).Queue("team-a").GPUs(1).Obj()
		_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refused(t, err, "gpufrac-scheduling", "pods with label gpufrac.io/queue are scheduled by gpufrac-coordinator")
	})

	t.Run("another team's queue", func(t *testing.T) {
		p := tenantPod("borrower").Queue("team-b").GPUs(1).Obj()
		_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refused(t, err, "gpufrac-queue-namespaces", "queue team-b does not take pods from namespace team-a-ns: set label gpufrac.io/queue to a queue whose spec.namespaces lists team-a-ns")
		// Relabelling a pod of its own queue.
		own := create(t, b.tenant, tenantPod("relabel").CPU("100m").Obj())
		_, err = b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), own.Name, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{api.LabelQueue: "team-b"}}}), metav1.PatchOptions{})
		refused(t, err, "gpufrac-queue-namespaces", "queue team-b does not take pods from namespace team-a-ns")
		// Through a workload: the ReplicaSet controller's pods are refused
		// alike, and the ReplicaSet says why.
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "borrowers", Namespace: attackerNS},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "borrowers"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "borrowers", api.LabelQueue: "team-b"}},
					Spec:       tenantPod("x").GPUs(1).Obj().Spec,
				},
			},
		}
		if _, err := b.tenant.AppsV1().Deployments(attackerNS).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var msg string
		waitFor(t, 30*time.Second, "the ReplicaSet to report its refused pod", func(ctx context.Context) (bool, error) {
			rss, err := b.c.Client.AppsV1().ReplicaSets(attackerNS).List(ctx, metav1.ListOptions{LabelSelector: "app=borrowers"})
			if err != nil || len(rss.Items) == 0 {
				return false, nil
			}
			for _, cond := range rss.Items[0].Status.Conditions {
				if cond.Type == appsv1.ReplicaSetReplicaFailure {
					msg = cond.Message
					return true, nil
				}
			}
			return false, nil
		})
		if !strings.Contains(msg, "gpufrac-queue-namespaces") || !strings.Contains(msg, "queue team-b does not take pods from namespace team-a-ns") {
			t.Errorf("ReplicaSet failure %q does not name the rule", msg)
		}
		t.Logf("ReplicaSet says: %s", msg)
		if l, _ := b.c.Client.CoreV1().Pods(attackerNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=borrowers"}); len(l.Items) != 0 {
			t.Errorf("the Deployment made %d pods", len(l.Items))
		}
	})

	t.Run("a namespace's default queue", func(t *testing.T) {
		// The namespace's admin names team-a: label-less pods of the
		// coordinator there are admitted to team-a.
		b.labelNamespace(t, attackerNS, "team-a")
		p := create(t, b.tenant, builders.MakePod("defaulted", attackerNS).CPU("100m").Obj())
		waitFor(t, 30*time.Second, "the label-less pod bound and charged to team-a", func(ctx context.Context) (bool, error) {
			got, err := b.c.Client.CoreV1().Pods(attackerNS).Get(ctx, p.Name, metav1.GetOptions{})
			return err == nil && got.Spec.NodeName != "" && got.Annotations[api.AnnotationAdmittedQueue] == "team-a", nil
		})
		// A default queue that does not take the namespace refuses them at
		// admission (the API server sees the label a moment later: poll).
		b.labelNamespace(t, attackerNS, "team-b")
		var err error
		waitFor(t, 10*time.Second, "the default queue team-b to be read", func(ctx context.Context) (bool, error) {
			_, err = b.tenant.CoreV1().Pods(attackerNS).Create(ctx, builders.MakePod("defaulted-b", attackerNS).CPU("100m").Obj(),
				metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err != nil, nil
		})
		refused(t, err, "gpufrac-queue-namespaces", "queue team-b does not take pods from namespace team-a-ns")
		b.labelNamespace(t, attackerNS, "")
	})

	t.Run("NVIDIA_VISIBLE_DEVICES", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			pod  *corev1.Pod
		}{
			{"env", tenantPod("env").Env(api.EnvVisibleDevices, "all").Obj()},
			{"init container", tenantPod("init-env").InitContainer("setup").Env(api.EnvVisibleDevices, "all").Obj()},
			{"no GPU asked", builders.MakePod("plain-env", attackerNS).SchedulerName(corev1.DefaultSchedulerName).Env(api.EnvVisibleDevices, "0").Obj()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), tc.pod, metav1.CreateOptions{})
				refused(t, err, "gpufrac-visible-devices", "sets NVIDIA_VISIBLE_DEVICES: remove it")
			})
		}
		t.Run("ephemeral container", func(t *testing.T) {
			// kubectl debug's request: a patch of the ephemeralcontainers subresource.
			p := create(t, b.tenant, tenantPod("debuggee").CPU("100m").Obj())
			_, err := b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), p.Name, types.StrategicMergePatchType,
				mergePatch(map[string]any{"spec": map[string]any{"ephemeralContainers": []any{map[string]any{
					"name": "debug", "image": builders.DefaultImage, "env": []any{map[string]any{"name": api.EnvVisibleDevices, "value": "all"}},
				}}}}), metav1.PatchOptions{}, "ephemeralcontainers")
			refused(t, err, "gpufrac-visible-devices", "container debug sets NVIDIA_VISIBLE_DEVICES: remove it")
		})
	})

	t.Run("a pod dressed as a reservation", func(t *testing.T) {
		disguise := func(name string) *corev1.Pod {
			p := builders.MakePod(name, api.ReservationNamespace).SchedulerName(corev1.DefaultSchedulerName).GPUs(1).
				Label(api.LabelRole, api.RoleReservation).Label(api.LabelReservedNode, victimNode).Obj()
			p.Spec.NodeName = victimNode
			restricted.Apply(&p.Spec)
			return p
		}
		// In the reservation namespace, with the tenant's own rights: RBAC.
		_, err := b.tenant.CoreV1().Pods(api.ReservationNamespace).Create(t.Context(), disguise(api.ReservationNamePrefix+"fake"), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || cluster.RefusedBy(err, "gpufrac-reservation-namespace") {
			t.Errorf("tenant create in %s: %v, want RBAC's Forbidden", api.ReservationNamespace, err)
		}
		// With rights an admin granted there by mistake: the policy.
		grant := b.grantEdit(t, api.ReservationNamespace)
		_, err = b.tenant.CoreV1().Pods(api.ReservationNamespace).Create(t.Context(), disguise(api.ReservationNamePrefix+"fake"), metav1.CreateOptions{})
		refused(t, err, "gpufrac-reservation-namespace", "only gpufrac-coordinator creates pods in gpufrac-reservations")
		grant()
		// The coordinator's own credentials cannot make it run anything else.
		coord, err := b.c.ServiceAccountConfig(t.Context(), api.ComponentNamespace, api.CoordinatorServiceAccount, nil)
		if err != nil {
			t.Fatal(err)
		}
		cc := kubernetes.NewForConfigOrDie(coord)
		shell := disguise(api.ReservationNamePrefix + "shell")
		shell.Spec.Containers[0].Image = "docker.io/library/busybox:1.36"
		shell.Spec.Containers[0].Command = []string{"sh", "-c", "sleep 1d"}
		_, err = cc.CoreV1().Pods(api.ReservationNamespace).Create(t.Context(), shell, metav1.CreateOptions{})
		refused(t, err, "gpufrac-reservation-namespace", "reservation and placeholder pods run one registry.k8s.io/pause:3.10 container")
		hostile := disguise(api.ReservationNamePrefix + "hostile")
		hostile.Spec.Volumes = []corev1.Volume{{Name: "x", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		_, err = cc.CoreV1().Pods(api.ReservationNamespace).Create(t.Context(), hostile, metav1.CreateOptions{})
		refused(t, err, "gpufrac-reservation-namespace", "reservation and placeholder pods have no volumes")

		// In the tenant's own namespace it is an ordinary whole-GPU pod: the
		// node agent does not take it for a reservation (that needs the
		// reservation namespace) and it gets a free GPU, not the victims'.
		own := disguise(api.ReservationNamePrefix + "own")
		own.Namespace = attackerNS
		own.Spec.NodeName = victimNode
		// (A tenant may not make it: whole GPUs of kube-scheduler in a queue's
		// namespace are refused. The admin's is the same pod.)
		_, err = b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), own, metav1.CreateOptions{})
		refused(t, err, "gpufrac-tenant-gpu-scheduler", "asks GPUs")
		own = create(t, b.c.Client, own)
		waitFor(t, 60*time.Second, "the disguised pod to run", func(ctx context.Context) (bool, error) {
			p, err := b.c.Client.CoreV1().Pods(attackerNS).Get(ctx, own.Name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning, nil
		})
		for _, d := range b.devicesOf(t, attackerNS, own.Name) {
			if slices.Contains(b.victimGPUs, strings.SplitN(d, "::", 2)[0]) {
				t.Errorf("the disguised pod got the victims' GPU %s", d)
			}
		}
		if p, _ := b.c.Client.CoreV1().Pods(attackerNS).Get(t.Context(), own.Name, metav1.GetOptions{}); p.Annotations[api.AnnotationReservedGPU] != "" {
			t.Errorf("the node agent treated the disguised pod as a reservation: %v", p.Annotations)
		}
	})

	t.Run("reserved priority classes", func(t *testing.T) {
		for _, pc := range []string{"gpufrac-reservation", "gpufrac-placeholder"} {
			p := tenantPod("vip").CPU("100m").Obj()
			p.Spec.PriorityClassName = pc
			_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
			refused(t, err, "gpufrac-scheduling", "priority class "+pc+" is reserved for gpufrac-coordinator's own pods")
		}
	})

	t.Run("the placeholders' scheduler name", func(t *testing.T) {
		// No scheduler serves it and only gpufrac-coordinator marks its
		// pods Unschedulable: a tenant's pod naming it would sit pending
		// forever without a word. Refused, saying why.
		p := builders.MakePod("ghost", attackerNS).CPU("100m").Obj()
		p.Spec.SchedulerName = placeholder.SchedulerName
		_, err := b.tenant.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{})
		refused(t, err, "gpufrac-scheduling", "spec.schedulerName gpufrac-placeholder is served by no scheduler")
	})

	t.Run("what edit rights do not reach", func(t *testing.T) {
		// Queues, bindings and other namespaces are beyond a tenant's RBAC.
		q, err := b.c.Dynamic.Resource(v1alpha1.QueueGVR()).Get(t.Context(), "team-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.tenantDynamicUpdateQueue(t, q.GetName()); !apierrors.IsForbidden(err) {
			t.Errorf("tenant patching Queue team-a: %v, want Forbidden", err)
		}
		p := create(t, b.tenant, tenantPod("self-bound").CPU("100m").Obj())
		err = b.tenant.CoreV1().Pods(attackerNS).Bind(t.Context(), &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: attackerNS, Annotations: map[string]string{api.AnnotationGPU: b.victimGPUs[0]}},
			Target:     corev1.ObjectReference{Kind: "Node", Name: victimNode},
		}, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("tenant binding its own pod: %v, want Forbidden", err)
		}
		_, err = b.tenant.CoreV1().Pods(victimNS).Create(t.Context(), builders.MakePod("intruder", victimNS).Queue("team-b").GPUs(1).Obj(), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("tenant creating a pod in %s: %v, want Forbidden", victimNS, err)
		}
		// A claim's allocation (which GPU, how much of it) is written only by
		// a scheduler: edit may create claims, not write their status.
		claim, err := b.tenant.ResourceV1().ResourceClaims(attackerNS).Create(t.Context(), &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "self-allocated", Namespace: attackerNS},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: api.DRAClassGPU},
			}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("tenant creating a claim: %v", err)
		}
		claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: api.DRADriver, Pool: victimNode, Device: "gpu-0",
		}}}}
		if _, err := b.tenant.ResourceV1().ResourceClaims(attackerNS).UpdateStatus(t.Context(), claim, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("tenant writing its claim's allocation: %v, want Forbidden", err)
		}
	})

	t.Run("gpufrac-node's credentials off their node", func(t *testing.T) {
		// The agent of the other node, with its own kubeconfig (a token bound
		// to its pod on that node).
		agent := b.c.NodeAgent(attackerNode)
		if agent == nil {
			t.Fatalf("no node agent on %s", attackerNode)
		}
		cfg, err := b.c.ServiceAccountConfig(t.Context(), api.ComponentNamespace, api.NodeServiceAccount, agent.Pod)
		if err != nil {
			t.Fatal(err)
		}
		node := kubernetes.NewForConfigOrDie(cfg)
		victim := b.victims["victim-frac"]
		_, err = node.CoreV1().Pods(victimNS).Patch(t.Context(), victim.Name, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationAllocatedGPU: "GPU-elsewhere"}}}), metav1.PatchOptions{})
		refused(t, err, "gpufrac-node-agent", fmt.Sprintf("gpufrac-node on node %s may write only pods bound to %s; pod %s/%s is bound to \"%s\"", attackerNode, attackerNode, victimNS, victim.Name, victimNode))
		_, err = node.CoreV1().Nodes().Patch(t.Context(), victimNode, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationGPUInventory: "[]"}}}), metav1.PatchOptions{})
		refused(t, err, "gpufrac-node-agent", fmt.Sprintf("gpufrac-node on node %s may write only its own Node, not %s", attackerNode, victimNode))
		// On its own node, only what it owns.
		_, err = node.CoreV1().Nodes().Patch(t.Context(), attackerNode, types.MergePatchType,
			mergePatch(map[string]any{"spec": map[string]any{"unschedulable": true}}), metav1.PatchOptions{})
		refused(t, err, "gpufrac-node-agent", "gpufrac-node may change only gpufrac.io/ labels and annotations of its Node")
		mine := create(t, b.c.Client, builders.MakePod("on-other-node", attackerNS).SchedulerName(corev1.DefaultSchedulerName).CPU("100m").Obj(), onNode(attackerNode))
		_, err = node.CoreV1().Pods(attackerNS).Patch(t.Context(), mine.Name, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{"app": "hijacked"}}}), metav1.PatchOptions{})
		refused(t, err, "gpufrac-node-agent", "gpufrac-node may change only the annotations gpufrac.io/allocated-gpu and gpufrac.io/reserved-gpu of a pod")
		// Nor the rest of its metadata: a finalizer would keep the pod from
		// ever being deleted, an owner that does not exist would have the
		// garbage collector delete it.
		for what, meta := range map[string]map[string]any{
			"a finalizer": {"finalizers": []string{"example.com/hold"}},
			"an owner":    {"ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}}},
		} {
			_, err = node.CoreV1().Pods(attackerNS).Patch(t.Context(), mine.Name, types.MergePatchType, mergePatch(map[string]any{"metadata": meta}), metav1.PatchOptions{})
			if err == nil {
				t.Errorf("gpufrac-node set %s on a pod of its node", what)
			} else {
				refused(t, err, "gpufrac-node-agent", "gpufrac-node may change only the annotations")
			}
		}
		// As DRA driver: only its own node's slices, only its own driver.
		slice := func(node, driver string) *resourceapi.ResourceSlice {
			return &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "attack-"},
				Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node,
					Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
					Devices: []resourceapi.Device{{Name: "gpu-0"}}},
			}
		}
		// Its own node, but the victim's pool: the coordinator reads an
		// allocation's node (and the GPUs it charges) from the pool.
		disguised := slice(attackerNode, api.DRADriver)
		disguised.Spec.Pool.Name = victimNode
		_, err = node.ResourceV1().ResourceSlices().Create(t.Context(), disguised, metav1.CreateOptions{})
		refused(t, err, "gpufrac-node-resourceslices", fmt.Sprintf("gpufrac-node on node %s may publish only the pool named after its node, not \"%s\"", attackerNode, victimNode))
		_, err = node.ResourceV1().ResourceSlices().Create(t.Context(), slice(victimNode, api.DRADriver), metav1.CreateOptions{})
		refused(t, err, "gpufrac-node-resourceslices", fmt.Sprintf("gpufrac-node on node %s may write only ResourceSlices of its own node, not of \"%s\"", attackerNode, victimNode))
		_, err = node.ResourceV1().ResourceSlices().Create(t.Context(), slice(attackerNode, "gpu.nvidia.com"), metav1.CreateOptions{})
		refused(t, err, "gpufrac-node-resourceslices", "gpufrac-node may write only ResourceSlices of its driver gpu.gpufrac.io, not of \"gpu.nvidia.com\"")
		// A token of its ServiceAccount bound to no pod names no node.
		unbound, err := b.c.ServiceAccountConfig(t.Context(), api.ComponentNamespace, api.NodeServiceAccount, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kubernetes.NewForConfigOrDie(unbound).CoreV1().Nodes().Patch(t.Context(), attackerNode, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationGPUInventory: "[]"}}}), metav1.PatchOptions{})
		refused(t, err, "gpufrac-node-agent", "gpufrac-node's credentials carry no node name")
		// And it creates nothing.
		_, err = node.CoreV1().Pods(attackerNS).Create(t.Context(), tenantPod("by-node").Obj(), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("gpufrac-node creating a pod: %v, want Forbidden", err)
		}
	})

	t.Run("a claim dressed as the pod's extended-resource claim", b.attackForgedExtendedClaim)
	t.Run("priority classes above gpufrac's", b.attackPriority)
	t.Run("GPUs through another scheduler", b.attackDefaultSchedulerGPU)
	t.Run("host access to every GPU", b.attackHostAccess)
	t.Run("the admin's opt-out of the tenant rules", b.attackAdminOptOut)
	t.Run("pods a workload controller creates", b.attackThroughWorkloadControllers)
	t.Run("the holes the review found", b.attackReviewedHoles)

	// Last: the victims' GPUs and queue are as they were.
	b.checkVictimsUnchanged(t)
}

// setUp starts the test bed, the coordinator, the victims and the tenant.
func setUp(t *testing.T) *bed {
	t.Helper()
	c := cluster.StartForTest(t, cluster.Options{
		NodeAgents: &cluster.NodeAgentOptions{Binary: filepath.Join(binDir, "gpufrac-node"), Config: draConfig},
		// Controllers under their own ServiceAccounts, as kubeadm and managed
		// clusters run them: the pods a tenant's workloads create are then
		// not a superuser's, and the tenant policies hold them too.
		ExtraArgs: map[string][]string{"kube-controller-manager": {"--use-service-account-credentials=true"}},
	})
	ctx := t.Context()
	b := &bed{c: c, victims: map[string]*corev1.Pod{}, victimDevices: map[string][]string{}}
	for _, ns := range []string{attackerNS, victimNS} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []*v1alpha1.Queue{
		builders.MakeQueue("team-a").GPUQuota("4").Namespaces(attackerNS).Obj(),
		builders.MakeQueue("team-b").GPUQuota("4").Namespaces(victimNS).Obj(),
	} {
		u, err := v1alpha1.ToUnstructured(q)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Dynamic.Resource(v1alpha1.QueueGVR()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{victimNode, attackerNode} {
		if _, err := c.AddNode(ctx, cluster.NodeSpec{Name: name, Labels: map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{victimNode, attackerNode} {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := c.WaitForNodeAgent(wctx, name)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, name+" GPUs published", func(ctx context.Context) (bool, error) {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			q := n.Status.Allocatable[api.ResourceFraction]
			return err == nil && n.Annotations[api.AnnotationGPUInventory] != "" && q.Value() == 800, nil
		})
	}
	addDRANode(t, c)
	startCoordinator(t, c)

	// The victims: team-b's whole GPU and fraction on victimNode.
	for _, p := range []*corev1.Pod{
		builders.MakePod("victim-whole", victimNS).Queue("team-b").GPUs(1).CPU("100m").Obj(),
		builders.MakePod("victim-frac", victimNS).Queue("team-b").Fraction(50).CPU("100m").Obj(),
	} {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: victimNode}
		create(t, c.Client, p)
	}
	waitFor(t, 90*time.Second, "the victims Running with their GPUs written back", func(ctx context.Context) (bool, error) {
		for _, name := range []string{"victim-whole", "victim-frac"} {
			p, err := c.Client.CoreV1().Pods(victimNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning || p.Annotations[api.AnnotationAllocatedGPU] == "" {
				return false, nil
			}
			b.victims[name] = p
		}
		return true, nil
	})
	for name, p := range b.victims {
		b.victimDevices[name] = b.devicesOf(t, victimNS, name)
		if len(b.victimDevices[name]) == 0 {
			t.Fatalf("victim %s holds no devices in the kubelet simulator", name)
		}
		for _, g := range strings.Split(p.Annotations[api.AnnotationAllocatedGPU], ",") {
			if !slices.Contains(b.victimGPUs, g) {
				b.victimGPUs = append(b.victimGPUs, g)
			}
		}
	}
	waitFor(t, 30*time.Second, "team-b's usage in its status", func(ctx context.Context) (bool, error) {
		st, err := queueStatus(ctx, c, "team-b")
		if err != nil {
			return false, nil
		}
		b.teamB = st
		got := st.Allocated[v1alpha1.ResourceGPU]
		return got.MilliValue() == 1500, nil
	})

	// The tenant: a ServiceAccount with the bootstrap "edit" role in its
	// namespace, and a debug role for ephemeral containers (kubectl debug).
	if _, err := c.Client.CoreV1().ServiceAccounts(attackerNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: tenantSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b.grantEdit(t, attackerNS)
	if _, err := c.Client.RbacV1().Roles(attackerNS).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "debug"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/ephemeralcontainers"}, Verbs: []string{"update", "patch"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().RoleBindings(attackerNS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-debug"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "debug"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: tenantSA, Namespace: attackerNS}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.ServiceAccountConfig(ctx, attackerNS, tenantSA, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.tenant = kubernetes.NewForConfigOrDie(cfg)
	// An ordinary tenant: not admin, no rights outside its namespace.
	review, err := b.tenant.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := review.Status.UserInfo.Username, "system:serviceaccount:"+attackerNS+":"+tenantSA; got != want || slices.Contains(review.Status.UserInfo.Groups, "system:masters") {
		t.Fatalf("the tenant authenticates as %q in %v, want %s and no admin group", got, review.Status.UserInfo.Groups, want)
	}
	return b
}

// grantEdit binds the bootstrap ClusterRole "edit" to the tenant in ns and
// returns a function that removes the binding again.
func (b *bed) grantEdit(t *testing.T, ns string) func() {
	t.Helper()
	name := "tenant-edit"
	if _, err := b.c.Client.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: tenantSA, Namespace: attackerNS}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC reads bindings through an informer: wait until it applies.
	waitFor(t, 10*time.Second, "edit rights in "+ns, func(ctx context.Context) (bool, error) {
		cfg, err := b.c.ServiceAccountConfig(ctx, attackerNS, tenantSA, nil)
		if err != nil {
			return false, err
		}
		_, err = kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	return func() {
		if err := b.c.Client.RbacV1().RoleBindings(ns).Delete(context.WithoutCancel(t.Context()), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("removing the tenant's edit rights in %s: %v", ns, err)
		}
	}
}

// grant gives the tenant one more rule in ns (a Role and its binding,
// both named name) and returns a function that takes it away again.
func (b *bed) grant(t *testing.T, ns, name string, rule rbacv1.PolicyRule) func() {
	t.Helper()
	if _, err := b.c.Client.RbacV1().Roles(ns).Create(t.Context(), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{rule},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.Client.RbacV1().RoleBindings(ns).Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: tenantSA, Namespace: attackerNS}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return func() {
		ctx := context.WithoutCancel(t.Context())
		if err := b.c.Client.RbacV1().RoleBindings(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("removing the tenant's rule %s in %s: %v", name, ns, err)
		}
		if err := b.c.Client.RbacV1().Roles(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("removing the role %s in %s: %v", name, ns, err)
		}
	}
}

// gpuOf is a resource list's GPU quantity as text ("0" when absent).
func gpuOf(l corev1.ResourceList) string {
	q := l[v1alpha1.ResourceGPU]
	return q.String()
}

// labelNamespace sets (or, with "", removes) a namespace's default queue, as its admin.
func (b *bed) labelNamespace(t *testing.T, ns, queue string) {
	t.Helper()
	var v any = queue
	if queue == "" {
		v = nil
	}
	if _, err := b.c.Client.CoreV1().Namespaces().Patch(t.Context(), ns, types.MergePatchType,
		mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]any{api.LabelDefaultQueue: v}}}), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// tenantDynamicUpdateQueue tries to raise a queue's quota with the tenant's token.
func (b *bed) tenantDynamicUpdateQueue(t *testing.T, name string) (any, error) {
	t.Helper()
	cfg, err := b.c.ServiceAccountConfig(t.Context(), attackerNS, tenantSA, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := kubernetes.NewForConfigOrDie(cfg).CoreV1().RESTClient()
	return raw.Patch(types.MergePatchType).AbsPath("/apis", v1alpha1.Group, v1alpha1.Version, v1alpha1.QueueResource, name).
		Body(mergePatch(map[string]any{"spec": map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "100"}}}})).
		DoRaw(t.Context())
}

// devicesOf lists the device IDs a pod holds in its node's kubelet simulator.
func (b *bed) devicesOf(t *testing.T, ns, pod string) []string {
	t.Helper()
	var out []string
	for _, a := range b.c.NodeAgents() {
		for _, al := range a.Kubelet.Allocations() {
			if al.Pod.Namespace == ns && al.Pod.Name == pod {
				out = append(out, al.DeviceIDs...)
			}
		}
	}
	slices.Sort(out)
	return out
}

// checkVictimsUnchanged asserts the victims run where they ran, on the GPUs
// they had, that nobody else holds any of those GPUs but them and their
// reservation, and that queue team-b's usage is what it was.
func (b *bed) checkVictimsUnchanged(t *testing.T) {
	t.Helper()
	for name, before := range b.victims {
		p, err := b.c.Client.CoreV1().Pods(victimNS).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("victim %s: %v", name, err)
			continue
		}
		if p.UID != before.UID || p.Spec.NodeName != before.Spec.NodeName || p.Status.Phase != corev1.PodRunning ||
			p.Annotations[api.AnnotationAllocatedGPU] != before.Annotations[api.AnnotationAllocatedGPU] ||
			p.Annotations[api.AnnotationGPU] != before.Annotations[api.AnnotationGPU] {
			t.Errorf("victim %s changed: node %s -> %s, phase %s, annotations %v -> %v", name, before.Spec.NodeName, p.Spec.NodeName,
				p.Status.Phase, before.Annotations, p.Annotations)
		}
		if got := b.devicesOf(t, victimNS, name); !slices.Equal(got, b.victimDevices[name]) {
			t.Errorf("victim %s holds %v, held %v", name, got, b.victimDevices[name])
		}
	}
	for _, a := range b.c.NodeAgents() {
		for _, al := range a.Kubelet.Allocations() {
			if al.Pod.Namespace == victimNS || al.Pod.Namespace == api.ReservationNamespace {
				continue
			}
			for _, d := range al.DeviceIDs {
				if slices.Contains(b.victimGPUs, strings.SplitN(d, "::", 2)[0]) {
					t.Errorf("%s/%s holds %s on a victim's GPU", al.Pod.Namespace, al.Pod.Name, d)
				}
			}
		}
	}
	st, err := queueStatus(t.Context(), b.c, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	before, after := b.teamB.Allocated[v1alpha1.ResourceGPU], st.Allocated[v1alpha1.ResourceGPU]
	if before.Cmp(after) != 0 {
		t.Errorf("queue team-b allocated %s GPUs, had %s", after.String(), before.String())
	}
	beforeNP, afterNP := b.teamB.AllocatedNonPreemptible[v1alpha1.ResourceGPU], st.AllocatedNonPreemptible[v1alpha1.ResourceGPU]
	if beforeNP.Cmp(afterNP) != 0 {
		t.Errorf("queue team-b non-preemptible %s GPUs, had %s", afterNP.String(), beforeNP.String())
	}
}

// tenantPod is a pod of the tenant for the coordinator, in its own queue.
func tenantPod(name string) *builders.PodWrapper {
	return builders.MakePod(name, attackerNS).Queue("team-a")
}

// onNode sets a pod's nodeName (as admin: a pod kube-scheduler would place there).
func onNode(node string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.NodeName = node }
}

// create creates a pod and returns it as created.
func create(t *testing.T, client kubernetes.Interface, p *corev1.Pod, opts ...func(*corev1.Pod)) *corev1.Pod {
	t.Helper()
	for _, o := range opts {
		o(p)
	}
	out, err := client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return out
}

// rule is an admission policy and a phrase of its message.
type rule struct{ policy, phrase string }

// refused asserts err is the named admission policy refusing the request
// with a message containing phrase, and logs the message the tenant sees.
func refused(t *testing.T, err error, policy, phrase string) {
	t.Helper()
	refusedByOneOf(t, err, rule{policy, phrase})
}

// refusedByOneOf asserts err is one of the rules refusing the request: a
// request that breaks several policies is refused by one of them, and the
// API server does not say which it evaluates first.
func refusedByOneOf(t *testing.T, err error, rules ...rule) {
	t.Helper()
	if err == nil {
		t.Errorf("accepted; want refused by %v", rules)
		return
	}
	for _, r := range rules {
		if cluster.RefusedBy(err, r.policy) && strings.Contains(err.Error(), r.phrase) {
			t.Logf("refused: %v", err)
			return
		}
	}
	t.Errorf("refused with %q; want one of %v", err, rules)
}

func mergePatch(v map[string]any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// queueStatus reads a queue's status.
func queueStatus(ctx context.Context, c *cluster.Cluster, name string) (v1alpha1.QueueStatus, error) {
	u, err := c.Dynamic.Resource(v1alpha1.QueueGVR()).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return v1alpha1.QueueStatus{}, err
	}
	q, err := v1alpha1.FromUnstructured(u)
	if err != nil {
		return v1alpha1.QueueStatus{}, err
	}
	return q.Status, nil
}

// waitFor polls cond every 100ms until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, limit, true, cond); err != nil {
		t.Fatalf("waiting %s for %s: %v", limit, what, err)
	}
}

// startCoordinator runs gpufrac-coordinator as its ServiceAccount until the test ends.
func startCoordinator(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	kubeconfig, err := c.ServiceAccountKubeconfig(t.Context(), api.ComponentNamespace, api.CoordinatorServiceAccount, nil)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(c.LogDir(), "gpufrac-coordinator.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "gpufrac-coordinator"), "--kubeconfig="+kubeconfig, "--metrics-addr=",
		"--leader-elect=false", "-v=2")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		f.Close()
	})
}
