// Package valuesdoc writes the chart's values reference (docs/values.md) from
// its values.schema.json and values.yaml: one row per value with its path,
// default, type and description.
//
// The schema gives the paths, types, allowed values and descriptions; a
// value the schema does not describe takes the comment above it in
// values.yaml. Defaults come from the schema's "default" keyword, else from
// values.yaml. Both files are read as YAML nodes, so the rows keep the order
// of the schema's properties.
package valuesdoc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Header is the first lines of the generated document.
const Header = `# Chart values

<!-- Generated from deployments/helm/gpufrac/values.schema.json and values.yaml by ` + "`make docs`" + `
(deployments/cmd/valuesdoc). Do not edit by hand: a test fails when this file is stale. -->

Every value of the Helm chart ` + "`deployments/helm/gpufrac`" + `. The chart's ` + "`values.schema.json`" + ` checks
every value: an unknown key or a wrong value fails ` + "`helm install`" + ` with its path and what is allowed.

- **default** is the chart's default, from ` + "`values.yaml`" + `. "—" means the chart sets nothing there and the
  component's own default applies.
- **type** is the schema's type; "allowed" and "range" in the description are the schema's limits.
- A description is the schema's; the part in *italics* is the comment above the value in ` + "`values.yaml`" + `.
`

// Generate returns the values reference for a chart's schema and values.
func Generate(schemaJSON, valuesYAML []byte) ([]byte, error) {
	var schemaDoc, valuesDoc yaml.Node
	if err := yaml.Unmarshal(schemaJSON, &schemaDoc); err != nil {
		return nil, fmt.Errorf("reading the values schema: %w", err)
	}
	if err := yaml.Unmarshal(valuesYAML, &valuesDoc); err != nil {
		return nil, fmt.Errorf("reading the values: %w", err)
	}
	root := body(&schemaDoc)
	if root == nil || root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("reading the values schema: not an object")
	}
	props := get(root, "properties")
	if props == nil || props.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("reading the values schema: no properties")
	}
	values := body(&valuesDoc)
	var out bytes.Buffer
	out.WriteString(Header)
	for i := 0; i+1 < len(props.Content); i += 2 {
		key, s := props.Content[i].Value, props.Content[i+1]
		out.WriteString("\n## `" + key + "`\n\n")
		if intro := describe(s, comment(values, []string{key})); intro != "" && hasProperties(s) {
			out.WriteString(intro + "\n\n") // a leaf's description is in its row
		}
		var rows []row
		if err := walk(&rows, s, values, []string{key}, true); err != nil {
			return nil, err
		}
		if len(rows) == 0 {
			continue
		}
		out.WriteString("| value | default | type | description |\n|---|---|---|---|\n")
		for _, r := range rows {
			fmt.Fprintf(&out, "| `%s` | %s | %s | %s |\n", r.path, cell(r.def), cell(r.typ), cell(r.desc))
		}
	}
	return out.Bytes(), nil
}

// row is one value of the reference.
type row struct {
	path, def, typ, desc string
}

// walk adds the rows of schema s at path: a row per leaf, and a row per
// object that has a description of its own. The top-level object's
// description is its section's introduction, not a row.
func walk(rows *[]row, s *yaml.Node, values *yaml.Node, path []string, top bool) error {
	if s.Kind != yaml.MappingNode {
		return fmt.Errorf("reading the values schema: %s is not a schema object", strings.Join(path, "."))
	}
	if hasProperties(s) {
		props := get(s, "properties")
		if !top {
			if d := describe(s, comment(values, path)); d != "" {
				*rows = append(*rows, row{path: strings.Join(path, "."), def: "—", typ: typeOf(s), desc: d})
			}
		}
		for i := 0; i+1 < len(props.Content); i += 2 {
			sub := append(append([]string(nil), path...), props.Content[i].Value)
			if err := walk(rows, props.Content[i+1], values, sub, false); err != nil {
				return err
			}
		}
		return nil
	}
	*rows = append(*rows, row{
		path: strings.Join(path, "."),
		def:  defaultOf(s, values, path),
		typ:  typeOf(s),
		desc: describe(s, comment(values, path)),
	})
	return nil
}

// hasProperties tells whether schema s is an object with properties of its own.
func hasProperties(s *yaml.Node) bool {
	props := get(s, "properties")
	return props != nil && props.Kind == yaml.MappingNode && len(props.Content) > 0
}

