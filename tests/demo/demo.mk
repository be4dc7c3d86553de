# make demo / make demo-down, included by the top Makefile.
#
# make demo builds what it needs (gpufrac binaries, the cluster tools, the demo
# driver) and runs `gpufrac-demo up`: in the background, a local control plane
# with Karpenter's kwok provider (1x/8x H100 machines), gpufrac's Helm chart
# (rendered with bin/helm and applied), the real gpufrac-coordinator with the
# chart's arguments as its ServiceAccount, and static mock-H100 GPU nodes, every
# GPU node with a real gpufrac-node run as the chart's DaemonSet runs it; then it submits
# deployments/examples step by step and prints the per-node, per-GPU view with a
# legend. The cluster keeps running until make demo-down.
# DEMO_ARGS passes flags to `gpufrac-demo up`, e.g.
# DEMO_ARGS="--gpu-nodes=3 --gpus-per-node=8 --karpenter=false".

DEMO_ARGS ?=

.PHONY: demo demo-down demo-status

## demo: local cluster with Karpenter, gpufrac-node on every mock GPU node, gpufrac-coordinator, sample workloads; stays up
demo:
	@echo "==> building gpufrac (first time: a few minutes)"
	@$(MAKE) --no-print-directory -s build
	@$(MAKE) --no-print-directory -s tools
	@echo "==> building the demo driver"
	@$(GO) build -o $(BIN)/gpufrac-demo ./tests/demo
	@$(BIN)/gpufrac-demo up $(DEMO_ARGS)

## demo-status: the GPU view of the running demo
demo-status:
	@$(BIN)/gpufrac-demo status

## demo-down: stop the demo cluster and remove bin/demo
demo-down:
	@if [ -x $(BIN)/gpufrac-demo ]; then $(BIN)/gpufrac-demo down; \
	else echo "no demo to stop (bin/gpufrac-demo missing)"; fi
