# make compare, included by the top Makefile: issue 16's cost comparison
# (tests/e2e/compare_test.go, docs/benchmarks.md "What a GPU day costs").
#
# The same scripted GPU day, under the same real Karpenter (kwok provider), run
# three ways in parallel subtests (go test's -parallel: two at once on 2
# cores), each on its own local control plane: (a) whole GPUs through
# kube-scheduler, (b) NVIDIA-style time-slicing through kube-scheduler,
# (c) gpufrac (the chart with consolidation; its default sizing, or the test
# bed's price table with GPUFRAC_COMPARE_PRICE_TABLE=1). Two day shapes
# (peak, tail) at two time compressions (1 h = 10 s, 1 h = 60 s): about an
# hour on 2 cores. COMPARE_ENV narrows it, e.g.
#   make compare COMPARE_ENV="GPUFRAC_COMPARE_SHAPES=peak GPUFRAC_COMPARE_SIMHOURS=60s"
# (c)'s consolidation is the chart's defaults compressed as the day is;
# GPUFRAC_COMPARE_CONSOLIDATION="stableFor=6s;maxMoves=8" sets values over them.
# The full log is bin/compare.log; the figures are its COMPARISON table.

COMPARE_ENV ?=

.PHONY: compare

## compare: what a GPU day costs under Karpenter, whole GPUs vs time-slicing vs gpufrac (opt-in, ~1 h on 2 cores)
compare: build tools
	@uptime | tee $(BIN)/compare.log
	set -o pipefail; env GPUFRAC_FIGURES=1 $(COMPARE_ENV) nice -n 5 $(GO) test ./tests/e2e -run 'TestCostComparison' -v -count=1 -timeout 2h 2>&1 \
		| tee -a $(BIN)/compare.log | grep -E '^ *(COMPARISON|RUN shape|\| [a-z]+ \| )'
	@uptime | tee -a $(BIN)/compare.log
