// Package release is make release-dry-run: everything a gpufrac release
// publishes, built on this machine without a container daemon, a registry or
// the network, under one directory (bin/release):
//
//   - images/<component>/: an OCI image layout per component image
//     (gpufrac-node, gpufrac-coordinator) holding one OCI image index, its
//     platforms' images, named by the version (the commit in an
//     annotation); the index's digest in images/<component>.digest. The images are laid out by
//     tests/images from the components' Dockerfiles (their final stage's
//     COPY, ENV, LABEL, USER, ENTRYPOINT), the binaries built with the make
//     target each Dockerfile's build stage runs, the base layer from this
//     machine's files (tests/images.BaseFiles; for another architecture,
//     its cross packages' files: tests/images.CrossBaseFiles).
//   - sbom/<component>_<os>_<arch>.spdx.json: an SPDX 2.3 SBOM per image,
//     generated from the binary's Go build information (modules, versions,
//     go.sum hashes) and the Debian packages (dpkg) that own the base layer's
//     files.
//   - chart/gpufrac-<version>.tgz: the Helm chart packaged with the images'
//     digests in node.image.digest and coordinator.image.digest; chart/oci/: the
//     same .tgz as an OCI layout in Helm's artifact format (what helm push
//     writes to a registry).
//   - krew/: kubectl-gpufrac's archives (make krew) and krew/gpufrac.yaml, the
//     krew manifest filled with the version and the archives' sha256s.
//   - release.json (what was built, with digests) and SHA256SUMS.
//
// Verify reads all of it back and checks it agrees with itself.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/tests/images"
)

