package deployments_test

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// krewPlugin is the part of krew's Plugin (v1alpha2) this project writes;
// the manifest is read strictly, so a misspelt field fails.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string         `json:"version"`
		Homepage         string         `json:"homepage"`
		ShortDescription string         `json:"shortDescription"`
		Description      string         `json:"description"`
		Caveats          string         `json:"caveats"`
		Platforms        []krewPlatform `json:"platforms"`
	} `json:"spec"`
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string `json:"uri"`
	SHA256 string `json:"sha256"`
	Bin    string `json:"bin"`
	Files  []struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"files"`
}

// krewPlatforms reads the platforms make krew builds.
func krewPlatforms(t *testing.T, root string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "deployments", "krew", "krew.mk"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KREW_PLATFORMS \?= (.+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("krew.mk sets no KREW_PLATFORMS")
	}
	return strings.Fields(string(m[1]))
}

// TestKrewManifest checks deployments/krew/gpufrac.yaml against krew's rules
// for a plugin manifest, the chart's version and make krew's archives.
func TestKrewManifest(t *testing.T) {
	root := repoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "deployments", "krew", "gpufrac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		t.Fatalf("the manifest is not a krew Plugin: %v", err)
	}
	version := "v" + chartAppVersion(t, root)
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" {
		t.Errorf("apiVersion/kind = %s/%s", p.APIVersion, p.Kind)
	}
	// The plugin's name is what `kubectl <name>` runs: kubectl-gpufrac.
	if p.Metadata.Name != "gpufrac" {
		t.Errorf("name %q, want gpufrac", p.Metadata.Name)
	}
	if p.Spec.Version != version {
		t.Errorf("version %s, want %s (the chart's appVersion)", p.Spec.Version, version)
	}
	if !strings.HasPrefix(p.Spec.Homepage, "https://") {
		t.Errorf("homepage %q is not an https URL", p.Spec.Homepage)
	}
	// krew-index's rules: a short description of at most 50 characters, and a description.
	if n := len(p.Spec.ShortDescription); n == 0 || n > 50 {
		t.Errorf("shortDescription has %d characters, want 1..50", n)
	}
	if len(strings.TrimSpace(p.Spec.Description)) < 50 {
		t.Error("description is missing or too short")
	}
	sha := regexp.MustCompile(`^[0-9a-f]{64}$`)
	var got []string
	for _, pl := range p.Spec.Platforms {
		os, arch := pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]
		got = append(got, os+"/"+arch)
		want := fmt.Sprintf("https://github.com/gpufrac/gpufrac/releases/download/%s/kubectl-gpufrac_%s_%s_%s.tar.gz", version, version, os, arch)
		if pl.URI != want {
			t.Errorf("%s/%s: uri %s, want %s (what make krew names it)", os, arch, pl.URI, want)
		}
		if !sha.MatchString(pl.SHA256) {
			t.Errorf("%s/%s: sha256 %q is not 64 lowercase hex digits", os, arch, pl.SHA256)
		}
		if pl.Bin != "kubectl-gpufrac" {
			t.Errorf("%s/%s: bin %q, want kubectl-gpufrac", os, arch, pl.Bin)
		}
		var from []string
		for _, f := range pl.Files {
			from = append(from, f.From)
			if f.To != "." {
				t.Errorf("%s/%s: file %s goes to %q, want .", os, arch, f.From, f.To)
			}
		}
		if !slices.Equal(from, []string{"kubectl-gpufrac", "LICENSE"}) {
			t.Errorf("%s/%s: files %v, want kubectl-gpufrac and LICENSE", os, arch, from)
		}
	}
	if want := krewPlatforms(t, root); !slices.Equal(got, want) {
		t.Errorf("platforms %v, want those make krew builds: %v", got, want)
	}
}

// TestKrewArchive builds the linux/amd64 archive with make krew and checks
// it holds what the manifest installs, the binary stamped with the version.
func TestKrewArchive(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kubectl-gpufrac")
	}
	root := repoRoot(t)
	dir := t.TempDir()
	out := runMake(t, "-s", "-C", root, "krew", "KREW_PLATFORMS=linux/amd64", "KREW_DIR="+dir)
	version := chartAppVersion(t, root)
	name := fmt.Sprintf("kubectl-gpufrac_v%s_linux_amd64.tar.gz", version)
	if !regexp.MustCompile(`(?m)^[0-9a-f]{64}  ` + regexp.QuoteMeta(name) + `$`).MatchString(out) {
		t.Errorf("make krew printed %q, want the archive's sha256 and name", out)
	}
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var files []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, h.Name)
		if h.Name == "kubectl-gpufrac" {
			if h.Mode&0o111 == 0 {
				t.Errorf("kubectl-gpufrac is not executable in the archive (mode %o)", h.Mode)
			}
			bin := filepath.Join(t.TempDir(), "kubectl-gpufrac")
			w, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(w, tr); err != nil {
				t.Fatal(err)
			}
			w.Close()
			v, err := exec.Command(bin, "--version").Output()
			if err != nil || strings.TrimSpace(string(v)) != "kubectl-gpufrac "+version {
				t.Errorf("kubectl-gpufrac --version = %q (%v), want kubectl-gpufrac %s", v, err, version)
			}
		}
	}
	slices.Sort(files)
	if !slices.Equal(files, []string{"LICENSE", "kubectl-gpufrac"}) {
		t.Errorf("archive holds %v, want LICENSE and kubectl-gpufrac", files)
	}
}
