package deployments_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The machine and CI have no container runtime: these tests check what can
// be checked without one. Each Dockerfile builds through a Makefile target
// (so its flags are the Makefile's), copies only files that exist and that
// .dockerignore lets through, copies every package its command needs, and the
// binary that target builds is what the Dockerfile claims: static for the
// coordinator, dynamically linked against glibc only (no newer than the
// runtime base's) for gpufrac-node, stamped with the version asked for.

// image describes what a Dockerfile must produce.
type image struct {
	name string // the command and the directory under deployments/images
	// static: no ELF interpreter and no shared library (distroless/static).
	static bool
	// base is a substring the final stage's base image must contain.
	base string
	// nonRoot: the final stage sets a numeric non-root USER.
	nonRoot bool
}

var images = []image{
	{name: "gpufrac-node", static: false, base: "distroless/base-debian12"},
	{name: "gpufrac-coordinator", static: true, base: "distroless/static-debian12", nonRoot: true},
}

// glibcOfBase is the glibc of the gpufrac-node image's runtime base
// (distroless/base-debian12 is Debian 12: glibc 2.36); the binary may not
// need a newer symbol version.
const glibcOfBase = "2.36"

// versionPkg is where -X stamps the version.
const versionPkg = "github.com/gpufrac/gpufrac/cmd/internal/version.version"

// dockerfile is the part of a Dockerfile these tests read.
type dockerfile struct {
	froms  []string   // base image of each stage, ARG defaults substituted
	copies [][]string // sources of each COPY without --from, in order
	runs   []string   // RUN commands
	users  []string   // USER of the final stage
	args   map[string]string
}

// parseDockerfile reads the instructions these tests check; continuation
// lines are joined.
func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	df := dockerfile{args: map[string]string{}}
	var lines []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if rest, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(l)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		fields := strings.Fields(rest)
		switch strings.ToUpper(instr) {
		case "ARG":
			if k, v, ok := strings.Cut(rest, "="); ok {
				df.args[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		case "FROM":
			from := fields[0]
			for k, v := range df.args {
				from = strings.ReplaceAll(from, "${"+k+"}", v)
			}
			df.froms = append(df.froms, from)
			df.users = nil
		case "COPY":
			if strings.HasPrefix(fields[0], "--from") {
				continue
			}
			df.copies = append(df.copies, fields[:len(fields)-1])
		case "RUN":
			df.runs = append(df.runs, rest)
		case "USER":
			df.users = append(df.users, rest)
		}
	}
	return df
}

// repoRoot is the repository root (this package is deployments/).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root: %v", err)
	}
	return root
}

// makeTarget returns the Makefile target and variables of the RUN make line.
func makeTarget(t *testing.T, df dockerfile) (target string, vars []string) {
	t.Helper()
	var found []string
	for _, r := range df.runs {
		if f := strings.Fields(r); len(f) > 1 && f[0] == "make" {
			found = f[1:]
		}
	}
	if found == nil {
		t.Fatal("no RUN make <target>: the image must build through the Makefile so its flags are the Makefile's")
	}
	for _, f := range found {
		switch {
		case strings.HasPrefix(f, "${VERSION:+"):
			// The optional VERSION=$VERSION; the test sets its own.
		case strings.Contains(f, "="):
			if !strings.HasPrefix(f, "BIN=") {
				vars = append(vars, f)
			}
		default:
			if target != "" {
				t.Fatalf("RUN make names two targets: %q and %q", target, f)
			}
			target = f
		}
	}
	return target, vars
}