// Media types of a Helm chart in an OCI registry (helm push).
const (
	HelmConfigMediaType = "application/vnd.cncf.helm.config.v1+json"
	HelmChartMediaType  = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// Image is one component image to build.
type Image struct {
	// Name is the component: the directory under deployments/images and the
	// command the image runs.
	Name string
	// Platforms are "linux/<arch>".
	Platforms []string
}

// Config says what the dry run builds.
type Config struct {
	// Root is the repository root.
	Root string
	// Version is the release version (the chart's appVersion by default).
	Version string
	// Out is the output directory; it is emptied first.
	Out string
	// Helm is the helm binary (helm package).
	Helm string
	// Registry is where the images are pushed later (their repository is
	// Registry/<component>); it only names them in release.json.
	Registry string
	// Images are the component images and their platforms.
	Images []Image
	// CrossCC are the C cross compilers by architecture (arm64:
	// aarch64-linux-gnu-gcc), for a cgo binary on a C library base
	// (gpufrac-node) built for another architecture than this machine's; its
	// base layer then takes that architecture's glibc from the cross
	// packages (tests/images.CrossBaseFiles). Such a platform without a
	// compiler here, or without the glibc files, is reported as not built.
	CrossCC map[string]string
	// KrewPlatforms are kubectl-gpufrac's archives' "<os>/<arch>".
	KrewPlatforms []string
	// Commit is the commit recorded in release.json and the images'
	// annotations; empty is the checkout's (git, with -dirty for
	// uncommitted changes; none outside git).
	Commit string
	// SourceDate is the time the chart package's files and the SBOMs carry;
	// zero is the commit's time (the epoch outside git). The release command
	// sets it from SOURCE_DATE_EPOCH when that is set.
	SourceDate time.Time
	// Log gets progress lines; nil is io.Discard.
	Log io.Writer
}

// Manifest is release.json: what the dry run built. Paths are relative to
// the output directory.
type Manifest struct {
	Version string `json:"version"`
	// Commit is the checkout's commit (with -dirty for uncommitted changes).
	Commit string `json:"commit,omitempty"`
	// SourceDate is the time every file of the chart package and the SBOMs
	// carry (RFC 3339, UTC): the commit's, so that a rebuild of the commit
	// gives the same bytes.
	SourceDate string        `json:"sourceDate"`
	Images     []ImageResult `json:"images"`
	Chart      ChartResult   `json:"chart"`
	Krew       KrewResult    `json:"krew"`
	// NotBuilt names what was asked for or is published by a real release
	// but could not be built here, and why.
	NotBuilt []string `json:"notBuilt,omitempty"`
}

// ImageResult is one component image: an OCI layout with one image index.
type ImageResult struct {
	Name       string `json:"name"`
	Repository string `json:"repository"`
	// Layout is the OCI image layout's directory.
	Layout string `json:"layout"`
	// Digest is the image index's digest, the one to pull by.
	Digest string `json:"digest"`
	// DigestFile holds Digest.
	DigestFile string `json:"digestFile"`
	// Tag is the index's name in the layout (org.opencontainers.image.ref.name): the version.
	Tag       string           `json:"tag"`
	Platforms []PlatformResult `json:"platforms"`
}

// PlatformResult is one platform's image of a component.
type PlatformResult struct {
	Platform string `json:"platform"`
	Digest   string `json:"digest"`
	SBOM     string `json:"sbom"`
}

// ChartResult is the packaged chart.
type ChartResult struct {
	Package   string `json:"package"`
	SHA256    string `json:"sha256"`
	OCILayout string `json:"ociLayout"`
	// OCIDigest is the chart artifact's manifest digest.
	OCIDigest string `json:"ociDigest"`
}

// KrewResult is the filled krew manifest and its archives.
type KrewResult struct {
	Manifest string          `json:"manifest"`
	Archives []ArchiveResult `json:"archives"`
}

// ArchiveResult is one kubectl-gpufrac archive.
type ArchiveResult struct {
	Platform string `json:"platform"`
	File     string `json:"file"`
	SHA256   string `json:"sha256"`
}

// Run builds the release into cfg.Out and returns what it built.
func Run(cfg Config) (*Manifest, error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Version == "" || cfg.Out == "" || cfg.Root == "" {
		return nil, fmt.Errorf("release: Root, Version and Out are required")
	}
	// make runs in Root (-C): every path it is given is absolute.
	var err error
	if cfg.Out, err = filepath.Abs(cfg.Out); err != nil {
		return nil, err
	}
	if cfg.Root, err = filepath.Abs(cfg.Root); err != nil {
		return nil, err
	}
	// Out is emptied: never the checkout or a directory above it.
	if rel, err := filepath.Rel(cfg.Out, cfg.Root); err != nil || rel == "." || filepath.IsLocal(rel) {
		return nil, fmt.Errorf("release: the output directory %s would hold the checkout %s", cfg.Out, cfg.Root)
	}
	if err := os.RemoveAll(cfg.Out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	if cfg.Commit == "" {
		cfg.Commit = commit(cfg.Root)
	}
	if cfg.SourceDate.IsZero() {
		cfg.SourceDate = commitTime(cfg.Root)
	}
	cfg.SourceDate = cfg.SourceDate.UTC().Truncate(time.Second)
	m := &Manifest{Version: cfg.Version, Commit: cfg.Commit, SourceDate: cfg.SourceDate.Format(time.RFC3339)}
	digests := map[string]string{}
	for _, im := range cfg.Images {
		res, notBuilt, err := buildImage(cfg, m, im)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", im.Name, err)
		}
		m.NotBuilt = append(m.NotBuilt, notBuilt...)
		m.Images = append(m.Images, *res)
		digests[im.Name] = res.Digest
		fmt.Fprintf(cfg.Log, "%s:%s@%s (%s)\n", res.Repository, cfg.Version, res.Digest, platformsOf(res))
	}
	chart, err := packageChart(cfg, digests)
	if err != nil {
		return nil, fmt.Errorf("chart: %w", err)
	}
	m.Chart = *chart
	fmt.Fprintf(cfg.Log, "chart %s sha256:%s, OCI artifact %s\n", chart.Package, chart.SHA256, chart.OCIDigest)
	krew, err := buildKrew(cfg)
	if err != nil {
		return nil, fmt.Errorf("krew: %w", err)
	}
	m.Krew = *krew
	for _, a := range krew.Archives {
		fmt.Fprintf(cfg.Log, "%s  %s\n", a.SHA256, a.File)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "release.json"), append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := writeSums(cfg.Out); err != nil {
		return nil, err
	}
	for _, n := range m.NotBuilt {
		fmt.Fprintf(cfg.Log, "not built: %s\n", n)
	}
	return m, nil
}

func platformsOf(res *ImageResult) string {
	var ps []string
	for _, p := range res.Platforms {
		ps = append(ps, p.Platform)
	}
	return strings.Join(ps, ", ")
}

// commit is the checkout's short commit, "-dirty" when it has uncommitted
// changes; empty outside git.
func commit(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "-dirty"
	}
	return c
}

// commitTime is the checkout's commit time (so that a rebuild of one commit
// writes the same SBOMs and chart package), the epoch outside git.
func commitTime(root string) time.Time {
	out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%ct", "HEAD").Output()
	if err == nil {
		if sec, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil {
			return time.Unix(sec, 0).UTC()
		}
	}
	return time.Unix(0, 0).UTC()
}

