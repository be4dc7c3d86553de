package deployments_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpufrac/gpufrac/deployments/internal/release"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// TestReleaseDryRun runs make release-dry-run's core (release.Run) for the
// platforms cheap to build here (linux/amd64 images, the linux/amd64 krew
// archive; gpufrac-node's linux/arm64 is asked for without a C cross
// compiler and must be reported as not built), checks the output with release.Verify and
// that Helm 3 and 4 read the chart package, builds it again from a copy of the
// checkout at another path and checks every file is the same bytes
// (checkReproducible), then breaks the output one way at a time and checks
// Verify names each break. The full set
// of platforms (the coordinator's linux/arm64, four krew archives) is what
// make release-dry-run builds; GPUFRAC_RELEASE_ARM64=1 adds both components'
// linux/arm64 here (gpufrac-node's with Debian's aarch64 cross compiler and
// arm64 glibc; a cross compile of the dependencies on a cold cache takes
// minutes).
func TestReleaseDryRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the images, the chart and a krew archive")
	}
	// About a minute, mostly builds: beside the test bed's dry run, which waits.
	t.Parallel()
	root := repoRoot(t)
	version := chartAppVersion(t, root)
	coordPlatforms := []string{"linux/amd64"}
	// Without a C cross compiler given, gpufrac-node's linux/arm64 is
	// reported as not built; with GPUFRAC_RELEASE_ARM64=1 it is built (with
	// Debian's aarch64 cross packages, which must then be installed).
	var crossCC map[string]string
	arm64 := os.Getenv("GPUFRAC_RELEASE_ARM64") == "1"
	if arm64 {
		coordPlatforms = append(coordPlatforms, "linux/arm64")
		crossCC = map[string]string{"arm64": "aarch64-linux-gnu-gcc"}
	}
	out := t.TempDir()
	cfg := release.Config{
		Root: root, Version: version, Out: out, Helm: helmPath(t, cluster.Helm3), Registry: "ghcr.io/gpufrac",
		Images: []release.Image{
			{Name: "gpufrac-node", Platforms: []string{"linux/amd64", "linux/arm64"}},
			{Name: "gpufrac-coordinator", Platforms: coordPlatforms},
		},
		CrossCC:       crossCC,
		KrewPlatforms: []string{"linux/amd64"},
	}
	m, err := release.Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := release.Verify(out); err != nil {
		t.Fatalf("the dry run's output does not verify:\n%v", err)
	}
	// Helm reads the repacked chart package.
	for _, helm := range []string{cluster.Helm3, cluster.Helm4} {
		pkg := filepath.Join(out, m.Chart.Package)
		if b, err := exec.Command(helmPath(t, helm), "show", "chart", pkg).CombinedOutput(); err != nil || !strings.Contains(string(b), "version: "+version) {
			t.Errorf("%s show chart %s: %v\n%s", helm, m.Chart.Package, err, b)
		}
		if b, err := exec.Command(helmPath(t, helm), "lint", pkg).CombinedOutput(); err != nil {
			t.Errorf("%s lint %s: %v\n%s", helm, m.Chart.Package, err, b)
		}
	}
	t.Run("the same bytes from a copy of the tree at another path", func(t *testing.T) {
		// The second build finds every compile in Go's build cache (with
		// -trimpath the package directory is not part of the cache key), so
		// it costs the links, the layers and helm package: seconds, not the
		// first build's minutes.
		checkReproducible(t, root, cfg, m)
	})
	nodePlatforms := 2
	if !arm64 {
		nodePlatforms = 1
		if len(m.NotBuilt) != 1 || !strings.Contains(m.NotBuilt[0], "gpufrac-node linux/arm64") || !strings.Contains(m.NotBuilt[0], "no C cross compiler") {
			t.Errorf("not built: %q, want gpufrac-node linux/arm64 named for want of a C cross compiler", m.NotBuilt)
		}
	} else if len(m.NotBuilt) != 0 {
		t.Errorf("not built: %q, want everything built", m.NotBuilt)
	}
	images := map[string]release.ImageResult{}
	for _, im := range m.Images {
		images[im.Name] = im
	}
	node, coord := images["gpufrac-node"], images["gpufrac-coordinator"]
	if len(node.Platforms) != nodePlatforms || len(coord.Platforms) != len(coordPlatforms) {
		t.Fatalf("platforms built: node %v, coordinator %v", node.Platforms, coord.Platforms)
	}
	if node.Tag != version || coord.Tag != version {
		t.Errorf("layout tags %s, %s, want %s", node.Tag, coord.Tag, version)
	}

	// Each break below must be caught by Verify with the message given.
	breaks := []struct {
		name, file, want string
		edit             func(t *testing.T, data []byte) []byte
	}{
		{"a platform claimed but not in the index", "release.json", "release.json claims [" + strings.Join(append(platformNames(node), "linux/s390x"), " ") + "]",
			func(t *testing.T, data []byte) []byte {
				var mm release.Manifest
				if err := json.Unmarshal(data, &mm); err != nil {
					t.Fatal(err)
				}
				for i := range mm.Images {
					if mm.Images[i].Name == "gpufrac-node" {
						mm.Images[i].Platforms = append(mm.Images[i].Platforms, release.PlatformResult{Platform: "linux/s390x"})
					}
				}
				out, _ := json.Marshal(mm)
				return out
			}},
		{"a digest file that is not the index's", node.DigestFile, "digest file " + node.DigestFile,
			func(t *testing.T, data []byte) []byte { return []byte("sha256:" + strings.Repeat("0", 64) + "\n") }},
		{"a layer blob changed", largestBlob(t, filepath.Join(out, coord.Layout)), "does not validate",
			func(t *testing.T, data []byte) []byte {
				data = slices.Clone(data)
				data[len(data)/2] ^= 0xff
				return data
			}},
		{"the chart's node.image.digest not the node image's", m.Chart.Package, "values node.image.digest is \"" + coord.Digest + "\"",
			func(t *testing.T, data []byte) []byte {
				return rewriteTgz(t, data, "gpufrac/values.yaml", func(v []byte) []byte {
					if !bytes.Contains(v, []byte(node.Digest)) {
						t.Fatalf("the packaged values.yaml does not hold %s", node.Digest)
					}
					return bytes.Replace(v, []byte(node.Digest), []byte(coord.Digest), 1)
				})
			}},
		{"an SBOM without one of the binary's modules", node.Platforms[0].SBOM, "does not name module",
			func(t *testing.T, data []byte) []byte {
				var doc release.SPDX
				if err := json.Unmarshal(data, &doc); err != nil {
					t.Fatal(err)
				}
				i := slices.IndexFunc(doc.Packages, func(p release.SPDXPackage) bool { return strings.HasPrefix(p.Comment, "go.sum ") })
				if i < 0 {
					t.Fatal("the SBOM names no module with a go.sum hash")
				}
				doc.Packages = slices.Delete(doc.Packages, i, i+1)
				out, _ := json.Marshal(doc)
				return out
			}},
		{"an SBOM without the base layer's C library", node.Platforms[0].SBOM, "does not list the image's file /lib/",
			func(t *testing.T, data []byte) []byte {
				var doc release.SPDX
				if err := json.Unmarshal(data, &doc); err != nil {
					t.Fatal(err)
				}
				i := slices.IndexFunc(doc.Files, func(f release.SPDXFile) bool { return strings.HasPrefix(f.FileName, "/lib/") })
				if i < 0 {
					t.Fatal("the node image's SBOM lists no C library file")
				}
				doc.Files = slices.Delete(doc.Files, i, i+1)
				out, _ := json.Marshal(doc)
				return out
			}},
		{"a krew sha256 that is not the archive's", m.Krew.Manifest, "manifest sha256 " + strings.Repeat("f", 64),
			func(t *testing.T, data []byte) []byte {
				return bytes.Replace(data, []byte(m.Krew.Archives[0].SHA256), []byte(strings.Repeat("f", 64)), 1)
			}},
	}
	for _, b := range breaks {
		t.Run(b.name, func(t *testing.T) {
			p := b.file
			if !filepath.IsAbs(p) {
				p = filepath.Join(out, p)
			}
			orig, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, 0o644); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := os.WriteFile(p, orig, 0o644); err != nil {
					t.Fatal(err)
				}
				os.Chmod(p, st.Mode().Perm())
			}()
			if err := os.WriteFile(p, b.edit(t, orig), 0o644); err != nil {
				t.Fatal(err)
			}
			err = release.Verify(out)
			if err == nil {
				t.Fatal("Verify accepted it")
			}
			if !strings.Contains(err.Error(), b.want) {
				t.Errorf("Verify's error does not say %q:\n%v", b.want, err)
			}
		})
	}
	// Restored, the output verifies again.
	if err := release.Verify(out); err != nil {
		t.Errorf("after the breaks were undone: %v", err)
	}
}