func TestDockerfiles(t *testing.T) {
	root := repoRoot(t)
	allowed := dockerignoreAllowed(t, root)
	for _, img := range images {
		t.Run(img.name, func(t *testing.T) {
			df := parseDockerfile(t, filepath.Join(root, "deployments", "images", img.name, "Dockerfile"))
			if len(df.froms) < 2 {
				t.Fatalf("want a multi-stage build (builder, runtime), got stages %v", df.froms)
			}

			// 1. The builder's Go is at least go.mod's (the Makefile sets GOTOOLCHAIN=local).
			checkBuilderGo(t, root, df.froms[0])

			// 2. The runtime base and user.
			final := df.froms[len(df.froms)-1]
			if !strings.Contains(final, img.base) {
				t.Errorf("final stage FROM %s, want a %s base", final, img.base)
			}
			if img.nonRoot {
				if len(df.users) == 0 {
					t.Error("final stage sets no USER; the image must run as non-root")
				}
				for _, u := range df.users {
					uid, _, _ := strings.Cut(u, ":")
					if n, err := strconv.Atoi(uid); err != nil || n == 0 {
						t.Errorf("USER %s: want a numeric non-root UID (runAsNonRoot needs a number)", u)
					}
				}
			}

			// 3. Every COPY source exists and passes .dockerignore.
			var copied []string
			for _, srcs := range df.copies {
				for _, src := range srcs {
					if _, err := os.Stat(filepath.Join(root, src)); err != nil {
						t.Errorf("COPY %s: %v", src, err)
					}
					if !allowed(src) {
						t.Errorf("COPY %s: .dockerignore keeps it out of the build context", src)
					}
					copied = append(copied, strings.TrimSuffix(src, "/"))
				}
			}

			// 4. Every package of the module the command needs is copied.
			out := goCmd(t, root, "list", "-deps", "-f", "{{if .Module}}{{if eq .Module.Path \"github.com/gpufrac/gpufrac\"}}{{.Dir}}{{end}}{{end}}", "./cmd/"+img.name)
			for _, dir := range strings.Fields(out) {
				rel, _ := filepath.Rel(root, dir)
				if !slices.ContainsFunc(copied, func(c string) bool { return rel == c || strings.HasPrefix(rel, c+"/") }) {
					t.Errorf("%s needs package directory %s, which no COPY line brings in", img.name, rel)
				}
			}

			// 5. The RUN make target builds the command with the version stamped,
			// and its binary is linked as claimed.
			target, vars := makeTarget(t, df)
			bin := t.TempDir()
			const version = "9.8.7-test"
			args := append([]string{"-s", "-C", root, target, "BIN=" + bin, "VERSION=" + version}, vars...)
			dry := runMake(t, append([]string{"-n"}, args...)...)
			if !strings.Contains(dry, "-X "+versionPkg+"="+version) {
				t.Errorf("make %s does not stamp the version: %s", target, dry)
			}
			if wantCgo := map[bool]string{true: "CGO_ENABLED=0", false: "CGO_ENABLED=1"}[img.static]; !strings.Contains(dry, wantCgo) {
				t.Errorf("make %s builds without %s: %s", target, wantCgo, dry)
			}
			// The release dry run builds through this target too, from any
			// checkout path: the binary must not carry the path or git's state
			// (docs/release.md, "Reproducible").
			for _, flag := range []string{"-trimpath", "-buildvcs=false"} {
				if !strings.Contains(dry, " "+flag+" ") {
					t.Errorf("make %s builds without %s: %s", target, flag, dry)
				}
			}
			if testing.Short() {
				return
			}
			runMake(t, args...)
			path := filepath.Join(bin, img.name)
			checkELF(t, path, img.static)
			v, err := exec.Command(path, "--version").Output()
			if err != nil {
				t.Fatalf("%s --version: %v", img.name, err)
			}
			if got, want := strings.TrimSpace(string(v)), img.name+" "+version; got != want {
				t.Errorf("%s --version = %q, want %q", img.name, got, want)
			}
		})
	}
}

// checkBuilderGo checks the builder image's Go version against go.mod.
func checkBuilderGo(t *testing.T, root, from string) {
	t.Helper()
	m := regexp.MustCompile(`^golang:(\d+\.\d+)`).FindStringSubmatch(from)
	if m == nil {
		t.Fatalf("builder stage FROM %s: want an official golang:<version> image", from)
	}
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	gomod := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(data)
	if gomod == nil {
		t.Fatal("go.mod has no go line")
	}
	if versionLess(m[1], string(gomod[1])) {
		t.Errorf("builder Go %s is older than go.mod's go %s", m[1], gomod[1])
	}
}

