package images

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The test bed's image names. The component images carry the names the
// chart asks for at its appVersion, and the pause image the name containerd
// (its sandbox) and the chart (reservation pods) ask for, so nothing is
// pulled: the node has each under that name before any pod needs it
// (imagePullPolicy IfNotPresent).
const (
	PauseRef    = "registry.k8s.io/pause:3.10"
	WorkloadRef = "gpufrac.test/workload:dev"
	// WorkloadPath is the workload program in its image.
	WorkloadPath = "/usr/bin/workload"
)

// ComponentRef is the chart's default image name for a component at version.
func ComponentRef(component, version string) string {
	return "ghcr.io/gpufrac/" + component + ":" + version
}

// Built is one image written by Testbed.
type Built struct {
	Ref    string
	Tar    string
	Digest v1.Hash
}

// Testbed writes the test bed's images into outDir: the pause image, the
// workload image, and gpufrac-node and gpufrac-coordinator from their
// Dockerfiles, tagged version (the chart's appVersion). Each component is
// built as its Dockerfile's build stage builds it (the same make target and
// flags, into outDir); the pause and workload programs are built static. All
// from the repository at repoRoot.
func Testbed(ctx context.Context, repoRoot, outDir, version string) ([]Built, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	// The Dockerfiles' RUN lines (deployments/images/*/Dockerfile).
	for _, target := range [][]string{
		{"build-node"},
		{"build-static", "STATIC_CMDS=gpufrac-coordinator"},
	} {
		if err := runMake(ctx, repoRoot, append(target, "BIN="+outDir, "VERSION="+version)...); err != nil {
			return nil, err
		}
	}
	binDir := outDir
	progs := map[string]string{}
	for _, p := range []string{"pause", "workload"} {
		out := filepath.Join(outDir, p)
		if err := BuildStatic(ctx, repoRoot, "./tests/images/"+p, out); err != nil {
			return nil, err
		}
		progs[p] = out
	}
	specs := []Spec{
		{Ref: PauseRef, Layers: [][]File{{{Src: progs["pause"], Dst: "/pause", Mode: 0o755}}},
			Config: v1.Config{Entrypoint: []string{"/pause"}}},
		{Ref: WorkloadRef, Layers: [][]File{{{Src: progs["workload"], Dst: WorkloadPath, Mode: 0o755}}},
			Config: v1.Config{Entrypoint: []string{WorkloadPath}}},
	}
	for _, c := range []string{"gpufrac-node", "gpufrac-coordinator"} {
		s, err := FromDockerfile(filepath.Join(repoRoot, "deployments/images", c, "Dockerfile"), binDir,
			ComponentRef(c, version), map[string]string{"VERSION": version})
		if err != nil {
			return nil, err
		}
		specs = append(specs, s)
	}
	var built []Built
	for _, s := range specs {
		tar := filepath.Join(outDir, filepath.Base(refName(s.Ref))+".tar")
		d, err := Write(s, tar)
		if err != nil {
			return nil, err
		}
		built = append(built, Built{Ref: s.Ref, Tar: tar, Digest: d})
	}
	return built, nil
}

// BuildStatic builds the Go main package pkg of the repository at repoRoot
// into out, without cgo (a static binary, nothing else in its image).
func BuildStatic(ctx context.Context, repoRoot, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v: %s", pkg, err, b)
	}
	return nil
}

// runMake runs make in repoRoot.
func runMake(ctx context.Context, repoRoot string, args ...string) error {
	cmd := exec.CommandContext(ctx, "make", append([]string{"--no-print-directory", "-s"}, args...)...)
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("make %v: %v: %s", args, err, b)
	}
	return nil
}

// refName is the repository part of a reference ("registry.k8s.io/pause").
func refName(ref string) string {
	for i := len(ref) - 1; i >= 0 && ref[i] != '/'; i-- {
		if ref[i] == ':' {
			return ref[:i]
		}
	}
	return ref
}
