#!/usr/bin/env bash
# Real-GPU checks of gpufrac-node (issue 26): see docs/benchmarks.md,
# "Real GPU checks (tests/gpu)".
#
#   tests/gpu/run.sh build   on a machine with Go and the module proxy (no GPU
#                            needed): builds bin/gpu/gpucheck and bin/gpu/cudahold
#   tests/gpu/run.sh run     on the GPU machine (no network needed): runs them and
#                            prints a results block; extra arguments go to gpucheck
#
# run exits 0 when every check that ran passed, 1 when one failed, 2 when this
# machine has no NVIDIA GPU or driver (nothing was checked), 3 when the
# binaries are missing or do not start, 124 when it ran past its time limit.
# It only reads GPU state: no MIG mode or other GPU setting is changed, and
# nvidia-smi is only asked --query-* questions.
#
# Environment: GPUCHECK_BIN (default <repo>/bin/gpu), GPUCHECK_DEV (the
# device node whose absence means "no GPU", default /dev/nvidiactl),
# GPUCHECK_TIMEOUT (seconds, default 540).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bindir=${GPUCHECK_BIN:-$root/bin/gpu}

not_run() {
	echo "=== gpufrac real-GPU checks (tests/gpu) ==="
	echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "host:   $(hostname 2>/dev/null || echo unknown)"
	echo "result: NOT RUN: $1"
	echo "==="
	echo "tests/gpu/run.sh: cannot run: $1" >&2
}

case "${1:-}" in
build)
	set -e
	cd "$root"
	mkdir -p "$bindir"
	# cgo: go-nvml and cudahold dlopen the driver's libraries at run time;
	# nothing links against CUDA or NVML at build time.
	CGO_ENABLED=1 go build -trimpath -o "$bindir/gpucheck" ./tests/gpu/cmd/gpucheck
	CGO_ENABLED=1 go build -trimpath -o "$bindir/cudahold" ./tests/gpu/cmd/cudahold
	{
		echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
		echo "go: $(go version)"
		echo "libc: $(ldd --version 2>&1 | head -n1)"
	} >"$bindir/BUILDINFO"
	echo "built $bindir/gpucheck and $bindir/cudahold"
	;;
run)
	shift
	dev=${GPUCHECK_DEV:-/dev/nvidiactl}
	if [ ! -e "$dev" ]; then
		not_run "no NVIDIA GPU on this machine: $dev does not exist (no NVIDIA driver loaded)"
		exit 2
	fi
	for b in gpucheck cudahold; do
		if [ ! -x "$bindir/$b" ]; then
			not_run "$bindir/$b is missing: run 'tests/gpu/run.sh build' first (on a machine with the Go module proxy)"
			exit 3
		fi
	done
	# A binary built against a newer glibc than this machine's does not start.
	for b in gpucheck cudahold; do
		out=$("$bindir/$b" -h 2>&1)
		rc=$?
		if [ $rc -ne 0 ] && [ $rc -ne 64 ]; then
			not_run "$bindir/$b does not start here (exit $rc): $out"
			exit 3
		fi
	done
	[ -f "$bindir/BUILDINFO" ] && sed 's/^/build: /' "$bindir/BUILDINFO" >&2
	timeout -k 10 "${GPUCHECK_TIMEOUT:-540}" "$bindir/gpucheck" -cudahold "$bindir/cudahold" "$@"
	exit $?
	;;
*)
	echo "usage: $0 build|run [gpucheck flags]" >&2
	exit 64
	;;
esac