// checkELF checks how a binary is linked.
func checkELF(t *testing.T, path string, static bool) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	interp := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if static {
		if interp || len(libs) > 0 {
			t.Errorf("%s: want a static binary, got interpreter=%v libraries=%v", path, interp, libs)
		}
		return
	}
	if !interp {
		t.Errorf("%s: want a dynamically linked binary (cgo, for NVML's dlopen), got no ELF interpreter", path)
	}
	// glibc's own libraries only: libnvidia-ml is dlopened at run time, never linked.
	glibc := []string{"libc.so.6", "libpthread.so.0", "libdl.so.2", "libm.so.6", "libresolv.so.2"}
	for _, l := range libs {
		if !slices.Contains(glibc, l) {
			t.Errorf("%s links %s; the runtime image has only glibc", path, l)
		}
	}
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if v, ok := strings.CutPrefix(s.Version, "GLIBC_"); ok && versionLess(glibcOfBase, v) {
			t.Errorf("%s needs %s@GLIBC_%s, newer than the runtime base's glibc %s", path, s.Name, v, glibcOfBase)
		}
	}
}

// versionLess compares dotted numeric versions.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// dockerignoreAllowed reads the allowlist .dockerignore ("*", then "!path"
// lines) and tells whether a path is in the build context.
func dockerignoreAllowed(t *testing.T, root string) func(string) bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var lines, allow []string
	for l := range strings.SplitSeq(string(data), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 || lines[0] != "*" {
		t.Fatalf(".dockerignore must start with * and allow what the images copy, got %q", lines)
	}
	for _, l := range lines[1:] {
		if p, ok := strings.CutPrefix(l, "!"); ok {
			allow = append(allow, strings.TrimSuffix(p, "/"))
		}
	}
	return func(src string) bool {
		src = strings.TrimSuffix(src, "/")
		return slices.ContainsFunc(allow, func(a string) bool { return src == a || strings.HasPrefix(src, a+"/") })
	}
}

func TestVersionIsTheChartsAppVersion(t *testing.T) {
	root := repoRoot(t)
	app := chartAppVersion(t, root)
	out := runMake(t, "-s", "-n", "-C", root, "build-node", "BIN="+t.TempDir())
	if !strings.Contains(out, "-X "+versionPkg+"="+app+"'") {
		t.Errorf("make build does not stamp the chart's appVersion %s: %s", app, out)
	}
}

func TestMakeImages(t *testing.T) {
	root := repoRoot(t)
	app := chartAppVersion(t, root)
	// A PATH with what make's recipe needs (sh, sed) and no image builder.
	path := t.TempDir()
	for _, tool := range []string{"sh", "sed"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(path, tool)); err != nil {
			t.Fatal(err)
		}
	}
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("no builder", func(t *testing.T) {
		cmd := exec.Command(makeBin, "-s", "-C", root, "images")
		cmd.Env = append(os.Environ(), "PATH="+path)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("make images succeeded without any builder:\n%s", out)
		}
		if !strings.Contains(string(out), "no OCI image builder found: looked for docker, podman and buildah") {
			t.Errorf("make images without a builder says:\n%s", out)
		}
	})

	t.Run("podman found", func(t *testing.T) {
		// A fake podman that records its arguments.
		dir := t.TempDir()
		for _, f := range []string{"sh", "sed"} {
			if err := os.Symlink(filepath.Join(path, f), filepath.Join(dir, f)); err != nil {
				t.Fatal(err)
			}
		}
		log := filepath.Join(t.TempDir(), "calls")
		script := fmt.Sprintf("#!%s\necho \"$@\" >> %s\n", filepath.Join(path, "sh"), log)
		if err := os.WriteFile(filepath.Join(dir, "podman"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(makeBin, "-s", "-C", root, "images")
		cmd.Env = append(os.Environ(), "PATH="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make images: %v\n%s", err, out)
		}
		data, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, img := range images {
			want = append(want, fmt.Sprintf("build -f deployments/images/%s/Dockerfile --build-arg VERSION=%s -t ghcr.io/gpufrac/%s:%s %s",
				img.name, app, img.name, app, root))
		}
		if got := strings.Split(strings.TrimSpace(string(data)), "\n"); !slices.Equal(got, want) {
			t.Errorf("podman calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// chartAppVersion reads the chart's appVersion.
func chartAppVersion(t testing.TB, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "deployments", "helm", "gpufrac", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	return string(m[1])
}

// runMake runs make and returns its output.
func runMake(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("make", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// goCmd runs the go command in dir.
func goCmd(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}
