package pods

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func labelsEverything() labels.Selector { return labels.Everything() }

func metav1PatchOptions() metav1.PatchOptions {
	return metav1.PatchOptions{FieldManager: "gpufrac-node"}
}
