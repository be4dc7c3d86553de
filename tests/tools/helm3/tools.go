//go:build tools

// Package tools pins Helm 3's command; tests/tools/tools.mk builds it into
// bin/helm. The chart (deployments/helm/gpufrac) is linted and rendered with
// it and with Helm 4 (tests/tools/helm4, bin/helm4): it must work with both.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