// readTgzFile is the content of name in a gzipped tar.
func readTgzFile(tgz []byte, name string) ([]byte, error) {
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s is not in the archive", name)
		}
		if err != nil {
			return nil, err
		}
		if h.Name == name {
			return io.ReadAll(tr)
		}
	}
}

var runMake = regexp.MustCompile(`(?m)^RUN make (.+)$`)

// makeArgs is the make command line the Dockerfile's build stage runs, with
// its output directory (BIN=/out) replaced by binDir and VERSION set.
func makeArgs(dockerfile, binDir, version string) ([]string, error) {
	data, err := os.ReadFile(dockerfile)
	if err != nil {
		return nil, err
	}
	mm := runMake.FindSubmatch(data)
	if mm == nil {
		return nil, fmt.Errorf("%s: no RUN make line", dockerfile)
	}
	var args []string
	sawBin := false
	for _, a := range strings.Fields(string(mm[1])) {
		switch {
		case strings.HasPrefix(a, "${"): // ${VERSION:+VERSION=$VERSION}
		case a == "BIN=/out":
			args = append(args, "BIN="+binDir)
			sawBin = true
		default:
			args = append(args, a)
		}
	}
	if !sawBin {
		return nil, fmt.Errorf("%s: the make line has no BIN=/out", dockerfile)
	}
	return append(args, "VERSION="+version), nil
}

// buildImage builds one component's binaries, images, SBOMs and OCI layout.
func buildImage(cfg Config, m *Manifest, im Image) (*ImageResult, []string, error) {
	dockerfile := filepath.Join(cfg.Root, "deployments", "images", im.Name, "Dockerfile")
	df, err := images.ParseDockerfile(dockerfile, map[string]string{"VERSION": cfg.Version})
	if err != nil {
		return nil, nil, err
	}
	repo := strings.TrimSuffix(cfg.Registry, "/") + "/" + im.Name
	var notBuilt []string
	var adds []mutate.IndexAddendum
	res := &ImageResult{Name: im.Name, Repository: repo}
	for _, p := range im.Platforms {
		goos, arch, ok := strings.Cut(p, "/")
		if !ok || goos != "linux" {
			return nil, nil, fmt.Errorf("platform %q: want linux/<arch>", p)
		}
		env := []string{"GOOS=" + goos, "GOARCH=" + arch}
		// A binary on a C library base (gpufrac-node: cgo for NVML) needs a C
		// cross compiler for another architecture, and the base layer that
		// architecture's glibc.
		if arch != runtime.GOARCH && usesLibc(df.BaseImage) {
			cc, missing := crossCC(cfg.CrossCC, arch)
			if missing != "" {
				notBuilt = append(notBuilt, fmt.Sprintf("%s %s: the binary links glibc through cgo (base %s); %s", im.Name, p, df.BaseImage, missing))
				continue
			}
			env = append(env, "CC="+cc)
		}
		binDir := filepath.Join(cfg.Out, "build", im.Name, goos+"_"+arch)
		args, err := makeArgs(dockerfile, binDir, cfg.Version)
		if err != nil {
			return nil, nil, err
		}
		cmd := exec.Command("make", append([]string{"-s", "-C", cfg.Root}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		fmt.Fprintf(cfg.Log, "%s make %s\n", strings.Join(env, " "), strings.Join(args, " "))
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("make %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		spec, err := images.FromDockerfileFor(dockerfile, binDir, repo+":"+cfg.Version, map[string]string{"VERSION": cfg.Version}, arch)
		if err != nil {
			return nil, nil, err
		}
		img, err := images.Build(spec)
		if err != nil {
			return nil, nil, err
		}
		d, err := img.Digest()
		if err != nil {
			return nil, nil, err
		}
		sbomPath := filepath.Join("sbom", fmt.Sprintf("%s_%s_%s.spdx.json", im.Name, goos, arch))
		doc, err := SBOM(spec, im.Name, cfg.Version, p, d.String(), cfg.SourceDate.Format(time.RFC3339))
		if err != nil {
			return nil, nil, fmt.Errorf("SBOM: %w", err)
		}
		if err := writeJSON(filepath.Join(cfg.Out, sbomPath), doc); err != nil {
			return nil, nil, err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1,
			Platform:  &v1.Platform{OS: goos, Architecture: arch},
		}})
		res.Platforms = append(res.Platforms, PlatformResult{Platform: p, Digest: d.String(), SBOM: sbomPath})
	}
	if len(adds) == 0 {
		return nil, nil, fmt.Errorf("no platform could be built: %s", strings.Join(notBuilt, "; "))
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	d, err := idx.Digest()
	if err != nil {
		return nil, nil, err
	}
	res.Digest = d.String()
	res.Layout = filepath.Join("images", im.Name)
	// One entry in the layout's index.json, named by the version: crane push
	// pushes a layout's only entry (and refuses several without --index,
	// which would push index.json itself). The commit is an annotation;
	// docs/release.md tags it after the push.
	res.Tag = cfg.Version
	ann := map[string]string{v1AnnotationRefName: cfg.Version}
	if cfg.Commit != "" {
		ann["org.opencontainers.image.revision"] = cfg.Commit
	}
	lp, err := layout.Write(filepath.Join(cfg.Out, res.Layout), empty.Index)
	if err != nil {
		return nil, nil, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(ann)); err != nil {
		return nil, nil, err
	}
	res.DigestFile = filepath.Join("images", im.Name+".digest")
	if err := os.WriteFile(filepath.Join(cfg.Out, res.DigestFile), []byte(res.Digest+"\n"), 0o644); err != nil {
		return nil, nil, err
	}
	return res, notBuilt, nil
}

// v1AnnotationRefName names a manifest in an OCI layout's index.json (skopeo's
// oci:<dir>:<name>, crane's and oras's --oci-layout tags).
const v1AnnotationRefName = "org.opencontainers.image.ref.name"

// crossCC is the C cross compiler for arch, or why there is none here: not
// configured, not on PATH, or arch's glibc (its cross package) missing.
func crossCC(ccs map[string]string, arch string) (cc, missing string) {
	triplet, err := images.Triplet(arch)
	if err != nil {
		return "", err.Error()
	}
	pkgs := fmt.Sprintf("Debian's gcc-%s, libc6-dev-%s-cross and libc6-%s-cross", triplet, arch, arch)
	cc = ccs[arch]
	if cc == "" {
		return "", fmt.Sprintf("no C cross compiler for %s was given (make release-dry-run gives %s-gcc: %s)", arch, triplet, pkgs)
	}
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Sprintf("the C cross compiler %s is not on PATH (%s; make release-dry-run installs them as root)", cc, pkgs)
	}
	libc := filepath.Join(images.CrossLibDir(arch), "libc.so.6")
	if _, err := os.Stat(libc); err != nil {
		return "", fmt.Sprintf("%s's glibc for the base layer is not at %s (libc6-%s-cross)", arch, libc, arch)
	}
	return cc, ""
}

func usesLibc(base string) bool {
	return strings.Contains(base, "base-debian") || strings.Contains(base, "cc-debian")
}

func writeJSON(p string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, append(data, '\n'), 0o644)
}

