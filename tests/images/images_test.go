package images

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func TestParseComponentDockerfiles(t *testing.T) {
	root := repoRoot(t)
	tests := []struct {
		component string
		base      string
		user      string
		env       []string
	}{
		{"gpufrac-node", "gcr.io/distroless/base-debian12", "", []string{"NVIDIA_DISABLE_REQUIRE=true"}},
		{"gpufrac-coordinator", "gcr.io/distroless/static-debian12:nonroot", "65532:65532", nil},
	}
	for _, tc := range tests {
		t.Run(tc.component, func(t *testing.T) {
			d, err := ParseDockerfile(filepath.Join(root, "deployments/images", tc.component, "Dockerfile"), map[string]string{"VERSION": "9.9.9"})
			if err != nil {
				t.Fatal(err)
			}
			if d.BaseImage != tc.base {
				t.Errorf("base %q, want %q", d.BaseImage, tc.base)
			}
			want := map[string]string{tc.component: "/usr/bin/" + tc.component}
			if !reflect.DeepEqual(d.Copies, want) {
				t.Errorf("copies %v, want %v", d.Copies, want)
			}
			if got := d.Config.Entrypoint; !reflect.DeepEqual(got, []string{"/usr/bin/" + tc.component}) {
				t.Errorf("entrypoint %v", got)
			}
			if d.Config.User != tc.user || !reflect.DeepEqual(d.Config.Env, tc.env) {
				t.Errorf("user %q env %v, want %q %v", d.Config.User, d.Config.Env, tc.user, tc.env)
			}
			if v := d.Config.Labels["org.opencontainers.image.version"]; v != "9.9.9" {
				t.Errorf("version label %q, want the build arg", v)
			}
			if v := d.Config.Labels["org.opencontainers.image.title"]; v != tc.component {
				t.Errorf("title label %q", v)
			}
		})
	}
}

func TestParseDockerfileRefusesWhatItCannotBuild(t *testing.T) {
	for name, content := range map[string]string{
		"unknown instruction": "FROM a AS build\nFROM scratch\nRUN echo\nENTRYPOINT [\"/x\"]\n",
		"shell entrypoint":    "FROM scratch\nENTRYPOINT /x\n",
		"copy from context":   "FROM scratch\nCOPY x /x\nENTRYPOINT [\"/x\"]\n",
		"no entrypoint":       "FROM scratch\nCOPY --from=b /out/x /x\n",
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "Dockerfile")
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ParseDockerfile(p, nil)
			if err == nil {
				t.Fatal("parsed")
			}
			if name == "no entrypoint" && !errors.Is(err, ErrNotFound) {
				t.Errorf("error %v, want ErrNotFound", err)
			}
		})
	}
}

// layerFiles reads an image tarball back: path -> mode and content, over all layers.
func imageFiles(t *testing.T, tarPath string) map[string]string {
	t.Helper()
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, _ := io.ReadAll(tr)
		files["/"+h.Name] = string(b)
		if h.ModTime.Unix() != 0 || h.Uid != 0 {
			t.Errorf("%s: time %v uid %d, want the epoch and root", h.Name, h.ModTime, h.Uid)
		}
	}
	return files
}

func TestWriteIsReproducibleAndHoldsTheFiles(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("not an ELF file"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := FromDockerfile(filepath.Join(repoRoot(t), "deployments/images/gpufrac-coordinator/Dockerfile"), dir, "example.test/c:1", nil)
	if err == nil {
		t.Fatal("built an image from a binary directory without gpufrac-coordinator")
	}
	if err := os.Rename(bin, filepath.Join(dir, "gpufrac-coordinator")); err != nil {
		t.Fatal(err)
	}
	spec, err = FromDockerfile(filepath.Join(repoRoot(t), "deployments/images/gpufrac-coordinator/Dockerfile"), dir, "example.test/c:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	da, err := Write(spec, a)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Write(spec, b)
	if err != nil {
		t.Fatal(err)
	}
	if da != db {
		t.Errorf("two builds of one spec: digests %s and %s", da, db)
	}
	files := imageFiles(t, a)
	if files["/usr/bin/gpufrac-coordinator"] != "not an ELF file" {
		t.Errorf("binary not at the Dockerfile's path: %v", keys(files))
	}
	if !strings.Contains(files["/etc/passwd"], "nonroot:x:65532:65532") {
		t.Errorf("no nonroot user for USER 65532: %q", files["/etc/passwd"])
	}
	img, err := tarball.ImageFromPath(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.OS != "linux" {
		t.Errorf("config user %q os %q", cf.Config.User, cf.OS)
	}
}

func TestBaseFilesCarryTheCLibraryOnlyWhereTheBaseHasOne(t *testing.T) {
	// The test binary itself links the C library when cgo is on; build a
	// small cgo-free and a dynamic one to be sure of both cases.
	ls, err := execLookPath("ls") // a dynamic binary every Debian has
	if err != nil {
		t.Skip("no ls on PATH")
	}
	files, err := BaseFiles("gcr.io/distroless/base-debian12", []string{ls})
	if err != nil {
		t.Fatal(err)
	}
	var libc bool
	for _, f := range files {
		if strings.Contains(f.Dst, "libc.so") {
			libc = true
		}
	}
	if !libc {
		t.Errorf("base files for %s lack libc: %v", ls, files)
	}
	if _, err := BaseFiles("gcr.io/distroless/static-debian12:nonroot", []string{ls}); err == nil {
		t.Error("a dynamic binary on a static base was accepted")
	}
}

func TestTestbedImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two programs")
	}
	root := repoRoot(t)
	built, err := Testbed(context.Background(), root, t.TempDir(), "1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	refs := map[string]string{}
	for _, b := range built {
		refs[b.Ref] = b.Tar
	}
	for _, want := range []string{PauseRef, WorkloadRef, ComponentRef("gpufrac-node", "1.2.3"), ComponentRef("gpufrac-coordinator", "1.2.3")} {
		if refs[want] == "" {
			t.Errorf("no image %s in %v", want, refs)
		}
	}
	if files := imageFiles(t, refs[WorkloadRef]); len(files) != 1 || files[WorkloadPath] == "" {
		t.Errorf("workload image holds %v, want only %s", keys(files), WorkloadPath)
	}
	node := imageFiles(t, refs[ComponentRef("gpufrac-node", "1.2.3")])
	if !strings.HasPrefix(node["/usr/bin/gpufrac-node"], "\x7fELF") || !slices.ContainsFunc(keys(node), func(p string) bool { return strings.Contains(p, "libc.so") }) {
		t.Errorf("node image holds %v, want the cgo binary and the C library", keys(node))
	}
	coord := imageFiles(t, refs[ComponentRef("gpufrac-coordinator", "1.2.3")])
	for p := range coord {
		if strings.Contains(p, ".so") {
			t.Errorf("the static coordinator's image holds a shared library: %s", p)
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func execLookPath(name string) (string, error) { return exec.LookPath(name) }
