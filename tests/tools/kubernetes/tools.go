//go:build tools

// Package tools pins the Kubernetes control-plane commands and the kubelet (for the
// harness's real node); tests/tools/tools.mk
// builds them into bin/ with the version stamped by -ldflags.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
