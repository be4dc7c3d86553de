# gpufrac — build, test and demo. Everything runs on a machine without a GPU.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
# The machine may export GOFLAGS=-buildvcs=false; keep it and add -mod=mod.
export GOFLAGS := -mod=mod -buildvcs=false
export GOTOOLCHAIN := local
# go-nvml declares deprecated NVML calls; keep cgo quiet about them.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

PKGS := ./...

.PHONY: all build test unit lint fmt vet demo demo-down clean
all: build

## build: the gpufrac binaries into bin/
build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

-include tests/tools/tools.mk
-include tests/demo/demo.mk

## test: every test (unit, integration, end-to-end on the local cluster)
# The coordinator's and the node agent's packages run under the race detector
# (RACE_PKGS); the rest without it. The cluster tests run four at a time
# (-parallel 4): each has its own control plane and mostly waits, so on
# 2 cores four overlap well (docs/benchmarks.md).
RACE_PKGS := ./coordinator/... ./deviceplugin/... ./mig/... ./timeslice/... ./cmd/gpufrac-coordinator/... ./cmd/gpufrac-node/...
test: build tools
	$(GO) test -count=1 -race -timeout 20m $(RACE_PKGS)
	$(GO) test -count=1 -parallel 4 -timeout 40m $$($(GO) list $(PKGS) | grep -v -x -F "$$($(GO) list $(RACE_PKGS))")

## unit: the fast tests only (no local cluster)
unit:
	$(GO) test -count=1 -short -timeout 10m $(PKGS)

## lint: gofmt and go vet
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)/gpufrac-* $(BIN)/kubectl-gpufrac
