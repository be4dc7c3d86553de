// Command release is make release-dry-run: it builds what a gpufrac release
// publishes (component images as OCI layouts, SBOMs, the chart with the
// images' digests, kubectl-gpufrac's krew archives and manifest) into one
// directory without a daemon, a registry or the network, then checks it
// (deployments/internal/release). docs/release.md says how it is pushed.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpufrac/gpufrac/deployments/internal/release"
)

func main() {
	version := flag.String("version", "", "the release version (make passes the chart's appVersion)")
	out := flag.String("out", "bin/release", "the output directory (emptied first)")
	helm := flag.String("helm", "bin/helm", "the helm binary")
	registry := flag.String("registry", "ghcr.io/gpufrac", "where the images will be pushed (names them in release.json)")
	nodePlatforms := flag.String("node-platforms", "linux/amd64,linux/arm64", "gpufrac-node's platforms (one that cannot be built here is reported and left out)")
	coordPlatforms := flag.String("coordinator-platforms", "linux/amd64,linux/arm64", "gpufrac-coordinator's platforms")
	cc := flag.String("cc", "arm64=aarch64-linux-gnu-gcc", "C cross compilers, <arch>=<cc>[,...], for gpufrac-node (cgo) on another architecture; one missing here leaves that platform out, reported")
	krew := flag.String("krew-platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64", "kubectl-gpufrac's archives")
	verifyOnly := flag.Bool("verify", false, "only check an existing output directory")
	flag.Parse()
	ccs := map[string]string{}
	for _, kv := range split(*cc) {
		arch, c, ok := strings.Cut(kv, "=")
		if !ok || arch == "" || c == "" {
			fmt.Fprintf(os.Stderr, "release-dry-run: -cc %q: want <arch>=<compiler>\n", kv)
			os.Exit(2)
		}
		ccs[arch] = c
	}
	if err := run(*version, *out, *helm, *registry, *nodePlatforms, *coordPlatforms, *krew, ccs, *verifyOnly); err != nil {
		fmt.Fprintln(os.Stderr, "release-dry-run:", err)
		os.Exit(1)
	}
}

func split(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		out = append(out, f)
	}
	return out
}

func run(version, out, helm, registry, node, coord, krew string, ccs map[string]string, verifyOnly bool) error {
	if !verifyOnly {
		if version == "" {
			return fmt.Errorf("-version is required")
		}
		root, err := os.Getwd()
		if err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
			return fmt.Errorf("run it from the repository root: %w", err)
		}
		if helm, err = filepath.Abs(helm); err != nil {
			return err
		}
		if out, err = filepath.Abs(out); err != nil {
			return err
		}
		date, err := sourceDateEpoch(os.Getenv("SOURCE_DATE_EPOCH"))
		if err != nil {
			return err
		}
		if _, err := release.Run(release.Config{
			Root: root, Version: version, Out: out, Helm: helm, Registry: registry,
			Images: []release.Image{
				{Name: "gpufrac-node", Platforms: split(node)},
				{Name: "gpufrac-coordinator", Platforms: split(coord)},
			},
			CrossCC:       ccs,
			KrewPlatforms: split(krew),
			SourceDate:    date,
			Log:           os.Stdout,
		}); err != nil {
			return err
		}
	}
	if err := release.Verify(out); err != nil {
		return fmt.Errorf("the output does not verify:\n%w", err)
	}
	fmt.Printf("%s verified: release.json, SHA256SUMS\n", out)
	return nil
}

// sourceDateEpoch is SOURCE_DATE_EPOCH (https://reproducible-builds.org/specs/source-date-epoch/),
// seconds since the epoch, as the time the chart package and the SBOMs carry;
// unset, zero (the release takes the commit's time).
func sourceDateEpoch(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil || sec < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want a non-negative number of seconds", v)
	}
	return time.Unix(sec, 0).UTC(), nil
}
