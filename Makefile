# gpufrac — build, test and demo. Everything runs on a machine without a GPU.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
# The machine may export GOFLAGS=-buildvcs=false; keep it and add -mod=mod.
# -trimpath for every go command make runs (vet, the tests, the binaries the
# tests build, the race run): the release binaries need it (GO_BUILDFLAGS), and
# a build-cache key covers it, so with it everywhere go vet, the tests and
# gpufrac-node's release build share one compile of every dependency instead of
# two (docs/benchmarks.md, "Cold CI"). The tools build with it too (tools.mk).
export GOFLAGS := -mod=mod -buildvcs=false -trimpath
export GOTOOLCHAIN := local
# go-nvml declares deprecated NVML calls; keep cgo quiet about them.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

PKGS := ./...

# The release version is the chart's appVersion: binaries are stamped with it
# (cmd/internal/version) and images tagged with it, so the chart, the images
# and the binaries in them always name one version.
CHART := deployments/helm/gpufrac
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' $(CURDIR)/$(CHART)/Chart.yaml)
GO_LDFLAGS := -s -w -X github.com/gpufrac/gpufrac/cmd/internal/version.version=$(VERSION)
# The release binaries are reproducible from any path: -trimpath keeps the
# checkout's path (and the module cache's) out of them; -buildvcs=false keeps
# git's state out (a docker build context has no .git, so the Dockerfiles'
# builds could not stamp it anyway; the release records the commit as an image
# annotation and in release.json instead). docs/release.md, "Reproducible".
GO_BUILDFLAGS := -trimpath -buildvcs=false
# gpufrac-node calls NVML through cgo (go-nvml dlopens libnvidia-ml.so.1, which
# needs glibc); every other command is static. The images' Dockerfiles build
# through build-node and build-static, so their flags are these.
STATIC_CMDS := gpufrac-coordinator kubectl-gpufrac gpufrac-sim

.PHONY: all build build-node build-static test unit lint chart-check fmt vet demo demo-down clean
all: build

## build: the gpufrac binaries into bin/, stamped with VERSION
build: build-node build-static

build-node:
	@mkdir -p $(BIN)
	CGO_ENABLED=1 $(GO) build $(GO_BUILDFLAGS) -ldflags '$(GO_LDFLAGS)' -o $(BIN)/ ./cmd/gpufrac-node

build-static:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build $(GO_BUILDFLAGS) -ldflags '$(GO_LDFLAGS)' -o $(BIN)/ $(addprefix ./cmd/,$(STATIC_CMDS))

-include tests/tools/tools.mk
-include tests/demo/demo.mk
-include deployments/images/images.mk
-include deployments/krew/krew.mk
-include tests/e2e/compare.mk
-include tests/e2e/upgrade.mk