// packageChart copies the chart, writes the images' digests into its
// values.yaml (node.image.digest, coordinator.image.digest) and the version
// into Chart.yaml, packages it with helm and lays the package out as Helm's
// OCI artifact.
func packageChart(cfg Config, digests map[string]string) (*ChartResult, error) {
	src := filepath.Join(cfg.Root, "deployments", "helm", "gpufrac")
	tmp, err := os.MkdirTemp("", "gpufrac-release-chart-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	dst := filepath.Join(tmp, "gpufrac")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return nil, err
	}
	values, err := os.ReadFile(filepath.Join(dst, "values.yaml"))
	if err != nil {
		return nil, err
	}
	for _, c := range []struct{ key, image string }{{"node", "gpufrac-node"}, {"coordinator", "gpufrac-coordinator"}} {
		d, ok := digests[c.image]
		if !ok {
			return nil, fmt.Errorf("no image built for %s.image.digest", c.key)
		}
		if values, err = setDigest(values, c.image, d); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dst, "values.yaml"), values, 0o644); err != nil {
		return nil, err
	}
	outDir := filepath.Join(cfg.Out, "chart")
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command(cfg.Helm, "package", dst, "--version", cfg.Version, "--app-version", cfg.Version, "--destination", outDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("helm package: %v\n%s", err, out)
	}
	pkg := filepath.Join("chart", "gpufrac-"+cfg.Version+".tgz")
	helmTgz, err := os.ReadFile(filepath.Join(cfg.Out, pkg))
	if err != nil {
		return nil, err
	}
	// helm package stamps every file with the time it ran (Helm 3's
	// chartutil.Save: time.Now(); no flag changes it): the same package,
	// its times set to the source date.
	tgz, err := Reproducible(helmTgz, cfg.SourceDate)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pkg, err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, pkg), tgz, 0o644); err != nil {
		return nil, err
	}
	chartYAML, err := readTgzFile(tgz, "gpufrac/Chart.yaml")
	if err != nil {
		return nil, err
	}
	metadata, err := yaml.YAMLToJSON(chartYAML)
	if err != nil {
		return nil, err
	}
	res := &ChartResult{Package: pkg, SHA256: sha256Hex(tgz), OCILayout: filepath.Join("chart", "oci")}
	d, err := writeChartLayout(filepath.Join(cfg.Out, res.OCILayout), cfg.Version, metadata, tgz)
	if err != nil {
		return nil, err
	}
	res.OCIDigest = d
	return res, nil
}

