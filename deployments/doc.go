// Package deployments holds what a platform team installs — the Helm chart
// (helm/gpufrac), the images' Dockerfiles (images/), the krew plugin manifest
// (krew/) and sample workloads (examples/) — and the tests that check them
// against the code: the Dockerfiles build with the Makefile's flags, the chart
// renders, validates and installs, every metric its dashboard and alerts use
// is one the components export, and make release-dry-run's output (cmd/release,
// internal/release) verifies.
package deployments
