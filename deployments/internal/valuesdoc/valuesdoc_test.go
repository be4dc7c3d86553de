package valuesdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// root is the repository root, from this package's directory.
var root = filepath.Join("..", "..", "..")

// TestValuesReferenceIsCurrent: docs/values.md is what make docs writes from
// the chart's schema and values (issue 29: a values reference generated from
// the schema). Run `make docs` after changing either.
func TestValuesReferenceIsCurrent(t *testing.T) {
	chart := filepath.Join(root, "deployments", "helm", "gpufrac")
	schema, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := Generate(schema, values)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, "docs", "values.md"))
	if err != nil {
		t.Fatalf("%v: run make docs", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("docs/values.md is stale: run make docs (-want +got):\n%s", diff)
	}
}

// TestGenerateRows: a leaf per row with its path, default, type and
// description; an object's own description as a row; the section's as its
// introduction; the values.yaml comment after the schema's description,
// without its examples and with Markdown's markup escaped.
func TestGenerateRows(t *testing.T) {
	schema := `{
  "type": "object",
  "properties": {
    "node": {
      "type": "object",
      "description": "The node agent.",
      "properties": {
        "mode": {"type": "string", "description": "How GPUs are served.", "enum": ["fraction", "mig"]},
        "replicas": {"type": "integer", "minimum": 2, "maximum": 8},
        "capabilities": {"type": "array", "items": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "image": {
          "type": "object",
          "description": "The image.",
          "properties": {"tag": {"type": "string", "description": "A tag | not latest."}}
        },
        "unset": {"type": ["string", "null"], "default": "x"}
      }
    }
  }
}`
	values := `node:
  # The default for every node.
  mode: fraction
  # Replicas per GPU, e.g.:
  #   replicas: 4
  replicas: 4
  capabilities: [KILL]
  # Labels for kube-* <pods>, not ` + "`kube-*`" + `.
  labels: {a: b}
  image:
    tag: ""
`
	got, err := Generate([]byte(schema), []byte(values))
	if err != nil {
		t.Fatal(err)
	}
	body := strings.TrimPrefix(string(got), Header)
	want := "\n## `node`\n\nThe node agent.\n\n" +
		"| value | default | type | description |\n|---|---|---|---|\n" +
		"| `node.mode` | `fraction` | string | How GPUs are served. *The default for every node.* Allowed: `fraction`, `mig`. |\n" +
		"| `node.replicas` | `4` | integer | *Replicas per GPU.* Range: 2 to 8. |\n" +
		"| `node.capabilities` | `[\"KILL\"]` | array of string |  |\n" +
		"| `node.labels` | `{\"a\":\"b\"}` | map of string | *Labels for kube-\\* &lt;pods&gt;, not `kube-*`.* |\n" +
		"| `node.image` | — | object | The image. |\n" +
		"| `node.image.tag` | `\"\"` | string | A tag \\| not latest. |\n" +
		"| `node.unset` | `x` | string or null |  |\n"
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("Generate (-want +got):\n%s", diff)
	}
}

// TestGenerateRefusesWhatIsNotASchema: a schema without properties, or not
// YAML/JSON at all, is an error, not an empty reference.
func TestGenerateRefusesWhatIsNotASchema(t *testing.T) {
	for name, schema := range map[string]string{
		"not JSON":      "{",
		"no properties": `{"type": "object"}`,
		"not an object": `[1, 2]`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Generate([]byte(schema), []byte("a: 1\n")); err == nil {
				t.Error("no error")
			}
		})
	}
}
