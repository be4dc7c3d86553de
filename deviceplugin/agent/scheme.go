package agent

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
)

func clientScheme() *runtime.Scheme { return scheme.Scheme }

// typesUID is the UID events use for a Node: the kubelet, too, records node
// events with the node name as UID.
func typesUID(node string) types.UID { return types.UID(node) }
