// Package crdapply upgrades gpufrac's CustomResourceDefinitions in place:
// the Helm chart's pre-install/pre-upgrade hook runs
// `gpufrac-coordinator --apply-crds=DIR` with the chart's crds/ mounted at
// DIR, because Helm installs crds/ once and never upgrades it.
//
// Each CRD is server-side applied with field manager "gpufrac", forced: the
// chart's CRD wins over every other writer. The fields owned by the tools
// that installed it (Helm's crds/, kubectl) are first handed to "gpufrac"
// (client-go's csaupgrade, as `kubectl apply --server-side` does for
// client-side apply), so that a field the new CRD drops is removed, not
// kept alive by its old owner.
//
// A CRD that does not exist is left alone: the hook's ClusterRole may only
// get and patch gpufrac's CRDs by name, and create cannot be limited to
// names. Helm creates it from crds/ (or the admin does, with --skip-crds).
// Nothing here deletes a CRD: a CRD's deletion deletes every Queue.
package crdapply

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/csaupgrade"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
)

// FieldManager owns the fields of gpufrac's CRDs.
const FieldManager = "gpufrac"

// Resource is apiextensions.k8s.io/v1 CustomResourceDefinitions.
var Resource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Read reads every CRD of the *.yaml files of dir. Only CRDs of gpufrac's
// API group, named <plural>.<group>, are accepted: anything else in the
// directory is an error, and so is a directory without one.
func Read(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var crds []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		objs, err := decode(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, o := range objs {
			if err := check(o); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if slices.ContainsFunc(crds, func(c *unstructured.Unstructured) bool { return c.GetName() == o.GetName() }) {
				return nil, fmt.Errorf("%s: CustomResourceDefinition %s given twice", f, o.GetName())
			}
			crds = append(crds, o)
		}
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition in %s/*.yaml", dir)
	}
	return crds, nil
}

func decode(data []byte) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue // an empty document
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func check(o *unstructured.Unstructured) error {
	if o.GetAPIVersion() != "apiextensions.k8s.io/v1" || o.GetKind() != "CustomResourceDefinition" {
		return fmt.Errorf("%s %s %q is not an apiextensions.k8s.io/v1 CustomResourceDefinition", o.GetAPIVersion(), o.GetKind(), o.GetName())
	}
	group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(o.Object, "spec", "names", "plural")
	if group != api.Domain {
		return fmt.Errorf("CustomResourceDefinition %q is of group %q, not gpufrac's %s", o.GetName(), group, api.Domain)
	}
	if plural == "" || o.GetName() != plural+"."+group {
		return fmt.Errorf("CustomResourceDefinition %q is not named <spec.names.plural>.<spec.group> (%s.%s)", o.GetName(), plural, group)
	}
	return nil
}

// Names returns the CRDs' names.
func Names(crds []*unstructured.Unstructured) []string {
	var names []string
	for _, c := range crds {
		names = append(names, c.GetName())
	}
	return names
}

// Result is what Apply did to one CRD.
type Result string

const (
	// Applied: the CRD existed and now has the applied spec.
	Applied Result = "applied"
	// Absent: the CRD does not exist and was left so.
	Absent Result = "absent"
)

// VersionAnnotation records on a CRD the chart version whose CRD was
// applied last (Options.Version).
const VersionAnnotation = api.Domain + "/chart-version"

// Options tune Apply.
type Options struct {
	// Timeout bounds the wait for each CRD to be established.
	Timeout time.Duration
	// Version is the chart version whose CRDs these are, recorded in
	// VersionAnnotation. When the live CRD records a newer version, Apply
	// refuses it (a downgrade: the older schema would drop the newer fields
	// of every stored object) unless AllowDowngrade. Empty: not recorded,
	// not checked.
	Version        string
	AllowDowngrade bool
}

// Apply server-side applies each CRD that exists (see the package comment)
// and waits, up to o.Timeout, until the API server has established it. It
// checks every CRD's version (Options.Version) before it changes any.
func Apply(ctx context.Context, dyn dynamic.Interface, crds []*unstructured.Unstructured, o Options) (map[string]Result, error) {
	logger := klog.FromContext(ctx)
	client := dyn.Resource(Resource)
	done := map[string]Result{}
	live := map[string]*unstructured.Unstructured{}
	for _, crd := range crds {
		name := crd.GetName()
		cur, err := client.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			logger.Info("CustomResourceDefinition not installed; left for Helm's crds/ (or the admin) to create", "crd", name)
			done[name] = Absent
			continue
		}
		if err != nil {
			return done, fmt.Errorf("reading CustomResourceDefinition %s: %w", name, err)
		}
		if err := checkDowngrade(cur, o); err != nil {
			return done, err
		}
		live[name] = cur
	}
	for _, crd := range crds {
		name := crd.GetName()
		cur := live[name]
		if cur == nil {
			continue
		}
		if err := takeOver(ctx, client, cur); err != nil {
			return done, fmt.Errorf("CustomResourceDefinition %s: %w", name, err)
		}
		// Only what the file says: never the live object's resourceVersion.
		apply := crd.DeepCopy()
		apply.SetResourceVersion("")
		if o.Version != "" {
			a := apply.GetAnnotations()
			if a == nil {
				a = map[string]string{}
			}
			a[VersionAnnotation] = o.Version
			apply.SetAnnotations(a)
		}
		if _, err := client.Apply(ctx, name, apply, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
			return done, fmt.Errorf("applying CustomResourceDefinition %s: %w", name, err)
		}
		if err := waitEstablished(ctx, client, name, o.Timeout); err != nil {
			return done, err
		}
		logger.Info("CustomResourceDefinition applied", "crd", name, "fieldManager", FieldManager)
		done[name] = Applied
	}
	return done, nil
}

// checkDowngrade refuses to apply o.Version's CRD over one a newer chart
// version applied, unless o.AllowDowngrade. A live version that is not
// semantic (an admin's edit) or absent (Helm's crds/, an older hook) is no
// reason to refuse.
func checkDowngrade(cur *unstructured.Unstructured, o Options) error {
	if o.Version == "" || o.AllowDowngrade {
		return nil
	}
	liveV, ok := cur.GetAnnotations()[VersionAnnotation]
	if !ok {
		return nil
	}
	want, err := version.ParseSemantic(o.Version)
	if err != nil {
		return fmt.Errorf("chart version %q: %w", o.Version, err)
	}
	have, err := version.ParseSemantic(liveV)
	if err != nil {
		return nil
	}
	if have.GreaterThan(want) {
		return fmt.Errorf("CustomResourceDefinition %s was applied by chart version %s, newer than this chart's %s: "+
			"its older schema would drop the newer fields of every stored object; upgrade to %s or newer, or set "+
			"crds.allowDowngrade=true to apply it anyway", cur.GetName(), liveV, o.Version, liveV)
	}
	return nil
}

// Installers are the field managers of the tools that install a CRD from a
// file: Helm (its crds/: a create in Helm 3, an apply in Helm 4) and kubectl
// (apply, client- and server-side, create, replace).
var Installers = sets.New("helm", "kubectl-client-side-apply", "kubectl", "kubectl-create", "kubectl-replace")

// takeOver hands the fields the Installers own in the CRD (not in its status
// subresource, the API server's) to FieldManager, so that the forced apply
// that follows makes the CRD the chart's: server-side apply removes a field
// only when no other manager owns it, and Helm owns every field of a CRD it
// created from crds/. Fields other managers set (kubectl label or annotate,
// GitOps tools) stay theirs. client-go's csaupgrade merges the field sets,
// as `kubectl apply --server-side` does for client-side apply; appliers are
// handed over the same way (each entry renamed apart first, as csaupgrade
// merges one entry per name). The patch carries the resourceVersion read:
// a concurrent write makes it conflict, and it is retried on a fresh read.
func takeOver(ctx context.Context, client dynamic.ResourceInterface, cur *unstructured.Unstructured) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj := cur.DeepCopy()
		entries := obj.GetManagedFields()
		others := sets.New[string]()
		var names []string
		for i := range entries {
			e := &entries[i]
			if e.Subresource != "" || !Installers.Has(e.Manager) {
				continue
			}
			names = append(names, e.Manager+"/"+string(e.Operation))
			e.Manager = fmt.Sprintf("%s#%d", e.Manager, i)
			e.Operation = metav1.ManagedFieldsOperationUpdate
			others.Insert(e.Manager)
		}
		if others.Len() == 0 {
			return nil
		}
		obj.SetManagedFields(entries)
		if err := csaupgrade.UpgradeManagedFields(obj, others, FieldManager); err != nil {
			return fmt.Errorf("merging the fields of %s: %w", strings.Join(names, ", "), err)
		}
		patch, err := json.Marshal([]map[string]any{
			{"op": "replace", "path": "/metadata/managedFields", "value": obj.GetManagedFields()},
			{"op": "replace", "path": "/metadata/resourceVersion", "value": cur.GetResourceVersion()},
		})
		if err != nil {
			return err
		}
		_, err = client.Patch(ctx, cur.GetName(), types.JSONPatchType, patch, metav1.PatchOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := client.Get(ctx, cur.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			cur = fresh
			return err
		}
		if err != nil {
			return fmt.Errorf("taking over the fields of %s: %w", strings.Join(names, ", "), err)
		}
		klog.FromContext(ctx).V(2).Info("Fields of the CRD's installers taken over", "crd", cur.GetName(), "managers", names)
		return nil
	})
}

func waitEstablished(ctx context.Context, client dynamic.ResourceInterface, name string, timeout time.Duration) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		crd, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		last = errors.New("not Established")
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for CustomResourceDefinition %s to be established: %w (last: %v)", name, err, last)
	}
	return nil
}