// Reproducible is the gzipped tar tgz with every entry's time set to date:
// the same entries in the same order (Helm's), with the same names, types,
// modes and contents, owners root, no user or group names, no access or
// change times, and the gzip header's comment and extra field kept (Helm
// writes its own there) with no name and no time. Applied to two packages of
// the same files made at different times, it gives the same bytes.
func Reproducible(tgz []byte, date time.Time) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	zw.Comment, zw.Extra, zw.OS = zr.Comment, zr.Extra, 255 // 255: unknown OS, as Go writes it
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(zr)
	date = date.UTC().Truncate(time.Second)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir:
		default:
			return nil, fmt.Errorf("%s: entry type %q: want only files and directories", h.Name, h.Typeflag)
		}
		nh := &tar.Header{Typeflag: h.Typeflag, Name: h.Name, Mode: h.Mode, Size: h.Size, ModTime: date}
		if err := tw.WriteHeader(nh); err != nil {
			return nil, fmt.Errorf("%s: %w", h.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, fmt.Errorf("%s: %w", h.Name, err)
		}
	}
	if err := zr.Close(); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// setDigest sets digest: "<d>" in the image block whose repository ends in
// /<image>: the first `digest:` line after it.
func setDigest(values []byte, image, d string) ([]byte, error) {
	lines := strings.Split(string(values), "\n")
	repo := regexp.MustCompile(`^\s+repository:\s*\S+/` + regexp.QuoteMeta(image) + `\s*$`)
	digest := regexp.MustCompile(`^(\s+)digest:\s*""\s*$`)
	for i, l := range lines {
		if !repo.MatchString(l) {
			continue
		}
		for j := i + 1; j < len(lines) && j < i+10; j++ {
			if mm := digest.FindStringSubmatch(lines[j]); mm != nil {
				lines[j] = fmt.Sprintf("%sdigest: %q", mm[1], d)
				return []byte(strings.Join(lines, "\n")), nil
			}
		}
		return nil, fmt.Errorf("values.yaml: no `digest: \"\"` after %s's repository", image)
	}
	return nil, fmt.Errorf("values.yaml: no repository for %s", image)
}

// writeChartLayout writes the chart package as Helm's OCI artifact (config
// Chart.yaml as JSON, one layer the .tgz) into an OCI layout tagged version,
// and returns the manifest's digest.
func writeChartLayout(dir, version string, metadata, tgz []byte) (string, error) {
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	blob := func(data []byte) (v1.Hash, error) {
		h := v1.Hash{Algorithm: "sha256", Hex: sha256Hex(data)}
		return h, lp.WriteBlob(h, io.NopCloser(bytes.NewReader(data)))
	}
	ch, err := blob(metadata)
	if err != nil {
		return "", err
	}
	lh, err := blob(tgz)
	if err != nil {
		return "", err
	}
	man := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        v1.Descriptor{MediaType: HelmConfigMediaType, Digest: ch, Size: int64(len(metadata))},
		Layers:        []v1.Descriptor{{MediaType: HelmChartMediaType, Digest: lh, Size: int64(len(tgz))}},
		Annotations: map[string]string{
			"org.opencontainers.image.title":   "gpufrac",
			"org.opencontainers.image.version": version,
		},
	}
	raw, err := json.Marshal(man)
	if err != nil {
		return "", err
	}
	mh, err := blob(raw)
	if err != nil {
		return "", err
	}
	if err := lp.AppendDescriptor(v1.Descriptor{
		MediaType:   types.OCIManifestSchema1,
		Digest:      mh,
		Size:        int64(len(raw)),
		Annotations: map[string]string{v1AnnotationRefName: version},
	}); err != nil {
		return "", err
	}
	return mh.String(), nil
}

