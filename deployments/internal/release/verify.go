package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/tests/images"
)

// Verify reads a dry run's output back (release.json first) and checks it:
// each image layout reads back with go-containerregistry, every blob matches
// its digest, its index is tagged with the version and holds exactly the
// platforms release.json claims, and its digest is the one in the digest
// file; each image's entrypoint is an ELF of its platform whose loader and
// shared libraries are in the image, of the same machine (checkBinary);
// each SBOM describes its image's digest, lists every file of the
// image with its sha256 and, for the Go binary, every module the binary's
// build information names; the packaged chart's node.image.digest and
// coordinator.image.digest are the images' digests and its OCI layout holds
// the same .tgz; the krew manifest's sha256s are its archives'; SHA256SUMS
// holds. It returns every failure, joined.
func Verify(out string) error {
	var m Manifest
	data, err := os.ReadFile(filepath.Join(out, "release.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("release.json: %w", err)
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	digests := map[string]string{}
	for _, im := range m.Images {
		digests[im.Name] = im.Digest
		if err := verifyImage(out, m.Version, im); err != nil {
			fail("image %s: %w", im.Name, err)
		}
	}
	for _, name := range []string{"gpufrac-node", "gpufrac-coordinator"} {
		if digests[name] == "" {
			fail("release.json has no image %s", name)
		}
	}
	if err := verifyChart(out, m.Version, m.SourceDate, m.Chart, digests); err != nil {
		fail("chart: %w", err)
	}
	if err := verifyKrew(out, m.Version, m.Krew); err != nil {
		fail("krew: %w", err)
	}
	if err := verifySums(out); err != nil {
		fail("SHA256SUMS: %w", err)
	}
	return errors.Join(errs...)
}

func readRel(out, rel string) ([]byte, error) {
	if !cleanRel(rel) {
		return nil, fmt.Errorf("path %q is not inside the release directory", rel)
	}
	return os.ReadFile(filepath.Join(out, rel))
}

func verifyImage(out, version string, im ImageResult) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !cleanRel(im.Layout) {
		return fmt.Errorf("layout %q is not inside the release directory", im.Layout)
	}
	df, err := readRel(out, im.DigestFile)
	if err != nil {
		fail("digest file: %w", err)
	} else if got := strings.TrimSpace(string(df)); got != im.Digest {
		fail("digest file %s says %s, release.json %s", im.DigestFile, got, im.Digest)
	}
	lp, err := layout.FromPath(filepath.Join(out, im.Layout))
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("not an OCI layout: %w", err))...)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if len(tm.Manifests) != 1 {
		fail("the layout's index.json has %d entries, want 1 (crane push pushes a layout's only entry)", len(tm.Manifests))
	}
	for _, d := range tm.Manifests {
		if tag := d.Annotations[v1AnnotationRefName]; tag != version || im.Tag != version {
			fail("layout names the index %q, release.json %q, want the version %s", tag, im.Tag, version)
		}
		if d.Digest.String() != im.Digest {
			fail("layout's index is %s, release.json says %s", d.Digest, im.Digest)
		}
	}
	h, err := v1.NewHash(im.Digest)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	idx, err := top.ImageIndex(h)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("index %s: %w", im.Digest, err))...)
	}
	if d, err := idx.Digest(); err != nil || d != h {
		fail("index digest %v (%v), want %s", d, err, h)
	}
	// Every manifest, config and layer blob is read and hashed.
	if err := validate.Index(idx); err != nil {
		return errors.Join(append(errs, fmt.Errorf("index %s does not validate: %w", im.Digest, err))...)
	}
	man, err := idx.IndexManifest()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	var got, want []string
	for _, p := range im.Platforms {
		want = append(want, p.Platform)
	}
	for _, d := range man.Manifests {
		if d.Platform == nil {
			fail("manifest %s has no platform", d.Digest)
			continue
		}
		got = append(got, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	if !slices.Equal(got, want) {
		fail("the index holds platforms %v, release.json claims %v", got, want)
	}
	for i, p := range im.Platforms {
		if i >= len(man.Manifests) {
			break
		}
		d := man.Manifests[i]
		if d.Digest.String() != p.Digest {
			fail("%s: index names image %s, release.json %s", p.Platform, d.Digest, p.Digest)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			fail("%s: %w", p.Platform, err)
			continue
		}
		if err := verifyPlatformImage(out, version, p, img); err != nil {
			fail("%s: %w", p.Platform, err)
		}
	}
	return errors.Join(errs...)
}

// verifyPlatformImage checks one image's config against its platform and its
// SBOM against its files and its binary's build information.
func verifyPlatformImage(out, version string, p PlatformResult, img v1.Image) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	if cf.OS+"/"+cf.Architecture != p.Platform {
		return fmt.Errorf("config says %s/%s", cf.OS, cf.Architecture)
	}
	if len(cf.Config.Entrypoint) == 0 {
		return fmt.Errorf("no entrypoint")
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; v != version {
		return fmt.Errorf("label org.opencontainers.image.version %q, want %s", v, version)
	}
	files, err := imageFiles(img)
	if err != nil {
		return err
	}
	data, err := readRel(out, p.SBOM)
	if err != nil {
		return fmt.Errorf("SBOM: %w", err)
	}
	var doc SPDX
	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("SBOM %s: %w", p.SBOM, err)
	}
	return errors.Join(checkBinary(files, cf.Config.Entrypoint[0], p.Platform), checkSBOM(&doc, p, files, cf.Config.Entrypoint[0]))
}

