package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// Parse reads a config file, validates it and fills in the defaults.
//
// Parsing is strict: YAML syntax errors and duplicate keys are reported by
// the YAML reader; unknown fields, values of the wrong type and invalid
// values are all collected into one [*ValidationError] whose problems name
// their path. The returned File is canonical: empty lists and maps are nil,
// and the default policy has every default set.
func Parse(data []byte) (*File, error) {
	// 1. YAML to JSON, refusing duplicate keys.
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("parsing config YAML: %w", err)
	}

	// 2. Check the document's shape against File first, so unknown fields and
	// wrong types come back with their paths, all at once.
	var doc any
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("reading config document: %w", err)
	}
	if problems := checkShape(doc, reflect.TypeFor[File](), nil); len(problems) > 0 {
		return nil, fmt.Errorf("reading config: %w", problemsError(problems))
	}

	// 3. Decode for real; after step 2 this only fails on a bug in checkShape.
	f := &File{}
	if err := yaml.UnmarshalStrict(data, f); err != nil {
		return nil, fmt.Errorf("decoding config: %w", err)
	}
	f.normalize()

	// 4. Values, then defaults.
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("validating config: %w", err)
	}
	f.SetDefaults()
	return f, nil
}

// normalize makes empty lists and maps nil, so that a parsed file compares
// equal to its re-marshalled self (which omits them).
func (f *File) normalize() {
	if len(f.Groups) == 0 {
		f.Groups = nil
	}
	if len(f.Default.GPUs) == 0 {
		f.Default.GPUs = nil
	}
	for i := range f.Groups {
		if len(f.Groups[i].GPUs) == 0 {
			f.Groups[i].GPUs = nil
		}
		if len(f.Groups[i].NodeSelector) == 0 {
			f.Groups[i].NodeSelector = nil
		}
	}
}

var durationType = reflect.TypeFor[Duration]()

// checkShape compares a decoded JSON value (with json.Number numbers) with
// the Go type it will be decoded into, and reports unknown fields and values
// of the wrong type. null is accepted anywhere: it leaves the zero value.
func checkShape(v any, t reflect.Type, p *field.Path) []Problem {
	if v == nil {
		return nil
	}
	if t == durationType {
		s, ok := v.(string)
		if !ok {
			return []Problem{problem(p, "must be a duration such as \"1s\", got %s", describeJSON(v))}
		}
		if _, err := time.ParseDuration(s); err != nil {
			return []Problem{problem(p, "%q is not a duration (want a value such as \"500ms\" or \"1s\")", s)}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return []Problem{shapeProblem(p, "must be a mapping", v)}
		}
		fields := jsonFields(t)
		var problems []Problem
		for _, k := range slices.Sorted(maps.Keys(m)) {
			ft, ok := fields[k]
			if !ok {
				problems = append(problems, problem(p.Child(k), "unknown field%s", suggestField(fields, k)))
				continue
			}
			problems = append(problems, checkShape(m[k], ft, p.Child(k))...)
		}
		return problems
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return []Problem{shapeProblem(p, "must be a mapping", v)}
		}
		var problems []Problem
		for _, k := range slices.Sorted(maps.Keys(m)) {
			problems = append(problems, checkShape(m[k], t.Elem(), p.Key(k))...)
		}
		return problems
	case reflect.Slice:
		list, ok := v.([]any)
		if !ok {
			return []Problem{shapeProblem(p, "must be a list", v)}
		}
		var problems []Problem
		for i, e := range list {
			problems = append(problems, checkShape(e, t.Elem(), p.Index(i))...)
		}
		return problems
	case reflect.String:
		if _, ok := v.(string); !ok {
			pr := shapeProblem(p, "must be a string", v)
			if _, isMap := v.(map[string]any); !isMap {
				if _, isList := v.([]any); !isList {
					pr.Message += " (put it in quotes)"
				}
			}
			return []Problem{pr}
		}
	case reflect.Int:
		n, ok := v.(json.Number)
		if !ok {
			return []Problem{shapeProblem(p, "must be an integer", v)}
		}
		if _, err := strconv.ParseInt(n.String(), 10, strconv.IntSize); err != nil {
			return []Problem{problem(p, "must be an integer, got %s", n)}
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return []Problem{shapeProblem(p, "must be true or false", v)}
		}
	default:
		return []Problem{problem(p, "cannot be read into %s", t)}
	}
	return nil
}

func shapeProblem(p *field.Path, want string, v any) Problem {
	return problem(p, "%s, got %s", want, describeJSON(v))
}

// describeJSON names a decoded JSON value for an error message.
func describeJSON(v any) string {
	switch v := v.(type) {
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return fmt.Sprintf("string %q", v)
	case json.Number:
		return "number " + v.String()
	case bool:
		return "boolean " + strconv.FormatBool(v)
	default:
		return fmt.Sprintf("%T", v)
	}
}

// jsonFields maps the JSON names of t's fields to their types, following
// encoding/json: embedded structs without a name are inlined, "-" is skipped.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if sf.Anonymous && name == "" && sf.Type.Kind() == reflect.Struct {
			maps.Copy(fields, jsonFields(sf.Type))
			continue
		}
		if name == "" {
			name = sf.Name
		}
		fields[name] = sf.Type
	}
	return fields
}

// suggestField returns ` (did you mean "mode"?)` when key matches a known
// field but for case, else "". encoding/json would accept such a key
// silently; this package does not.
func suggestField(fields map[string]reflect.Type, key string) string {
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if strings.EqualFold(name, key) {
			return fmt.Sprintf(" (did you mean %q?)", name)
		}
	}
	return ""
}