// platformNames are an image's platforms, in release.json's order.
func platformNames(im release.ImageResult) []string {
	var out []string
	for _, p := range im.Platforms {
		out = append(out, p.Platform)
	}
	return out
}

// largestBlob is the largest blob of an OCI layout (a layer).
func largestBlob(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var best string
	var size int64 = -1
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Size() > size {
			best, size = filepath.Join(dir, "blobs", "sha256", e.Name()), info.Size()
		}
	}
	return best
}

// rewriteTgz returns the gzipped tar tgz with name's content edited.
func rewriteTgz(t *testing.T, tgz []byte, name string, edit func([]byte) []byte) []byte {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == name {
			data, found = edit(data), true
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if !found {
		t.Fatalf("%s is not in the archive", name)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// checkReproducible builds the release again with cfg from a copy of the
// checkout's files (tracked and untracked, not ignored: what git ls-files
// lists) at another path, with the first build's commit and source date (the
// copy is not a git checkout), and checks that every file of the two outputs
// is the same bytes: the image layouts (so every image index and image
// digest), the binaries, the chart .tgz and its OCI layout, the SBOMs,
// release.json and SHA256SUMS.
func checkReproducible(t *testing.T, root string, cfg release.Config, first *release.Manifest) {
	t.Helper()
	list, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files (the test copies the checkout's files): %v", err)
	}
	copyRoot := filepath.Join(t.TempDir(), "elsewhere", "gpufrac")
	for _, rel := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		src, dst := filepath.Join(root, rel), filepath.Join(copyRoot, rel)
		st, err := os.Lstat(src)
		if os.IsNotExist(err) {
			continue // deleted in the working tree, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, dst); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	date, err := time.Parse(time.RFC3339, first.SourceDate)
	if err != nil {
		t.Fatalf("release.json sourceDate: %v", err)
	}
	firstOut := cfg.Out
	cfg.Root, cfg.Out, cfg.Commit, cfg.SourceDate = copyRoot, filepath.Join(t.TempDir(), "release"), first.Commit, date
	second, err := release.Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Images) != len(first.Images) {
		t.Fatalf("%d images from %s, %d from %s", len(first.Images), root, len(second.Images), copyRoot)
	}
	for i, im := range first.Images {
		if d := second.Images[i].Digest; d != im.Digest {
			t.Errorf("image %s: index digest %s from %s, %s from %s", im.Name, im.Digest, root, d, copyRoot)
		}
	}
	if second.Chart.SHA256 != first.Chart.SHA256 || second.Chart.OCIDigest != first.Chart.OCIDigest {
		t.Errorf("chart package sha256 %s (OCI %s) from %s, %s (OCI %s) from %s",
			first.Chart.SHA256, first.Chart.OCIDigest, root, second.Chart.SHA256, second.Chart.OCIDigest, copyRoot)
	}
	want, got := fileSums(t, firstOut), fileSums(t, cfg.Out)
	var differ []string
	for rel, sum := range want {
		if got[rel] != sum {
			differ = append(differ, rel)
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			differ = append(differ, rel+" (only in the second)")
		}
	}
	slices.Sort(differ)
	if len(differ) > 0 {
		t.Errorf("%d files differ between the release built from %s (%d files) and from %s: %s",
			len(differ), root, len(want), copyRoot, strings.Join(differ, ", "))
	}
	for _, rel := range []string{"SHA256SUMS", "release.json"} {
		if _, ok := want[rel]; !ok {
			t.Errorf("the release has no %s", rel)
		}
	}
}

// fileSums maps every file under dir (slash-separated, relative) to its sha256.
func fileSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		s := sha256.Sum256(data)
		sums[filepath.ToSlash(rel)] = hex.EncodeToString(s[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sums
}
