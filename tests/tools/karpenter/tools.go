//go:build tools

// Package tools pins Karpenter's kwok cloud provider; tests/tools/tools.mk builds it,
// through the wrapper's own main ./kwokdra (the provider's main plus DRA device
// templates), into bin/karpenter-kwok and copies the CRDs of the same module into
// bin/karpenter-crds/.
package tools

import (
	_ "sigs.k8s.io/karpenter/kwok"
)
