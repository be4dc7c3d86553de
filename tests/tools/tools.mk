# Tool binaries for the local cluster harness (tests/cluster), included by the top Makefile.
#
# Each tool is built from its own wrapper module under tests/tools/<name>/ (own go.mod/go.sum),
# so the project's go.mod never gains their dependencies. A tool is built once and reused while
# it is the version below: the cache key is the version itself. For a binary it is the module
# version Go embedded in it (`go version -m`, so a binary copied or linked into bin/ is judged
# by what it is, not by its name or date); for the copied kwok stages, Karpenter CRDs, Kueue
# manifests and KubeRay CRDs it is a .version file inside the directory. Bumping a version
# here rebuilds that tool on the next `make tools`; an old binary is never reused silently.
# `make tools-clean` forces a rebuild.

TOOLS_DIR := $(CURDIR)/tests/tools
# GOFLAGS is set here, not inherited: the environment may carry other flags (e.g. -buildvcs=false).
# -trimpath as the project's builds have it (Makefile), so that a tool on the project's
# dependency versions (kwok) shares its compiled packages with them; Kubernetes'
# own release builds use it too (hack/lib/golang.sh).
TOOLS_GO := GOTOOLCHAIN=local GOFLAGS='-mod=mod -trimpath' nice -n 10 $(GO)

ETCD_VERSION := v3.6.16
K8S_VERSION := v1.36.3
K8S_MINOR := $(word 2,$(subst ., ,$(K8S_VERSION)))
KWOK_VERSION := v0.8.0
KARPENTER_VERSION := v1.14.1
HELM3_VERSION := v3.22.0
HELM4_VERSION := v4.3.1
PROMETHEUS_OPERATOR_VERSION := v0.85.0
KUEUE_VERSION := v0.17.0
KUBERAY_VERSION := v1.6.0
PROMETHEUS_VERSION := v0.316.0
CONTAINERD_VERSION := v2.4.2
ACTIONLINT_VERSION := v1.7.12

# kubectl version and Helm refuse unversioned binaries; stamp both version packages.
K8S_VERSION_PKGS := k8s.io/component-base/version k8s.io/client-go/pkg/version
K8S_LDFLAGS := -s -w $(foreach p,$(K8S_VERSION_PKGS),-X $(p).gitVersion=$(K8S_VERSION) \
	-X $(p).gitMajor=1 -X $(p).gitMinor=$(K8S_MINOR) -X $(p).gitTreeState=clean)

# Helm refuses charts whose kubeVersion the binary's default does not satisfy
# (it would say 1.20 unstamped); stamp its version and the Kubernetes minor it targets.
HELM3_LDFLAGS := -s -w -X helm.sh/helm/v3/internal/version.version=$(HELM3_VERSION) \
	-X helm.sh/helm/v3/internal/version.gitTreeState=clean \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=34 \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=34
HELM4_LDFLAGS := -s -w -X helm.sh/helm/v4/internal/version.version=$(HELM4_VERSION) \
	-X helm.sh/helm/v4/internal/version.gitTreeState=clean

# Stage definitions kwok needs (it exits with "no stages found" without them).
KWOK_STAGE_DIRS := node/fast node/heartbeat-with-lease pod/fast

