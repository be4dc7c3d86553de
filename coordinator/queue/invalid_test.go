package queue

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestUnreadableQueueIsReportedWithItsReason: a queue the caller could not
// read (Spec.Invalid) is left out with that reason, and its children say
// their parent is invalid and why, not that it does not exist.
func TestUnreadableQueueIsReportedWithItsReason(t *testing.T) {
	_, err := NewTree([]Spec{
		{Name: "bad", Invalid: "spec.priority: cannot unmarshal string"},
		{Name: "child", Parent: "bad", Quota: UnlimitedResources(), Limit: UnlimitedResources(), Weights: DefaultWeights()},
		{Name: "grandchild", Parent: "child", Quota: UnlimitedResources(), Limit: UnlimitedResources(), Weights: DefaultWeights()},
	})
	var te *TreeError
	if !errors.As(err, &te) {
		t.Fatalf("NewTree error = %v, want a *TreeError", err)
	}
	want := map[string]string{
		"bad":        "spec.priority: cannot unmarshal string",
		"child":      `parent "bad" is invalid: spec.priority: cannot unmarshal string`,
		"grandchild": `parent "child" is invalid`,
	}
	if diff := cmp.Diff(want, te.Problems); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
}
