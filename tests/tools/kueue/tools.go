//go:build tools

// Package tools pins Kueue's manager; tests/tools/tools.mk builds it into bin/kueue
// and copies the CRDs and webhook manifests of the same module into bin/kueue-manifests/.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