# The tools:
# - the control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager), kwok
#   and the Karpenter kwok provider with its CRDs;
# - Kueue's manager with its CRDs and webhook manifests (tests/cluster, Options.Kueue);
# - the KubeRay operator with its CRDs (tests/cluster, Options.KubeRay);
# - for the chart: Helm 3 (bin/helm) and Helm 4 (bin/helm4), as the chart must work with
#   both; the Prometheus Operator's CRDs to dry-run its monitoring objects against, and
#   Prometheus' own PromQL parser for its alert and dashboard queries;
# - for the harness's real node (tests/cluster, StartRealNode): the kubelet, containerd with
#   its runc shim and ctr (to import images), plus runc and the CNI plugins from the
#   distribution (node-deps).
# Listed in the order `make -j2 tools` starts them: the Kubernetes build (the longest)
# first, the others one after another beside it. The other tools and the project
# resolve shared dependencies to one version each, so that Go's build cache compiles
# them once (tests/tools/align_test.go); the Kubernetes build keeps exactly the
# versions its release pins. Tools on the same Kubernetes libraries build apart in
# time, so that the later one finds the shared packages compiled: Kueue first beside
# the Kubernetes build (a build of several minutes must not come last), Karpenter's kwok
# provider well after it on the same 1.35 libraries and controller-runtime (it then
# compiles little more than its own code), KubeRay right after Kueue on the same 1.35
# libraries (its own controller-runtime v0.22); Helm 3, Helm 4 and containerd (1.37
# libraries) in a row; kwok (1.36) last, before go vet compiles the project on the same
# libraries.
TOOLS := $(BIN)/kube-apiserver $(BIN)/kube-scheduler $(BIN)/kube-controller-manager $(BIN)/kubelet \
	$(BIN)/kueue $(BIN)/kueue-manifests $(BIN)/kuberay-operator $(BIN)/kuberay-crds \
	$(BIN)/helm $(BIN)/helm4 $(BIN)/containerd $(BIN)/containerd-shim-runc-v2 $(BIN)/ctr \
	$(BIN)/etcd $(BIN)/karpenter-kwok $(BIN)/karpenter-crds $(BIN)/promql-metrics $(BIN)/prometheus-operator-crds \
	$(BIN)/kwok $(BIN)/kwok-stages

.PHONY: tools tools-build tools-clean node-deps FORCE
## tools: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok, karpenter-kwok, kueue, kuberay-operator, helm (3), helm4, the chart's checkers, the kubelet and containerd into bin/ (and, as root, runc and the CNI plugins: node-deps)
# The tools build TOOLS_JOBS at a time: a Go build leaves a core idle while it links
# or waits on one large package, which another build fills (docs/benchmarks-history.md,
# cold CI). Two builds at once peak near 5 GB of memory (the Kubernetes link
# beside another tool's build); TOOLS_JOBS=1 builds one at a time.
TOOLS_JOBS ?= 2
tools:
	@$(MAKE) --no-print-directory -j$(TOOLS_JOBS) tools-build
tools-build: $(TOOLS) node-deps

## tools-clean: remove the tool binaries so the next `make tools` rebuilds them
tools-clean:
	rm -rf $(TOOLS) $(BIN)/actionlint $(BIN)/.build-*.* $(BIN)/.*.tmp

# Every tool target depends on FORCE: its recipe runs each time and first checks the version.
FORCE:

# $(call tool_is,<binary>,<module>,<version>[,<main package>]): a shell test, true when
# <binary> exists and Go built it from <module> at <version> (the main module or a
# dependency in its build info) and, when given, from the main package <main package>.
tool_is = $(GO) version -m $(1) 2>/dev/null | \
	awk '$$1=="path" {p=$$2} ($$1=="mod"||$$1=="dep") && $$2=="$(2)" {v=$$3} \
		END {exit v!="$(3)" || ("$(4)"!="" && p!="$(4)")}'

# $(call dir_is,<dir>,<version>): a shell test, true when <dir>/.version holds <version>.
dir_is = [ "$$(cat $(1)/.version 2>/dev/null)" = "$(2)" ]

# Helper: $(call build_tool,<name>,<version>,<wrapper dir>,<package>,<ldflags>,<module>[,<main>])
# Does nothing when bin/<name> is already <module> at <version> (built from the main
# package <main>, when given). Builds into a temporary name
# and renames, so an interrupted build never leaves a binary behind (a symlink in bin/ is
# replaced by the new file, never written through).
define build_tool
	@if $(call tool_is,$(BIN)/$(1),$(6),$(2),$(7)); then exit 0; fi; \
	mkdir -p $(BIN); \
	if [ -e $(BIN)/$(1) ]; then echo "$(1) in bin/ is not $(6) $(2) $(7): rebuilding"; fi; \
	echo "building $(1) $(2) (first time: several minutes)"; \
	start=$$(date +%s); \
	cd $(TOOLS_DIR)/$(3) && $(TOOLS_GO) build -ldflags '$(5)' -o $(BIN)/.$(1).tmp $(4) && \
	mv -f $(BIN)/.$(1).tmp $(BIN)/$(1) && \
	echo "built $(1) $(2) in $$(( $$(date +%s) - start ))s"