// checkBinary checks that the image's entrypoint can start on its platform:
// it is an ELF of the platform's machine (an arm64 image does not carry an
// amd64 binary) and, when it is dynamic, its interpreter (the loader) is in
// the image, and every shared object it and they need is in a directory the
// loader searches (images.LibDirs), each an ELF of the same machine (not
// the build machine's glibc). files holds the image's regular files: the dry
// run writes no symlinks.
func checkBinary(files map[string][]byte, entrypoint, platform string) error {
	_, arch, _ := strings.Cut(platform, "/")
	machine, err := images.ELFMachine(arch)
	if err != nil {
		return err
	}
	bin, ok := files[entrypoint]
	if !ok {
		return fmt.Errorf("the image has no entrypoint %s", entrypoint)
	}
	d, err := images.ReadELF(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("entrypoint %s is not an ELF binary: %w", entrypoint, err)
	}
	if d.Machine != machine {
		return fmt.Errorf("entrypoint %s is a %s binary, not %s's %s", entrypoint, d.Machine, platform, machine)
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if d.Interp == "" {
		if len(d.Needed) > 0 {
			fail("entrypoint %s needs %v but names no interpreter", entrypoint, d.Needed)
		}
		return errors.Join(errs...)
	}
	sameMachine := func(what, p string, data []byte) *images.Dynamic {
		dd, err := images.ReadELF(bytes.NewReader(data))
		if err != nil {
			fail("%s %s is not an ELF file: %v", what, p, err)
			return nil
		}
		if dd.Machine != machine {
			fail("%s %s is a %s ELF, not %s's %s", what, p, dd.Machine, platform, machine)
			return nil
		}
		return &dd
	}
	interp, ok := files[d.Interp]
	if !ok {
		fail("entrypoint %s's interpreter %s is not in the image", entrypoint, d.Interp)
	} else {
		sameMachine("interpreter", d.Interp, interp)
	}
	seen := map[string]bool{path.Base(d.Interp): true} // a library that needs the loader has it loaded
	queue := slices.Clone(d.Needed)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		found := ""
		for _, dir := range images.LibDirs(arch) {
			if _, ok := files[path.Join(dir, name)]; ok {
				found = path.Join(dir, name)
				break
			}
		}
		if found == "" {
			fail("%s needs %s, which is in none of %v in the image", entrypoint, name, images.LibDirs(arch))
			continue
		}
		if dd := sameMachine("shared object", found, files[found]); dd != nil {
			queue = append(queue, dd.Needed...)
		}
	}
	return errors.Join(errs...)
}

