// Command valuesdoc writes the chart's values reference, docs/values.md, from
// the chart's values.schema.json and values.yaml (make docs).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpufrac/gpufrac/deployments/internal/valuesdoc"
)

func main() {
	schema := flag.String("schema", "deployments/helm/gpufrac/values.schema.json", "the chart's values schema")
	values := flag.String("values", "deployments/helm/gpufrac/values.yaml", "the chart's default values")
	out := flag.String("out", "docs/values.md", "where to write the reference; - for stdout")
	flag.Parse()
	if err := run(*schema, *values, *out); err != nil {
		fmt.Fprintln(os.Stderr, "valuesdoc:", err)
		os.Exit(1)
	}
}

func run(schemaPath, valuesPath, out string) error {
	schema, err := os.ReadFile(schemaPath)
	if err != nil {
		return err
	}
	values, err := os.ReadFile(valuesPath)
	if err != nil {
		return err
	}
	doc, err := valuesdoc.Generate(schema, values)
	if err != nil {
		return err
	}
	if out == "-" {
		_, err = os.Stdout.Write(doc)
		return err
	}
	return os.WriteFile(out, doc, 0o644)
}