endef

# Helper: $(call build_tools,<names>,<version>,<wrapper dir>,<package dir>,<ldflags>,<module>,<build flags>)
# build_tool for several commands of one module at once: the main package of <name>
# is <package dir>/<name>. Builds those not already <module> at <version> in one
# `go build` into a temporary directory, then renames each into bin/.
define build_tools
	@set -e; todo=; for n in $(1); do \
		if ! $(call tool_is,$(BIN)/$$n,$(6),$(2),$(4)/'"$$n"'); then todo="$$todo $$n"; \
			if [ -e $(BIN)/$$n ]; then echo "$$n in bin/ is not $(6) $(2): rebuilding"; fi; fi; done; \
	if [ -z "$$todo" ]; then exit 0; fi; \
	mkdir -p $(BIN); echo "building$$todo $(2) (first time: several minutes)"; \
	start=$$(date +%s); tmp=$$(mktemp -d $(BIN)/.build-$(3).XXXXXX); trap 'rm -rf "$$tmp"' EXIT; \
	cd $(TOOLS_DIR)/$(3) && $(TOOLS_GO) build $(7) -ldflags '$(5)' -o $$tmp/ $$(for n in $$todo; do echo $(4)/$$n; done); \
	for n in $$todo; do mv -f $$tmp/$$n $(BIN)/$$n; done; \
	echo "built$$todo $(2) in $$(( $$(date +%s) - start ))s"
endef

$(BIN)/etcd: FORCE
	$(call build_tool,etcd,$(ETCD_VERSION),etcd,go.etcd.io/etcd/server/v3,-s -w,go.etcd.io/etcd/server/v3)

# Grouped targets (&:) need GNU make 4.3: an older make would run the recipe
# once per target, side by side under -j.
ifeq ($(filter grouped-target,$(.FEATURES)),)
$(error GNU make 4.3 or later is needed to build the tools (grouped targets); this is $(MAKE_VERSION))
endif

# The Kubernetes binaries come from one wrapper module and share most packages: one
# `go build` compiles them once and links them side by side (four builds in a row
# would link one at a time). Grouped target: the recipe runs once for all four.
# The build tags are those of a Kubernetes release build (hack/lib/golang.sh, not
# DBG): grpcnotrace leaves gRPC's x/net/trace out, notest the fuzzing helpers.
K8S_CMDS := kube-apiserver kube-scheduler kube-controller-manager kubelet
K8S_TAGS := selinux,notest,grpcnotrace
$(addprefix $(BIN)/,$(K8S_CMDS)) &: FORCE
	$(call build_tools,$(K8S_CMDS),$(K8S_VERSION),kubernetes,k8s.io/kubernetes/cmd,$(K8S_LDFLAGS),k8s.io/kubernetes,-tags $(K8S_TAGS))

# containerd without btrfs (its snapshotter needs btrfs headers; the node uses overlayfs),
# its runc shim and ctr, in one build as above.
CONTAINERD_MODULE := github.com/containerd/containerd/v2
CONTAINERD_CMDS := containerd containerd-shim-runc-v2 ctr
$(addprefix $(BIN)/,$(CONTAINERD_CMDS)) &: FORCE
	$(call build_tools,$(CONTAINERD_CMDS),$(CONTAINERD_VERSION),containerd,$(CONTAINERD_MODULE)/cmd,-s -w,$(CONTAINERD_MODULE),-tags no_btrfs)

