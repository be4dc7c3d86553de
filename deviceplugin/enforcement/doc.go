// Package enforcement is gpufrac-node's GPU memory watchdog: it keeps each
// container within the GPU memory its fraction or time-sliced replica
// grants, from outside the container, with NVML.
//
// # What is enforced
//
// Every poll interval (fraction.pollInterval, default 1s) the Watchdog lists
// the processes holding memory on each GPU (NVML, host PIDs; gpufrac-node
// runs with hostPID), maps each PID to its pod and container through
// /proc/<pid>/cgroup (cgroup v1 and v2, systemd and cgroupfs drivers,
// containerd, CRI-O and docker IDs; see ParseCgroup) and the pod informer
// (pod UID and container ID to names), and sums each container's use per
// GPU. The kubelet's PodResources say which devices the container holds,
// hence its limit (Allowances): fraction units x GPU memory / 100, GPU
// memory / replicas per time-sliced replica; whole GPUs and MIG devices are
// unlimited. A container over its limit plus fraction.tolerancePercent for
// fraction.samples consecutive polls (default 3) is a violation and gets
// fraction.enforcement:
//
//   - report: a Warning event on the pod and metrics, nothing else;
//   - kill: SIGKILL to the container's processes on that GPU, largest
//     first, until the rest fit - through a pidfd opened before the
//     process's start time is checked against the sample, so a reused PID
//     is never killed (PIDFDKiller);
//   - evict: the policy/v1 Eviction API on the pod (PDBs and grace period
//     apply), preconditioned on the pod UID.
//
// Each violation and action writes an event on the pod with the numbers
// (used, limit, GPU) and counts in metrics.
//
// # What is not
//
// A process that maps to no container holding a device on that GPU - a
// host process, a container without a device there, a PID missing from
// /proc (no hostPID, wrong --proc-root), or any process when gpufrac-node
// has no API access (standalone) and cannot map pod UIDs to pods - is
// reported (logged once, counted as owner="unknown") and never killed. A GPU whose NVML query fails is skipped for that poll, never acted
// on. The watchdog samples: memory allocated and freed between two polls (a
// burst shorter than the poll interval) is not seen, and a container may
// exceed its limit for up to samples x pollInterval (plus one poll's
// duration) before the action; it cannot stop an allocation from
// succeeding. GPUFRAC_MEMORY_LIMIT_MIB tells the container its limit so it
// can size itself; the watchdog never reads it (a tenant sets its own
// environment): the limit comes from the devices the container holds.
// Compute is not shared out: no MPS daemon runs, a fraction's kernels are
// time-sliced with its neighbours' by the GPU, with no per-fraction share.
package enforcement
