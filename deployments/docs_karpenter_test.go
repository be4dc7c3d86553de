package deployments_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// yamlBlocks are the ```yaml blocks of a Markdown file.
var yamlBlocks = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// TestEKSGuideNodePoolFitsKarpentersCRD (issue 29): the NodePool in
// docs/install/eks-karpenter.md is what Karpenter's API server would take:
// valid against the schema and CEL rules of the NodePool CRD of the
// Karpenter version the test bed pins (bin/karpenter-crds), with no field
// the schema does not know (the API server would drop it without a word).
func TestEKSGuideNodePoolFitsKarpentersCRD(t *testing.T) {
	root := repoRoot(t)
	crdPath := filepath.Join(root, "bin", "karpenter-crds", "karpenter.sh_nodepools.yaml")
	raw, err := os.ReadFile(crdPath)
	if err != nil {
		if testing.Short() {
			t.Skip("bin/karpenter-crds missing (make tools)")
		}
		t.Fatalf("%v (make tools copies it)", err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
		t.Fatalf("%s: %v", crdPath, err)
	}
	var v1 *apiextensionsv1.CustomResourceValidation
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1" {
			v1 = v.Schema
		}
	}
	if v1 == nil || v1.OpenAPIV3Schema == nil {
		t.Fatalf("%s has no v1 schema", crdPath)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v1.OpenAPIV3Schema, &internal, nil); err != nil {
		t.Fatal(err)
	}
	structural, err := structuralschema.NewStructural(&internal)
	if err != nil {
		t.Fatal(err)
	}
	validator, _, err := validation.NewSchemaValidator(&internal)
	if err != nil {
		t.Fatal(err)
	}
	celValidator := cel.NewValidator(structural, true, celconfig.PerCallLimit)

	doc, err := os.ReadFile(filepath.Join(root, "docs", "install", "eks-karpenter.md"))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, m := range yamlBlocks.FindAllSubmatch(doc, -1) {
		j, err := yaml.YAMLToJSON(m[1])
		if err != nil {
			t.Fatalf("a yaml block of eks-karpenter.md: %v", err)
		}
		var obj map[string]any
		if err := json.Unmarshal(j, &obj); err != nil {
			t.Fatal(err)
		}
		if obj["apiVersion"] != "karpenter.sh/v1" || obj["kind"] != "NodePool" {
			continue
		}
		found++
		if unknown := pruning.PruneWithOptions(obj, structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}); len(unknown) > 0 {
			t.Errorf("fields Karpenter's NodePool does not know: %v", unknown)
		}
		for _, e := range validation.ValidateCustomResource(nil, obj, validator) {
			t.Errorf("schema: %v", e)
		}
		errs, _ := celValidator.Validate(t.Context(), nil, structural, obj, nil, celconfig.RuntimeCELCostBudget)
		for _, e := range errs {
			t.Errorf("CEL: %v", e)
		}
	}
	if found != 1 {
		t.Errorf("eks-karpenter.md has %d NodePools (karpenter.sh/v1), want 1", found)
	}
}