# runc and the CNI plugins (bridge, host-local, loopback) come from the distribution:
# installed with apt-get when missing and running as root, else left to the tests,
# which skip the real node with the reason.
NODE_PACKAGES := runc containernetworking-plugins
node-deps:
	@if [ -x /usr/sbin/runc ] && [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "node-deps: not root or no apt-get: install $(NODE_PACKAGES) yourself (the real-node tests skip without them)"; exit 0; fi; \
	echo "installing $(NODE_PACKAGES)"; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(NODE_PACKAGES) || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(NODE_PACKAGES); }

$(BIN)/kwok: FORCE
	$(call build_tool,kwok,$(KWOK_VERSION),kwok,sigs.k8s.io/kwok/cmd/kwok,-s -w,sigs.k8s.io/kwok)

$(BIN)/helm: FORCE
	$(call build_tool,helm,$(HELM3_VERSION),helm3,helm.sh/helm/v3/cmd/helm,$(HELM3_LDFLAGS),helm.sh/helm/v3)

$(BIN)/helm4: FORCE
	$(call build_tool,helm4,$(HELM4_VERSION),helm4,helm.sh/helm/v4/cmd/helm,$(HELM4_LDFLAGS),helm.sh/helm/v4)

# The Karpenter kwok provider, from the wrapper's own main (kwokdra: the provider's
# main plus DRA device templates for instance types); the provider's main package is
# also named kwok, so the binary gets its own name.
KARPENTER_MAIN := github.com/gpufrac/gpufrac/tests/tools/karpenter/kwokdra
$(BIN)/karpenter-kwok: FORCE
	$(call build_tool,karpenter-kwok,$(KARPENTER_VERSION),karpenter,$(KARPENTER_MAIN),-s -w,sigs.k8s.io/karpenter,$(KARPENTER_MAIN))

