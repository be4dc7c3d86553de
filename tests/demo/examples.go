package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpufrac/gpufrac/api"
)

const (
	// demoLabel (value demoLabelValue) marks every example object and pod.
	demoLabel      = "app.kubernetes.io/part-of"
	demoLabelValue = "gpufrac-demo"
	// reportEvery paces the "still waiting" lines.
	reportEvery = 5 * time.Second
)

// exampleFiles are the files of deployments/examples the demo submits, in order.
// The gang example joins once gpufrac-coordinator exists.
func exampleFiles(karpenter bool) []string {
	files := []string{"whole-gpu.yaml", "fractions.yaml", "fraction-too-big.yaml"}
	if karpenter {
		files = append(files, "burst.yaml")
	}
	return files
}

// submitExamples creates the example objects and waits until their pods settle:
// Running (fraction pods with their GPU written back) or Failed.
func submitExamples(ctx context.Context, cfg config, client kubernetes.Interface) error {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig())
	if err != nil {
		return fmt.Errorf("loading %s: %w", cfg.kubeconfig(), err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating dynamic client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))
	wantPods := 0
	for _, file := range exampleFiles(cfg.karpenter) {
		path := filepath.Join(cfg.root, "deployments", "examples", file)
		objs, err := readObjects(path)
		if err != nil {
			return err
		}
		var names []string
		for _, obj := range objs {
			mapping, err := mapper.RESTMapping(obj.GroupVersionKind().GroupKind(), obj.GroupVersionKind().Version)
			if err != nil {
				return fmt.Errorf("%s: mapping %s: %w", file, obj.GetKind(), err)
			}
			ns := obj.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			if _, err := dyn.Resource(mapping.Resource).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("%s: creating %s %s: %w", file, obj.GetKind(), obj.GetName(), err)
			}
			names = append(names, strings.ToLower(obj.GetKind())+"/"+obj.GetName())
			wantPods += podsOf(obj)
		}
		fmt.Printf("    %s: %s\n", file, strings.Join(names, ", "))
	}
	return waitSettled(ctx, client, wantPods)
}

// podsOf is how many pods an example object makes.
func podsOf(obj *unstructured.Unstructured) int {
	switch obj.GetKind() {
	case "Pod":
		return 1
	case "Deployment", "ReplicaSet", "StatefulSet":
		n, found, _ := unstructured.NestedInt64(obj.Object, "spec", "replicas")
		if !found {
			return 1
		}
		return int(n)
	}
	return 0
}

// waitSettled waits until want demo pods exist and each is settled, reporting
// the ones still waiting every few seconds.
func waitSettled(ctx context.Context, client kubernetes.Interface, want int) error {
	began := time.Now()
	lastReport := began
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	for {
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: demoLabel + "=" + demoLabelValue})
		if err != nil {
			return fmt.Errorf("listing the demo pods: %w", err)
		}
		var waiting []string
		for i := range list.Items {
			if why := unsettled(&list.Items[i]); why != "" {
				waiting = append(waiting, list.Items[i].Namespace+"/"+list.Items[i].Name+" ("+why+")")
			}
		}
		if len(list.Items) < want {
			waiting = append(waiting, fmt.Sprintf("%d pods not created yet", want-len(list.Items)))
		}
		if len(waiting) == 0 {
			fmt.Printf("    %d pods settled in %s\n", len(list.Items), time.Since(began).Round(100*time.Millisecond))
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

// unsettled says why a demo pod is not settled yet, or "" when it is.
func unsettled(p *corev1.Pod) string {
	switch p.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		return ""
	case corev1.PodRunning:
		if fractionPod(p) && p.Annotations[api.AnnotationAllocatedGPU] == "" {
			return "GPU not written back yet"
		}
		return ""
	}
	if p.Spec.NodeName != "" {
		return "admitting on " + p.Spec.NodeName
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
			return "unschedulable; Karpenter is adding a node"
		}
	}
	return "scheduling"
}

func fractionPod(p *corev1.Pod) bool {
	for _, c := range p.Spec.Containers {
		if _, ok := c.Resources.Limits[api.ResourceFraction]; ok {
			return true
		}
	}
	return false
}

// readObjects decodes every YAML document in a file.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
}
