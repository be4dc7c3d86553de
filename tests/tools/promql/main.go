// Command promql-metrics reads PromQL expressions, one JSON string per line
// on stdin, parses each with Prometheus' own parser and prints, per line, a
// JSON object: the metric names its selectors use, or the parse error. The
// chart's tests (deployments/observability_test.go) check the alert rules and
// the dashboard's queries with it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// result is one expression's answer.
type result struct {
	Metrics []string `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var expr string
		if err := json.Unmarshal(in.Bytes(), &expr); err != nil {
			fmt.Fprintln(os.Stderr, "promql-metrics: each line must be a JSON string:", err)
			os.Exit(2)
		}
		if err := out.Encode(metrics(expr)); err != nil {
			fmt.Fprintln(os.Stderr, "promql-metrics:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "promql-metrics:", err)
		os.Exit(1)
	}
}

// metrics parses expr and lists the metric names of its selectors; a
// selector without one (a name regex) is an error here: the tests must know
// every metric.
func metrics(expr string) result {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return result{Error: err.Error()}
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			bad = fmt.Errorf("selector %s names no metric", vs)
			return nil
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
		return nil
	})
	if bad != nil {
		return result{Error: bad.Error()}
	}
	slices.Sort(names)
	return result{Metrics: names}
}