// checkSBOM checks an SBOM against the image's files (path to content).
func checkSBOM(doc *SPDX, p PlatformResult, files map[string][]byte, entrypoint string) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf("SBOM "+p.SBOM+": "+format, args...)) }
	if doc.SPDXVersion != "SPDX-2.3" {
		fail("spdxVersion %q", doc.SPDXVersion)
	}
	pkgs := map[string]SPDXPackage{}
	named := map[string]bool{} // name@version
	for _, pk := range doc.Packages {
		pkgs[pk.SPDXID] = pk
		named[pk.Name+"@"+pk.VersionInfo] = true
	}
	img, ok := pkgs["SPDXRef-Image"]
	if !ok || len(img.Checksums) == 0 || "sha256:"+img.Checksums[0].Value != p.Digest {
		fail("does not describe image %s", p.Digest)
	}
	contained := map[string]bool{}
	for _, r := range doc.Relationships {
		if r.Type == "CONTAINS" {
			contained[r.Related] = true
		}
	}
	listed := map[string]bool{}
	for _, f := range doc.Files {
		listed[f.FileName] = true
		content, ok := files[f.FileName]
		if !ok {
			fail("lists %s, which the image does not hold", f.FileName)
			continue
		}
		sum := sha256.Sum256(content)
		if !slices.Contains(f.Checksums, SPDXChecksum{"SHA256", hex.EncodeToString(sum[:])}) {
			fail("%s: sha256 is not the image's file's", f.FileName)
		}
		if !contained[f.SPDXID] {
			fail("%s: no package or the image contains it", f.FileName)
		}
	}
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !listed[n] {
			fail("does not list the image's file %s", n)
		}
	}
	bin, ok := files[entrypoint]
	if !ok {
		fail("the image has no entrypoint %s", entrypoint)
		return errors.Join(errs...)
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		fail("%s has no Go build information: %v", entrypoint, err)
		return errors.Join(errs...)
	}
	if !hasName(doc, bi.Main.Path) {
		fail("does not name the main module %s", bi.Main.Path)
	}
	if !named["stdlib@"+bi.GoVersion] {
		fail("does not name the Go standard library %s", bi.GoVersion)
	}
	for _, d := range bi.Deps {
		path, v, _ := ModuleUsed(d)
		if !named[path+"@"+v] {
			fail("does not name module %s@%s, which %s is built with", path, v, entrypoint)
		}
	}
	return errors.Join(errs...)
}

func hasName(doc *SPDX, name string) bool {
	for _, p := range doc.Packages {
		if p.Name == name {
			return true
		}
	}
	return false
}

// imageFiles is every regular file of img's flattened filesystem.
func imageFiles(img v1.Image) (map[string][]byte, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[path.Clean("/"+h.Name)] = data
	}
}

// checkTgzTimes checks that every entry of the gzipped tar tgz carries the
// time sourceDate (RFC 3339), the time Reproducible gives them, and the
// gzip header none, so that the package is the same bytes at every rebuild.
func checkTgzTimes(tgz []byte, sourceDate string) error {
	date, err := time.Parse(time.RFC3339, sourceDate)
	if err != nil {
		return fmt.Errorf("release.json's sourceDate %q: %w", sourceDate, err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return err
	}
	if !zr.ModTime.IsZero() || zr.Name != "" {
		return fmt.Errorf("the gzip header has a name %q or a time %s", zr.Name, zr.ModTime)
	}
	var bad []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if !h.ModTime.Equal(date) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			bad = append(bad, fmt.Sprintf("%s (%s, %d:%d %s:%s)", h.Name, h.ModTime.UTC().Format(time.RFC3339), h.Uid, h.Gid, h.Uname, h.Gname))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("not reproducible: entries not at the source date %s owned by 0:0 without names: %s", sourceDate, strings.Join(bad, ", "))
	}
	return nil
}

