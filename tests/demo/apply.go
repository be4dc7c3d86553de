package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
)

// applier creates the objects of YAML files, as `kubectl create -f` does.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(client kubernetes.Interface, dyn dynamic.Interface) *applier {
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))}
}

// apply creates every object of a multi-document YAML file; objects that
// exist already are left as they are. It returns "kind/name" of each object.
func (a *applier) apply(ctx context.Context, path string) ([]string, error) {
	objs, err := readObjects(path)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			// A kind installed since the mapper last looked (a CRD).
			a.mapper.Reset()
			mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: mapping %s: %w", path, obj.GetKind(), err)
		}
		var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			ri = a.dyn.Resource(mapping.Resource).Namespace(ns)
		}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("%s: creating %s %s: %w", path, obj.GetKind(), obj.GetName(), err)
		}
		names = append(names, strings.ToLower(obj.GetKind())+"/"+obj.GetName())
	}
	return names, nil
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
