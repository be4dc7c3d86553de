//go:build tools

// Package tools pins etcd's server command; tests/tools/tools.mk builds it into bin/etcd.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
