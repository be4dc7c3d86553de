package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// demoLabel (value demoLabelValue) marks every example object and pod.
	demoLabel      = "app.kubernetes.io/part-of"
	demoLabelValue = "gpufrac-demo"
	// labelKarpenterNodePool is the label Karpenter puts on the nodes it makes.
	labelKarpenterNodePool = "karpenter.sh/nodepool"
	// reportEvery paces the "still waiting" lines.
	reportEvery = 5 * time.Second
	// burstDeployment is burst.yaml's Deployment.
	burstDeployment = "batch-embed"
)

// phase is a step of the demo: example files submitted together, then waited
// for until their pods settle.
type phase struct {
	what  string
	files []string
}

// phases are the steps of the demo, in order. The burst needs Karpenter.
func phases(karpenter bool) []phase {
	ps := []phase{
		{what: "queues", files: []string{"queues.yaml"}},
		{what: "whole GPUs, a gang and fractions", files: []string{"whole-gpu.yaml", "gang.yaml", "fractions.yaml"}},
		{what: "requests the coordinator must not place", files: []string{"over-quota.yaml", "fraction-too-big.yaml"}},
		{what: "GPU shares through DRA claims on the node group in mode dra", files: []string{"claims.yaml"}},
	}
	if karpenter {
		ps = append(ps, phase{what: "a burst of fractions beyond the static nodes", files: []string{"burst.yaml"}})
	}
	return ps
}

// submitExamples creates the example objects phase by phase and waits after
// each until its pods settle (see unsettled).
func submitExamples(ctx context.Context, cfg config, client kubernetes.Interface, dyn dynamic.Interface) error {
	a := cluster.NewApplier(client, dyn)
	n := newNarrator(client)
	wantPods := 0
	for _, ph := range phases(cfg.karpenter) {
		fmt.Printf("    -- %s\n", ph.what)
		began := time.Now()
		var queues []string
		for _, file := range ph.files {
			path := filepath.Join(cfg.root, "deployments", "examples", file)
			objs, err := cluster.ReadObjects(path)
			if err != nil {
				return err
			}
			names, err := a.ApplyFile(ctx, path)
			if err != nil {
				return err
			}
			for _, obj := range objs {
				wantPods += podsOf(obj)
				if obj.GetKind() == "Queue" {
					queues = append(queues, obj.GetName())
				}
			}
			fmt.Printf("    %s: %s\n", file, strings.Join(names, ", "))
		}
		if len(queues) > 0 {
			if err := waitQueuesSeen(ctx, dyn, queues); err != nil {
				return err
			}
			fmt.Printf("    gpufrac-coordinator publishes their status (kubectl get queues) after %s\n", time.Since(began).Round(100*time.Millisecond))
			continue
		}
		if err := n.waitSettled(ctx, wantPods, began); err != nil {
			return err
		}
	}
	return nil
}

// podsOf is how many pods an example object makes.
func podsOf(obj *unstructured.Unstructured) int {
	switch obj.GetKind() {
	case "Pod":
		return 1
	case "Deployment", "ReplicaSet", "StatefulSet":
		// Decoded YAML holds numbers as int64 or float64.
		v, found, _ := unstructured.NestedFieldNoCopy(obj.Object, "spec", "replicas")
		if !found {
			return 1
		}
		switch n := v.(type) {
		case int64:
			return int(n)
		case float64:
			return int(n)
		}
		return 1
	}
	return 0
}

// waitQueuesSeen waits until gpufrac-coordinator has written each queue's
// status: it knows the queues, so pods naming them are not refused as
// naming an unknown queue.
func waitQueuesSeen(ctx context.Context, dyn dynamic.Interface, names []string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			q, err := dyn.Resource(queueGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if _, found, _ := unstructured.NestedMap(q.Object, "status", "allocated"); !found {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for gpufrac-coordinator to publish the status of queues %v (is it running? see logs/gpufrac-coordinator.log): %w", names, err)
	}
	return nil
}

// refusedReasons are the coordinator's reasons for a pod it will not place
// as things stand: the pod is settled, waiting for a user or for quota.
var refusedReasons = []string{api.ReasonOverQuota, api.ReasonOverLimit, api.ReasonInvalidRequest}

// unsettled says why a demo pod is not settled yet, or "" when it is:
// Running with its GPUs written back by gpufrac-node, ended, or refused by the
// coordinator with a reason that holds until something changes.
func unsettled(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "terminating"
	}
	switch p.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return ""
	case corev1.PodRunning:
		// GPUs held through claims (nodes in mode dra) are not written back.
		if gpuPod(p) && p.Annotations[api.AnnotationAllocatedGPU] == "" && p.Status.ExtendedResourceClaimStatus == nil {
			return "GPU not written back yet"
		}
		return ""
	}
	if p.Spec.NodeName != "" {
		return "admitting on " + p.Spec.NodeName
	}
	reason, _ := scheduledCondition(p)
	switch {
	case slices.Contains(refusedReasons, reason):
		return ""
	case reason == api.ReasonNoCapacity:
		return "NoCapacity: placeholders ask Karpenter for capacity"
	case reason == api.ReasonDriftedNodesOnly:
		return "DriftedNodesOnly: room only on drifted nodes; placeholders ask Karpenter for capacity"
	case reason == corev1.PodReasonUnschedulable:
		return "Unschedulable"
	case reason != "":
		return reason
	}
	return "scheduling"
}

