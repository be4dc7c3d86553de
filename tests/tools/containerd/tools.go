//go:build tools

// Package tools pins containerd's daemon, its runc shim and ctr; tests/tools/tools.mk
// builds them into bin/.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