// buildKrew builds kubectl-gpufrac's archives with make krew and writes the
// krew manifest filled with the version and their sha256s: only the
// platforms built, each uri pointing at the version's release.
func buildKrew(cfg Config) (*KrewResult, error) {
	dir := filepath.Join(cfg.Out, "krew")
	args := []string{"-s", "-C", cfg.Root, "krew", "KREW_DIR=" + dir, "VERSION=" + cfg.Version, "KREW_PLATFORMS=" + strings.Join(cfg.KrewPlatforms, " ")}
	fmt.Fprintf(cfg.Log, "make %s\n", strings.Join(args[3:], " "))
	if out, err := exec.Command("make", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make krew: %v\n%s", err, out)
	}
	tmpl, err := os.ReadFile(filepath.Join(cfg.Root, "deployments", "krew", "gpufrac.yaml"))
	if err != nil {
		return nil, err
	}
	var plugin map[string]any
	if err := yaml.Unmarshal(tmpl, &plugin); err != nil {
		return nil, err
	}
	spec, _ := plugin["spec"].(map[string]any)
	if spec == nil {
		return nil, fmt.Errorf("deployments/krew/gpufrac.yaml has no spec")
	}
	tag := "v" + cfg.Version
	spec["version"] = tag
	byPlatform := map[string]map[string]any{}
	platforms, _ := spec["platforms"].([]any)
	for _, p := range platforms {
		pm, _ := p.(map[string]any)
		sel, _ := pm["selector"].(map[string]any)
		ml, _ := sel["matchLabels"].(map[string]any)
		byPlatform[fmt.Sprint(ml["os"])+"/"+fmt.Sprint(ml["arch"])] = pm
	}
	res := &KrewResult{Manifest: filepath.Join("krew", "gpufrac.yaml")}
	var filled []any
	for _, p := range cfg.KrewPlatforms {
		pm, ok := byPlatform[p]
		if !ok {
			return nil, fmt.Errorf("deployments/krew/gpufrac.yaml has no platform %s", p)
		}
		goos, arch, _ := strings.Cut(p, "/")
		name := fmt.Sprintf("kubectl-gpufrac_%s_%s_%s.tar.gz", tag, goos, arch)
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		sum := sha256Hex(data)
		uri, _ := pm["uri"].(string)
		base, _, ok := strings.Cut(uri, "/releases/download/")
		if !ok {
			return nil, fmt.Errorf("%s: uri %q is not a GitHub release download", p, uri)
		}
		pm["uri"] = base + "/releases/download/" + tag + "/" + name
		pm["sha256"] = sum
		filled = append(filled, pm)
		res.Archives = append(res.Archives, ArchiveResult{Platform: p, File: filepath.Join("krew", name), SHA256: sum})
	}
	spec["platforms"] = filled
	out, err := yaml.Marshal(plugin)
	if err != nil {
		return nil, err
	}
	header := "# Generated by make release-dry-run from deployments/krew/gpufrac.yaml for " + tag + ":\n# each platform's sha256 is its archive's in this directory.\n"
	if err := os.WriteFile(filepath.Join(cfg.Out, res.Manifest), append([]byte(header), out...), 0o644); err != nil {
		return nil, err
	}
	return res, nil
}

// writeSums writes SHA256SUMS: every file of the release but the OCI
// layouts' blobs (content-addressed already) and the build directory.
func writeSums(out string) error {
	var files []string
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		if d.IsDir() {
			// The layouts are content-addressed already; build/ and krew/<os>_<arch>/
			// hold the binaries that went into the images and archives.
			if rel == "build" || strings.HasPrefix(rel, "images"+string(filepath.Separator)) || rel == filepath.Join("chart", "oci") ||
				strings.HasPrefix(rel, "krew"+string(filepath.Separator)) {
				return fs.SkipDir
			}
			return nil
		}
		if rel != "SHA256SUMS" {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sha256Hex(data), filepath.ToSlash(f))
	}
	return os.WriteFile(filepath.Join(out, "SHA256SUMS"), []byte(b.String()), 0o644)
}

func sha256Hex(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// cleanRel reports whether p is a relative path inside the output directory.
func cleanRel(p string) bool {
	return p != "" && !filepath.IsAbs(p) && filepath.IsLocal(p) && path.Clean(filepath.ToSlash(p)) == filepath.ToSlash(p)
}
