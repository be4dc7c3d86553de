//go:build tools

// Package tools pins actionlint, the GitHub Actions workflow checker; make lint
// builds it into bin/actionlint (tests/tools/tools.mk) and runs it on
// .github/workflows.
package tools

import (
	_ "github.com/rhysd/actionlint/cmd/actionlint"
)