## test: every test (unit, integration, end-to-end on the local cluster)
# The coordinator's and the node agent's packages run under the race detector
# (RACE_PKGS); the rest without it, at the same time. The cluster tests run four at a time
# (-parallel 4): each has its own control plane and mostly waits, so on
# 2 cores four overlap well (docs/benchmarks-history.md).
RACE_PKGS := ./coordinator/... ./deviceplugin/... ./mig/... ./timeslice/... ./cmd/gpufrac-coordinator/... ./cmd/gpufrac-node/...
# go test starts packages in the order it is given them, two at a time on 2 cores
# (-p): the longest suites go first, so that the end-to-end suite (the longest by
# far) runs beside all the others instead of after most of them.
SLOW_PKGS := ./tests/e2e ./deployments ./tests/cluster ./tests/demo ./tests/nodeagent ./tests/attack
# A stale entry would make go list print nothing, and the test lists below with it.
$(foreach p,$(SLOW_PKGS),$(if $(wildcard $(p)/*.go),,$(error SLOW_PKGS: $(p) has no Go files)))
# The race detector's compile (a second compile of every dependency, minutes on
# a cold cache) goes beside the rest, niced: the cluster suites often wait and
# it fills that time without starving them (at the same priority a cold CI
# run's load reached 16 and a coordinator under test lost its lease). It only
# compiles (go list -export: the packages and their tests, no link), so that
# each race test binary is linked once. The race tests themselves run after the
# rest, at full priority: niced beside them they starved, and a test with a
# 30 s deadline (TestGPUFor) failed on CI.
# -vet=off: go test would vet each package again (a subset of go vet's checks, and on a
# cold cache the analysis facts of every dependency, once more under -race); make lint
# runs the whole of go vet over every package, and CI runs make lint first.
TEST_FLAGS := -count=1 -vet=off
test: build tools
	@set -e; slow=$$($(GO) list $(SLOW_PKGS)); others=$$($(GO) list $(RACE_PKGS) $(SLOW_PKGS)); all=$$($(GO) list $(PKGS)); \
	[ -n "$$slow" ] && [ -n "$$others" ] && [ -n "$$all" ] || { echo "make test: a package list is empty"; exit 1; }; \
	rest=$$(echo "$$all" | grep -v -x -F "$$others" || true); \
	racebuild=; \
	trap '[ -n "$$racebuild" ] && { pkill -TERM -P $$racebuild; kill -TERM $$racebuild; } 2>/dev/null; true' EXIT; \
	trap 'exit 130' INT TERM; \
	echo "nice -n 10 $(GO) list -race -test -deps -export $(RACE_PKGS) (compiles the race run's tests beside the rest)"; \
	nice -n 10 $(GO) list -race -test -deps -export -f '' $(RACE_PKGS) >/dev/null 2>&1 & racebuild=$$!; \
	echo $(GO) test $(TEST_FLAGS) -parallel 4 -timeout 40m $$slow $$rest; \
	rc=0; $(GO) test $(TEST_FLAGS) -parallel 4 -timeout 40m $$slow $$rest || rc=$$?; \
	wait $$racebuild || true; racebuild=; \
	echo $(GO) test $(TEST_FLAGS) -race -timeout 20m $(RACE_PKGS); \
	rrc=0; $(GO) test $(TEST_FLAGS) -race -timeout 20m $(RACE_PKGS) || rrc=$$?; \
	if [ $$rc != 0 ] || [ $$rrc != 0 ]; then echo "make test: FAILED (tests exit $$rc, race run exit $$rrc)"; exit 1; fi

## unit: the fast tests only (no local cluster)
unit:
	$(GO) test -count=1 -short -timeout 10m $(PKGS)

## lint: gofmt, go vet, helm lint of the chart (Helm 3 and 4) and actionlint of .github/workflows. The chart's server-side dry run on the test bed and the Dockerfile checks are tests (./deployments, in make test; alone: make chart-check)
lint:
	@$(MAKE) --no-print-directory -j$(TOOLS_JOBS) $(BIN)/helm $(BIN)/helm4 $(BIN)/actionlint
	$(BIN)/actionlint $(wildcard .github/workflows/*.yml)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@set -e; for h in helm helm4; do for f in $(CHART)/ci/*.yaml; do \
		echo "$$h lint --strict $(CHART) -f $$f"; $(BIN)/$$h lint --strict $(CHART) --namespace gpufrac-system -f $$f >/dev/null; \
	done; done

## chart-check: the chart's tests alone (lint, bad values, server-side dry run on the test bed) and the Dockerfile checks
chart-check: tools
	$(GO) test -count=1 -timeout 10m -run 'TestChart(Lint|RefusesBadValues|DryRunOnTestBed)|TestDockerfiles' ./deployments/

## release-dry-run: everything a release publishes, under bin/release/, without a daemon, a registry or the network: gpufrac-node and gpufrac-coordinator as OCI image layouts (amd64 and arm64; gpufrac-node's arm64 needs Debian's aarch64 cross packages, installed as root when missing), their SPDX SBOMs, the chart packaged with the images' digests (.tgz and OCI layout), kubectl-gpufrac's krew archives and the filled krew manifest, release.json and SHA256SUMS; then checks them (docs/release.md)
.PHONY: release-dry-run release-deps
release-dry-run: $(BIN)/helm release-deps
	$(GO) run ./deployments/cmd/release -version $(VERSION) -out $(BIN)/release -helm $(BIN)/helm -cc arm64=aarch64-linux-gnu-gcc

# gpufrac-node links glibc through cgo: its linux/arm64 image needs an aarch64 C
# cross compiler and arm64's glibc for the base layer, from Debian's cross
# packages. Installed with apt-get when missing and running as root; else the
# dry run leaves gpufrac-node linux/arm64 out and says so ("not built:").
RELEASE_PACKAGES := gcc-aarch64-linux-gnu libc6-dev-arm64-cross libc6-arm64-cross
release-deps:
	@if command -v aarch64-linux-gnu-gcc >/dev/null && [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "release-deps: not root or no apt-get: install $(RELEASE_PACKAGES) yourself for gpufrac-node's linux/arm64 image (left out without them)"; exit 0; fi; \
	echo "installing $(RELEASE_PACKAGES)"; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(RELEASE_PACKAGES) || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(RELEASE_PACKAGES); } || \
		echo "release-deps: could not install $(RELEASE_PACKAGES): gpufrac-node's linux/arm64 image is left out"

## docs: docs/values.md, the chart's values reference, from its values.schema.json and values.yaml (a test fails when it is stale)
.PHONY: docs
docs:
	$(GO) run ./deployments/cmd/valuesdoc -out docs/values.md

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)/gpufrac-* $(BIN)/kubectl-gpufrac
