# make upgrade-test, included by the top Makefile: issue 29's upgrade across
# versions (tests/e2e/upgrade_versions_test.go, docs/operations.md
# "Upgrading").
#
# An earlier gpufrac (GPUFRAC_UPGRADE_FROM: a commit or tag; default the
# first parent of the last commit on the first-parent line that changed
# gpufrac's code or chart) is exported
# with git archive into bin/upgrade-from/<commit> and built there with its own
# Makefile; the test bed runs its chart, coordinator and node agents with
# work running, then upgrades to this tree: the chart applied again, the
# coordinator rolled, the node agents rolled one node at a time. It needs the
# repository's history (not a shallow clone). The log is bin/upgrade-test.log;
# its WATCHDOG GAP lines give each node's time without a memory watchdog.
#   make upgrade-test GPUFRAC_UPGRADE_FROM=a6f3101

GPUFRAC_UPGRADE_FROM ?=
export GPUFRAC_UPGRADE_FROM

.PHONY: upgrade-test

## upgrade-test: upgrade from an earlier version (GPUFRAC_UPGRADE_FROM) to this tree while work runs (opt-in, builds a second tree)
upgrade-test: build tools
	set -o pipefail; env GPUFRAC_UPGRADE=1 $(GO) test ./tests/e2e -run 'TestUpgradeAcrossVersions$$' -v -count=1 -timeout 30m 2>&1 \
		| tee $(BIN)/upgrade-test.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok )|upgrade_versions_test.go'
