//go:build tools

// Package tools pins the KubeRay operator; tests/tools/tools.mk builds it (the
// main package at the root of its module) into bin/kuberay-operator and copies
// the CRDs of the same module into bin/kuberay-crds/.
package tools

import (
	_ "github.com/ray-project/kuberay/ray-operator"
)