// scheduledCondition is the reason and message of a pod's PodScheduled=False condition.
func scheduledCondition(p *corev1.Pod) (reason, message string) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Reason, c.Message
		}
	}
	return "", ""
}

// gpuPod tells whether a pod asks for whole GPUs or a fraction.
func gpuPod(p *corev1.Pod) bool {
	for _, c := range p.Spec.Containers {
		for _, res := range []corev1.ResourceName{api.ResourceGPU, api.ResourceFraction} {
			if _, ok := c.Resources.Limits[res]; ok {
				return true
			}
		}
	}
	return false
}

// narrator waits for the demo pods and tells, once each, what gpufrac and
// Karpenter do meanwhile: placeholders created, nodes launched, node agents up.
type narrator struct {
	client kubernetes.Interface
	// told: things already said ("placeholders 3", "node x", "agent x").
	told map[string]bool
}

func newNarrator(client kubernetes.Interface) *narrator {
	return &narrator{client: client, told: map[string]bool{}}
}

// waitSettled waits until want demo pods exist, each is settled and no
// placeholder is left, reporting the ones still waiting every few seconds.
func (n *narrator) waitSettled(ctx context.Context, want int, began time.Time) error {
	lastReport := time.Now()
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	for {
		list, err := n.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: demoLabel + "=" + demoLabelValue})
		if err != nil {
			return fmt.Errorf("listing the demo pods: %w", err)
		}
		var waiting []string
		for i := range list.Items {
			if why := unsettled(&list.Items[i]); why != "" {
				waiting = append(waiting, list.Items[i].Name+" ("+why+")")
			}
		}
		if len(list.Items) < want {
			waiting = append(waiting, fmt.Sprintf("%d pods not created yet", want-len(list.Items)))
		}
		placeholders, err := n.tell(ctx)
		if err != nil {
			return err
		}
		if placeholders > 0 {
			waiting = append(waiting, fmt.Sprintf("%d placeholders", placeholders))
		}
		if len(waiting) == 0 {
			fmt.Printf("    settled in %s: %s\n", time.Since(began).Round(100*time.Millisecond), outcome(list.Items))
			return nil
		}
		slices.Sort(waiting)
		if time.Since(lastReport) >= reportEvery {
			fmt.Printf("    waiting for %s\n", strings.Join(waiting, ", "))
			lastReport = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the demo pods (still waiting for %s): %w", strings.Join(waiting, ", "), ctx.Err())
		case <-ticker.C:
		}
	}
}

// outcome summarises settled pods: how many run, and the refused ones with
// their reasons.
func outcome(pods []corev1.Pod) string {
	running := 0
	var refused []string
	for i := range pods {
		p := &pods[i]
		if p.Status.Phase == corev1.PodRunning {
			running++
			continue
		}
		if reason, _ := scheduledCondition(p); reason != "" {
			refused = append(refused, p.Name+" "+reason)
		}
	}
	slices.Sort(refused)
	s := fmt.Sprintf("%d demo pods running", running)
	if len(refused) > 0 {
		s += "; pending by design: " + strings.Join(refused, ", ")
	}
	return s
}

// tell prints what is new among placeholders and Karpenter's nodes, and
// returns how many placeholders exist.
func (n *narrator) tell(ctx context.Context) (int, error) {
	phs, err := n.client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelRole + "=" + api.RolePlaceholder})
	if err != nil {
		return 0, fmt.Errorf("listing placeholders: %w", err)
	}
	gpus := 0
	for _, p := range phs.Items {
		for _, c := range p.Spec.Containers {
			q := c.Resources.Limits[api.ResourceGPU]
			gpus += int(q.Value())
		}
	}
	if key := fmt.Sprintf("placeholders %d", len(phs.Items)); len(phs.Items) > 0 && !n.told[key] {
		n.told[key] = true
		fmt.Printf("    gpufrac-coordinator placed what fits and created %s (%s, fractions packed) for the rest; only placeholders look Unschedulable to Karpenter\n",
			plural(len(phs.Items), "placeholder pod"), plural(gpus, "whole GPU"))
	}
	nodes, err := n.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: labelKarpenterNodePool})
	if err != nil {
		return 0, fmt.Errorf("listing Karpenter's nodes: %w", err)
	}
	for _, node := range nodes.Items {
		if !n.told["node "+node.Name] {
			n.told["node "+node.Name] = true
			fmt.Printf("    Karpenter launched node %s (%s)\n", node.Name, node.Labels[corev1.LabelInstanceTypeStable])
		}
		units := node.Status.Allocatable[api.ResourceFraction]
		if !units.IsZero() && node.Annotations[api.AnnotationGPUInventory] != "" && !n.told["agent "+node.Name] {
			n.told["agent "+node.Name] = true
			gpus := node.Status.Allocatable[api.ResourceGPU]
			fmt.Printf("    gpufrac-node serves %s's %s\n", node.Name, plural(int(gpus.Value()), "GPU"))
		}
	}
	return len(phs.Items), nil
}

// plural is "1 GPU", "2 GPUs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
