//go:build tools

// Package tools pins Helm 4's command; tests/tools/tools.mk builds it into
// bin/helm4. The chart (deployments/helm/gpufrac) is linted and rendered with
// it and with Helm 3 (tests/tools/helm3, bin/helm): it must work with both.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