func verifyChart(out, version, sourceDate string, c ChartResult, digests map[string]string) error {
	tgz, err := readRel(out, c.Package)
	if err != nil {
		return err
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if sum := sha256Hex(tgz); sum != c.SHA256 {
		fail("%s has sha256 %s, release.json says %s", c.Package, sum, c.SHA256)
	}
	if err := checkTgzTimes(tgz, sourceDate); err != nil {
		fail("%s: %w", c.Package, err)
	}
	chartYAML, err := readTgzFile(tgz, "gpufrac/Chart.yaml")
	if err != nil {
		return err
	}
	var meta struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(chartYAML, &meta); err != nil {
		return err
	}
	if meta.Version != version || meta.AppVersion != version {
		fail("Chart.yaml version %s, appVersion %s, want %s", meta.Version, meta.AppVersion, version)
	}
	valuesYAML, err := readTgzFile(tgz, "gpufrac/values.yaml")
	if err != nil {
		return err
	}
	var values map[string]any
	if err := yaml.Unmarshal(valuesYAML, &values); err != nil {
		return err
	}
	for key, image := range map[string]string{"node": "gpufrac-node", "coordinator": "gpufrac-coordinator"} {
		comp, _ := values[key].(map[string]any)
		img, _ := comp["image"].(map[string]any)
		got, _ := img["digest"].(string)
		if got != digests[image] {
			fail("values %s.image.digest is %q, the %s image's digest is %s", key, got, image, digests[image])
		}
	}
	// The OCI artifact: the same .tgz, tagged with the version.
	if !cleanRel(c.OCILayout) {
		return errors.Join(append(errs, fmt.Errorf("OCI layout %q is not inside the release directory", c.OCILayout))...)
	}
	lp, err := layout.FromPath(filepath.Join(out, c.OCILayout))
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations[v1AnnotationRefName] != version || tm.Manifests[0].Digest.String() != c.OCIDigest {
		return errors.Join(append(errs, fmt.Errorf("OCI layout's index.json is not one manifest %s tagged %s", c.OCIDigest, version))...)
	}
	raw, err := blob(lp, tm.Manifests[0].Digest)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	var man v1.Manifest
	if err := json.Unmarshal(raw, &man); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if man.Config.MediaType != HelmConfigMediaType || len(man.Layers) != 1 || man.Layers[0].MediaType != HelmChartMediaType {
		fail("OCI manifest is not a Helm chart (config %s, %d layers)", man.Config.MediaType, len(man.Layers))
	} else if man.Layers[0].Digest.Hex != c.SHA256 {
		fail("OCI chart layer %s is not the packaged chart (sha256:%s)", man.Layers[0].Digest, c.SHA256)
	} else {
		if _, err := blob(lp, man.Config.Digest); err != nil {
			fail("OCI chart config: %w", err)
		}
		if _, err := blob(lp, man.Layers[0].Digest); err != nil {
			fail("OCI chart layer: %w", err)
		}
	}
	return errors.Join(errs...)
}

// blob reads a layout's blob and checks its digest.
func blob(lp layout.Path, h v1.Hash) ([]byte, error) {
	rc, err := lp.Blob(h)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	if sum := sha256Hex(data); sum != h.Hex {
		return nil, fmt.Errorf("blob %s has sha256 %s", h, sum)
	}
	return data, nil
}

func verifyKrew(out, version string, k KrewResult) error {
	data, err := readRel(out, k.Manifest)
	if err != nil {
		return err
	}
	var plugin struct {
		Spec struct {
			Version   string `json:"version"`
			Platforms []struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				URI    string `json:"uri"`
				SHA256 string `json:"sha256"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &plugin); err != nil {
		return err
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	tag := "v" + version
	if plugin.Spec.Version != tag {
		fail("manifest version %s, want %s", plugin.Spec.Version, tag)
	}
	if len(plugin.Spec.Platforms) != len(k.Archives) || len(k.Archives) == 0 {
		fail("manifest has %d platforms, %d archives were built", len(plugin.Spec.Platforms), len(k.Archives))
	}
	for i, pl := range plugin.Spec.Platforms {
		p := pl.Selector.MatchLabels["os"] + "/" + pl.Selector.MatchLabels["arch"]
		if i >= len(k.Archives) || k.Archives[i].Platform != p {
			fail("manifest platform %d is %s, not the archive built", i, p)
			continue
		}
		a := k.Archives[i]
		archive, err := readRel(out, a.File)
		if err != nil {
			fail("%s: %v", p, err)
			continue
		}
		sum := sha256Hex(archive)
		if pl.SHA256 != sum || a.SHA256 != sum {
			fail("%s: manifest sha256 %s, release.json %s, archive %s has %s", p, pl.SHA256, a.SHA256, a.File, sum)
		}
		if !strings.HasSuffix(pl.URI, "/releases/download/"+tag+"/"+filepath.Base(a.File)) {
			fail("%s: uri %s is not %s's release of %s", p, pl.URI, tag, filepath.Base(a.File))
		}
	}
	return errors.Join(errs...)
}

func verifySums(out string) error {
	data, err := os.ReadFile(filepath.Join(out, "SHA256SUMS"))
	if err != nil {
		return err
	}
	var errs []error
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		sum, name, ok := strings.Cut(l, "  ")
		if !ok {
			errs = append(errs, fmt.Errorf("line %q", l))
			continue
		}
		content, err := readRel(out, filepath.FromSlash(name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if got := sha256Hex(content); got != sum {
			errs = append(errs, fmt.Errorf("%s: sha256 %s, SHA256SUMS says %s", name, got, sum))
		}
		n++
	}
	if n == 0 {
		errs = append(errs, fmt.Errorf("no file listed"))
	}
	return errors.Join(errs...)
}
