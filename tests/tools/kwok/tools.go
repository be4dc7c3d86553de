//go:build tools

// Package tools pins kwok's command; tests/tools/tools.mk builds it into bin/kwok
// and copies the Stage definitions of the same module into bin/kwok-stages/.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
