package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
)

// Applier creates the objects of YAML files, as `kubectl create -f` does.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier returns an Applier that maps kinds through client's discovery.
func NewApplier(client kubernetes.Interface, dyn dynamic.Interface) *Applier {
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))}
}

// ApplyFile creates every object of a multi-document YAML file; objects
// that exist already are left as they are. It returns "kind/name" of each
// object.
func (a *Applier) ApplyFile(ctx context.Context, path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return a.Apply(ctx, path, data)
}

// Apply creates every object of multi-document YAML data, named source in
// errors, as ApplyFile does.
func (a *Applier) Apply(ctx context.Context, source string, data []byte) ([]string, error) {
	objs, err := DecodeObjects(source, data)
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
			return nil, fmt.Errorf("%s: mapping %s: %w", source, obj.GetKind(), err)
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
			return nil, fmt.Errorf("%s: creating %s %s: %w", source, obj.GetKind(), obj.GetName(), err)
		}
		names = append(names, strings.ToLower(obj.GetKind())+"/"+obj.GetName())
	}
	return names, nil
}

// ApplyOptions configure ServerSideApply.
type ApplyOptions struct {
	// FieldManager owns the applied fields; empty is "gpufrac-tests".
	FieldManager string
	// DryRun asks the API server to validate and admit every object without
	// storing it (kubectl apply --server-side --dry-run=server).
	DryRun bool
}

// ServerSideApply applies objects in order with server-side apply, taking
// over conflicting fields, as `kubectl apply --server-side --force-conflicts`
// (and Helm 4) do: an object is created or updated to exactly what is
// given. It returns "kind/name" of each object. A kind whose CRD was applied
// earlier in the same call is found once the API server serves it.
func (a *Applier) ServerSideApply(ctx context.Context, source string, objs []*unstructured.Unstructured, o ApplyOptions) ([]string, error) {
	manager := o.FieldManager
	if manager == "" {
		manager = "gpufrac-tests"
	}
	opts := metav1.ApplyOptions{FieldManager: manager, Force: true}
	if o.DryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var names []string
	for _, obj := range objs {
		ri, err := a.resourceFor(ctx, source, obj)
		if err != nil {
			return nil, err
		}
		if _, err := ri.Apply(ctx, obj.GetName(), obj, opts); err != nil {
			return nil, fmt.Errorf("%s: applying %s %s: %w", source, obj.GetKind(), obj.GetName(), err)
		}
		names = append(names, strings.ToLower(obj.GetKind())+"/"+obj.GetName())
	}
	return names, nil
}

// resourceFor maps an object to its resource client, waiting up to 10 s for
// a kind installed since the mapper last looked (a CRD just created).
func (a *Applier) resourceFor(ctx context.Context, source string, obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	var mapping *meta.RESTMapping
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		var err error
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			a.mapper.Reset()
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: mapping %s: %w", source, gvk, err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		return a.dyn.Resource(mapping.Resource).Namespace(ns), nil
	}
	return a.dyn.Resource(mapping.Resource), nil
}

// ReadObjects decodes every YAML or JSON document in a file.
func ReadObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return DecodeObjects(path, data)
}

// DecodeObjects decodes every YAML or JSON document in data, named source in
// errors; empty documents are skipped.
func DecodeObjects(source string, data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", source, err)
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
}
