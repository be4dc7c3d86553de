package deployments_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// workflow is what TestWorkflowsKeepWritesToTagPushes reads of a GitHub
// Actions workflow.
type workflow struct {
	On          map[string]any `json:"on"`
	True        map[string]any `json:"true"` // YAML 1.1 reads the key on as true
	Permissions any            `json:"permissions"`
	Jobs        map[string]struct {
		Permissions any `json:"permissions"`
	} `json:"jobs"`
}

// writes lists the write permissions a permissions block grants
// ("write-all" as such).
func writes(p any) []string {
	switch v := p.(type) {
	case string:
		if v == "write-all" {
			return []string{"write-all"}
		}
	case map[string]any:
		var out []string
		for k, s := range v {
			if s == "write" {
				out = append(out, k)
			}
		}
		slices.Sort(out)
		return out
	}
	return nil
}

// TestWorkflowsKeepWritesToTagPushes: no workflow runs on
// pull_request_target or workflow_run (a pull request's code next to the
// repository's secrets and a write token), and a workflow whose jobs may
// write (packages, id-token, contents...) runs only on pushed tags, so no
// pull request and no branch push gets a token that pushes images or signs
// as the repository; a job without a permissions block is refused there
// (it would get the repository's default token).
func TestWorkflowsKeepWritesToTagPushes(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", ".github", "workflows", "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no workflows found (%v)", err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var w workflow
		if err := yaml.Unmarshal(raw, &w); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		on := w.On
		if on == nil {
			on = w.True
		}
		if len(on) == 0 {
			t.Errorf("%s: no triggers read (the test reads on: as a map)", f)
		}
		for _, bad := range []string{"pull_request_target", "workflow_run"} {
			if _, ok := on[bad]; ok {
				t.Errorf("%s runs on %s", f, bad)
			}
		}
		var granted []string
		granted = append(granted, writes(w.Permissions)...)
		for name, j := range w.Jobs {
			g := writes(j.Permissions)
			if j.Permissions == nil && w.Permissions == nil {
				g = []string{"the default token (job " + name + " has no permissions block)"}
			}
			granted = append(granted, g...)
		}
		if len(granted) == 0 {
			continue
		}
		push, _ := on["push"].(map[string]any)
		if len(on) != 1 || push == nil || push["tags"] == nil || push["branches"] != nil {
			t.Errorf("%s grants %v but runs on %v: want only pushed tags", f, granted, on)
		}
	}
}

// TestReleaseNotesVerifyTheReleaseWorkflow: the cosign verify command the
// release notes give pins the signer to this repository's release workflow
// at a tag (GITHUB_WORKFLOW_REF: owner/repo/.github/workflows/release.yml@refs/tags/v...),
// the identity of the keyless certificate the publish job gets. A regexp
// over https://github.com/<repo>/ also accepted a signature made by any
// workflow of any branch of the repository (a branch pushed by anyone with
// write access may add one asking id-token: write).
func TestReleaseNotesVerifyTheReleaseWorkflow(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`--certificate-identity[ =]"?https://github\.com/\$\{?GITHUB_WORKFLOW_REF\}?"?\s`)
	found := 0
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, "cosign verify") {
			continue
		}
		found++
		if strings.Contains(line, "certificate-identity-regexp") || !want.MatchString(line) {
			t.Errorf("release notes' verify command does not pin the release workflow at its tag (want --certificate-identity https://github.com/$GITHUB_WORKFLOW_REF):\n%s", strings.TrimSpace(line))
		}
	}
	if found == 0 {
		t.Error("release.yml gives no cosign verify command")
	}
}

// TestReleaseTagsImagesOnceSigned: the publish job pushes each image by
// digest and gives it the version tag only after every image is signed and
// attested, so a run that fails in between (cosign, Fulcio, Rekor down)
// leaves no version tag on an unsigned image; re-running the job pushes,
// signs and tags again. It pushed to the version tag first.
func TestReleaseTagsImagesOnceSigned(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	lastSign, firstTag := -1, -1
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "crane push "):
			if !strings.HasSuffix(line, `@$digest"`) {
				t.Errorf("line %d pushes an image to a tag, not by digest: %s", i+1, line)
			}
		case strings.HasPrefix(line, "cosign sign ") && strings.Contains(line, "$REGISTRY/$c@"),
			strings.HasPrefix(line, "cosign attest "):
			lastSign = i
		case strings.HasPrefix(line, "crane tag "):
			if firstTag < 0 {
				firstTag = i
			}
		}
	}
	if lastSign < 0 || firstTag < 0 || firstTag < lastSign {
		t.Errorf("images' last signature or attestation at line %d, first crane tag at line %d: want the tags after every signature", lastSign+1, firstTag+1)
	}
}