# The Stage YAMLs of the same kwok module the binary was built from, flat in one directory.
$(BIN)/kwok-stages: FORCE
	@if $(call dir_is,$@,$(KWOK_VERSION)); then exit 0; fi; \
	echo "copying kwok $(KWOK_VERSION) stages"; \
	set -e; dir=$$(cd $(TOOLS_DIR)/kwok && $(TOOLS_GO) mod download sigs.k8s.io/kwok && \
		$(TOOLS_GO) list -m -f '{{.Dir}}' sigs.k8s.io/kwok); \
	rm -rf $@.tmp; mkdir -p $@.tmp; \
	for s in $(KWOK_STAGE_DIRS); do \
		for f in $$dir/kustomize/stage/$$s/*.yaml; do \
			case $$(basename $$f) in kustomization.yaml) ;; \
			*) install -m 0644 $$f $@.tmp/$$(echo $$s | tr / -)-$$(basename $$f) ;; esac; \
		done; \
	done; \
	echo '$(KWOK_VERSION)' > $@.tmp/.version; \
	rm -rf $@; mv $@.tmp $@

# The CRDs of the same Karpenter module the binary was built from (core CRDs and KWOKNodeClass).
$(BIN)/karpenter-crds: FORCE
	@if $(call dir_is,$@,$(KARPENTER_VERSION)); then exit 0; fi; \
	echo "copying karpenter $(KARPENTER_VERSION) CRDs"; \
	set -e; dir=$$(cd $(TOOLS_DIR)/karpenter && $(TOOLS_GO) mod download sigs.k8s.io/karpenter && \
		$(TOOLS_GO) list -m -f '{{.Dir}}' sigs.k8s.io/karpenter); \
	rm -rf $@.tmp; mkdir -p $@.tmp; \
	install -m 0644 $$dir/kwok/charts/crds/*.yaml $$dir/kwok/apis/crds/*.yaml $@.tmp/; \
	echo '$(KARPENTER_VERSION)' > $@.tmp/.version; \
	rm -rf $@; mv $@.tmp $@

# Kueue's manager, as released (its cmd/kueue main).
$(BIN)/kueue: FORCE
	$(call build_tool,kueue,$(KUEUE_VERSION),kueue,sigs.k8s.io/kueue/cmd/kueue,-s -w,sigs.k8s.io/kueue)

# The CRDs (crds/) and the webhook configurations (manifests.yaml) of the same Kueue
# module the binary was built from: tests/cluster applies the CRDs and registers the
# webhooks with the manager's loopback address.
$(BIN)/kueue-manifests: FORCE
	@if $(call dir_is,$@,$(KUEUE_VERSION)); then exit 0; fi; \
	echo "copying kueue $(KUEUE_VERSION) CRDs and webhook manifests"; \
	set -e; dir=$$(cd $(TOOLS_DIR)/kueue && $(TOOLS_GO) mod download sigs.k8s.io/kueue && \
		$(TOOLS_GO) list -m -f '{{.Dir}}' sigs.k8s.io/kueue); \
	rm -rf $@.tmp; mkdir -p $@.tmp/crds; \
	install -m 0644 $$dir/config/components/crd/bases/*.yaml $@.tmp/crds/; \
	install -m 0644 $$dir/config/components/webhook/manifests.yaml $@.tmp/; \
	echo '$(KUEUE_VERSION)' > $@.tmp/.version; \
	rm -rf $@; mv $@.tmp $@

# The KubeRay operator, as released: the main package at the root of its module.
KUBERAY_MODULE := github.com/ray-project/kuberay/ray-operator
$(BIN)/kuberay-operator: FORCE
	$(call build_tool,kuberay-operator,$(KUBERAY_VERSION),kuberay,$(KUBERAY_MODULE),-s -w,$(KUBERAY_MODULE),$(KUBERAY_MODULE))

# The CRDs (RayCluster, RayJob, RayService) of the same KubeRay module the binary
# was built from: tests/cluster applies them before it starts the operator.
$(BIN)/kuberay-crds: FORCE
	@if $(call dir_is,$@,$(KUBERAY_VERSION)); then exit 0; fi; \
	echo "copying kuberay $(KUBERAY_VERSION) CRDs"; \
	set -e; dir=$$(cd $(TOOLS_DIR)/kuberay && $(TOOLS_GO) mod download $(KUBERAY_MODULE) && \
		$(TOOLS_GO) list -m -f '{{.Dir}}' $(KUBERAY_MODULE)); \
	rm -rf $@.tmp; mkdir -p $@.tmp; \
	install -m 0644 $$dir/config/crd/bases/*.yaml $@.tmp/; \
	echo '$(KUBERAY_VERSION)' > $@.tmp/.version; \
	rm -rf $@; mv $@.tmp $@

# actionlint, the GitHub Actions workflow checker: built by make lint, which runs
# it on .github/workflows (not by make tools: no test needs it).
$(BIN)/actionlint: FORCE
	$(call build_tool,actionlint,$(ACTIONLINT_VERSION),actionlint,github.com/rhysd/actionlint/cmd/actionlint,-s -w,github.com/rhysd/actionlint)

# Prometheus' PromQL parser behind a small command (tests/tools/promql).
$(BIN)/promql-metrics: FORCE
	$(call build_tool,promql-metrics,$(PROMETHEUS_VERSION),promql,.,-s -w,github.com/prometheus/prometheus)

# The Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs:
# the chart's monitoring objects are dry-run against them on the test bed.
$(BIN)/prometheus-operator-crds: FORCE
	@if $(call dir_is,$@,$(PROMETHEUS_OPERATOR_VERSION)); then exit 0; fi; \
	echo "copying prometheus-operator $(PROMETHEUS_OPERATOR_VERSION) CRDs"; \
	set -e; dir=$$(cd $(TOOLS_DIR)/prometheus-operator && $(TOOLS_GO) mod download github.com/prometheus-operator/prometheus-operator && \
		$(TOOLS_GO) list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator); \
	rm -rf $@.tmp; mkdir -p $@.tmp; \
	for k in servicemonitors podmonitors prometheusrules; do \
		install -m 0644 $$dir/example/prometheus-operator-crd/monitoring.coreos.com_$$k.yaml $@.tmp/; \
	done; \
	echo '$(PROMETHEUS_OPERATOR_VERSION)' > $@.tmp/.version; \
	rm -rf $@; mv $@.tmp $@
