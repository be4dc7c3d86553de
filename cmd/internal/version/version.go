// Package version is the gpufrac release a binary was built as. The Makefile
// stamps it with the chart's appVersion (deployments/helm/gpufrac/Chart.yaml),
// and the images' Dockerfiles build through the same Makefile target, so a
// binary, its image tag and the chart that deploys it name one version:
//
//	go build -ldflags "-X github.com/gpufrac/gpufrac/cmd/internal/version.version=0.1.0" ./cmd/...
//
// Both daemons report it in gpufrac_build_info{version}.
package version

import "runtime/debug"

// version is set by the linker (-X); it is a var only for that reason and
// nothing writes it at run time.
var version = ""

// dev is what an unstamped build from a work tree reports.
const dev = "dev"

// Get returns the stamped version; without a stamp, the module version `go
// install github.com/gpufrac/gpufrac/cmd/...@vX` records, else "dev".
func Get() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return dev
}