// describe is the schema's description of s and the values.yaml comment (in
// italics), followed by the schema's allowed values and range.
func describe(s *yaml.Node, valuesComment string) string {
	var parts []string
	d := scalar(get(s, "description"))
	if d != "" {
		parts = append(parts, text(d))
	}
	if valuesComment != "" && (d == "" || !strings.Contains(valuesComment, d)) {
		parts = append(parts, "*"+text(valuesComment)+"*")
	}
	if enum := get(s, "enum"); enum != nil && enum.Kind == yaml.SequenceNode {
		var vs []string
		for _, v := range enum.Content {
			vs = append(vs, "`"+v.Value+"`")
		}
		parts = append(parts, "Allowed: "+strings.Join(vs, ", ")+".")
	}
	if items := get(s, "items"); items != nil {
		if enum := get(items, "enum"); enum != nil && enum.Kind == yaml.SequenceNode {
			var vs []string
			for _, v := range enum.Content {
				vs = append(vs, "`"+v.Value+"`")
			}
			parts = append(parts, "Items allowed: "+strings.Join(vs, ", ")+".")
		}
	}
	lo, hi := scalar(get(s, "minimum")), scalar(get(s, "maximum"))
	switch {
	case lo != "" && hi != "":
		parts = append(parts, "Range: "+lo+" to "+hi+".")
	case lo != "":
		parts = append(parts, "Minimum: "+lo+".")
	case hi != "":
		parts = append(parts, "Maximum: "+hi+".")
	}
	return strings.Join(parts, " ")
}

// typeOf is the schema's type of s: "array of string", "map of string",
// "string or null".
func typeOf(s *yaml.Node) string {
	t := get(s, "type")
	var ts []string
	switch {
	case t == nil:
		return ""
	case t.Kind == yaml.SequenceNode:
		for _, v := range t.Content {
			ts = append(ts, v.Value)
		}
	default:
		ts = []string{t.Value}
	}
	for i, name := range ts {
		switch name {
		case "array":
			if it := typeOf(get(s, "items")); it != "" && get(s, "items") != nil {
				ts[i] = "array of " + it
			}
		case "object":
			if ap := get(s, "additionalProperties"); ap != nil && ap.Kind == yaml.MappingNode {
				if vt := typeOf(ap); vt != "" {
					ts[i] = "map of " + vt
				}
			}
		}
	}
	return strings.Join(ts, " or ")
}

// defaultOf is the value's default: the schema's "default", else its value in
// values.yaml, else "—".
func defaultOf(s *yaml.Node, values *yaml.Node, path []string) string {
	n := get(s, "default")
	if n == nil {
		n = lookup(values, path)
	}
	if n == nil {
		return "—"
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		if n.Value == "" {
			return "`\"\"`"
		}
		return "`" + n.Value + "`"
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return "`" + n.Value + "`"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "`" + n.Value + "`"
	}
	return "`" + string(b) + "`"
}

// comment is the comment values.yaml has above (or beside) the key at path,
// as one line. Example lines (indented further than the text, as in
// "#   groups:") are left out, with the "e.g." that introduces them.
func comment(values *yaml.Node, path []string) string {
	key := lookupKey(values, path)
	if key == nil {
		return ""
	}
	var words []string
	for _, block := range []string{key.HeadComment, key.LineComment} {
		for _, line := range strings.Split(block, "\n") {
			line = strings.TrimPrefix(strings.TrimSpace(line), "#")
			if strings.HasPrefix(line, "  ") || strings.TrimSpace(line) == "" {
				continue // an example, or a blank comment line
			}
			words = append(words, strings.TrimSpace(line))
		}
	}
	text := strings.Join(words, " ")
	for _, eg := range []string{", e.g.:", " e.g.:", " E.g."} {
		if rest, ok := strings.CutSuffix(text, eg); ok {
			text = rest + "."
		}
	}
	return text
}

// text escapes what Markdown would read as markup in prose: emphasis
// markers and HTML tags ("kube-*", "<profile>"). Code spans are kept.
func text(s string) string {
	spans := strings.Split(s, "`")
	for i := 0; i < len(spans); i += 2 { // outside code spans
		spans[i] = strings.NewReplacer("*", `\*`, "<", "&lt;", ">", "&gt;").Replace(spans[i])
	}
	return strings.Join(spans, "`")
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

// body is the content of a document node (n itself otherwise).
func body(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		return n.Content[0]
	}
	return n
}

// get is the value of key in mapping n, or nil.
func get(n *yaml.Node, key string) *yaml.Node {
	if k := keyNode(n, key); k != nil {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i] == k {
				return n.Content[i+1]
			}
		}
	}
	return nil
}

// keyNode is the key node of key in mapping n, or nil.
func keyNode(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i]
		}
	}
	return nil
}

// lookup is the value at path in values, or nil.
func lookup(values *yaml.Node, path []string) *yaml.Node {
	n := values
	for _, k := range path {
		if n = get(n, k); n == nil {
			return nil
		}
	}
	return n
}

// lookupKey is the key node of the last element of path in values, or nil.
func lookupKey(values *yaml.Node, path []string) *yaml.Node {
	if len(path) == 0 {
		return nil
	}
	return keyNode(lookup(values, path[:len(path)-1]), path[len(path)-1])
}

// scalar is n's value when n is a scalar, else "".
func scalar(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}
