package images

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Dockerfile is what an image's Dockerfile says of its final stage.
type Dockerfile struct {
	// BaseImage is the final stage's FROM, its ARG default resolved.
	BaseImage string
	// Copies maps a file of the build stage's output (the name under /out)
	// to its path in the image.
	Copies map[string]string
	// Config is the run configuration: Entrypoint, Env, User and Labels.
	Config v1.Config
}

var argRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// ParseDockerfile reads the final stage of the Dockerfile at path, with
// buildArgs (e.g. VERSION) overriding the ARG defaults. It knows the
// instructions gpufrac's Dockerfiles use in their final stage: FROM, ARG,
// LABEL, ENV, COPY --from=<stage> /out/<file> <dst>, USER and ENTRYPOINT in
// its JSON form; any other instruction there is an error, so a Dockerfile
// that grows one fails here instead of building a different image.
func ParseDockerfile(path string, buildArgs map[string]string) (*Dockerfile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := joinContinuations(raw)
	args := map[string]string{} // global ARGs (before the first FROM), then the stage's
	global := true
	var final []string
	for _, l := range lines {
		word, rest, _ := strings.Cut(l, " ")
		switch strings.ToUpper(word) {
		case "FROM":
			global = false
			final = []string{l}
			continue
		case "ARG":
			k, v, hasDefault := strings.Cut(strings.TrimSpace(rest), "=")
			if global {
				if o, ok := buildArgs[k]; ok {
					v = o
				} else if !hasDefault {
					v = ""
				}
				args[k] = v
				continue
			}
		}
		if !global {
			final = append(final, l)
		}
	}
	if len(final) == 0 {
		return nil, fmt.Errorf("%s: no FROM: %w", path, ErrNotFound)
	}
	expand := func(s string, stage map[string]string) string {
		return argRef.ReplaceAllStringFunc(s, func(m string) string {
			k := strings.Trim(m, "${}")
			if v, ok := stage[k]; ok {
				return v
			}
			return args[k]
		})
	}
	d := &Dockerfile{Copies: map[string]string{}, Config: v1.Config{Labels: map[string]string{}}}
	stage := map[string]string{}
	for _, l := range final {
		word, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(word) {
		case "FROM":
			d.BaseImage = expand(strings.Fields(rest)[0], stage)
		case "ARG":
			// A stage's ARG without a default brings a global one (or a build arg) in.
			k, v, hasDefault := strings.Cut(rest, "=")
			if o, ok := buildArgs[k]; ok {
				v = o
			} else if !hasDefault {
				v = args[k]
			}
			stage[k] = v
		case "LABEL", "ENV":
			pairs, err := keyValues(expand(rest, stage))
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, word, err)
			}
			for _, kv := range pairs {
				if strings.EqualFold(word, "LABEL") {
					d.Config.Labels[kv[0]] = kv[1]
				} else {
					d.Config.Env = append(d.Config.Env, kv[0]+"="+kv[1])
				}
			}
		case "COPY":
			f := strings.Fields(rest)
			if len(f) != 3 || !strings.HasPrefix(f[0], "--from=") || !strings.HasPrefix(f[1], "/out/") {
				return nil, fmt.Errorf("%s: COPY %s: want COPY --from=<stage> /out/<file> <dst>", path, rest)
			}
			d.Copies[strings.TrimPrefix(f[1], "/out/")] = f[2]
		case "USER":
			d.Config.User = expand(rest, stage)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.Config.Entrypoint); err != nil {
				return nil, fmt.Errorf("%s: ENTRYPOINT must be JSON: %w", path, err)
			}
		default:
			return nil, fmt.Errorf("%s: final stage instruction %s is not known to tests/images", path, word)
		}
	}
	if len(d.Config.Entrypoint) == 0 {
		return nil, fmt.Errorf("%s: final stage has no ENTRYPOINT: %w", path, ErrNotFound)
	}
	return d, nil
}

// joinContinuations returns the Dockerfile's instructions, one per line:
// comments and blank lines dropped, backslash continuations joined.
func joinContinuations(raw []byte) []string {
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(l)
		out = append(out, strings.Join(strings.Fields(cur.String()), " "))
		cur.Reset()
	}
	return out
}

// keyValues splits `k1="v 1" k2=v2` into pairs.
func keyValues(s string) ([][2]string, error) {
	var out [][2]string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || strings.ContainsAny(k, " \"") {
			return nil, fmt.Errorf("want key=value at %q", s)
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				return nil, fmt.Errorf("unterminated quote at %q", s)
			}
			v, s = rest[1:end+1], rest[end+2:]
		} else {
			v, s, _ = strings.Cut(rest, " ")
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// FromDockerfile is the Spec of a component image for this machine's
// architecture: the base files its Dockerfile's BASE_IMAGE would give the
// binaries (BaseFiles), then the binaries from binDir at the Dockerfile's
// paths, with its run configuration.
func FromDockerfile(dockerfile, binDir, ref string, buildArgs map[string]string) (Spec, error) {
	return FromDockerfileFor(dockerfile, binDir, ref, buildArgs, runtime.GOARCH)
}

// FromDockerfileFor is FromDockerfile for linux/<arch>: the binaries in
// binDir are built for arch, and for another architecture than this
// machine's the base layer's C library comes from its cross packages
// (CrossBaseFiles).
func FromDockerfileFor(dockerfile, binDir, ref string, buildArgs map[string]string, arch string) (Spec, error) {
	d, err := ParseDockerfile(dockerfile, buildArgs)
	if err != nil {
		return Spec{}, err
	}
	var app []File
	var bins []string
	for src, dst := range d.Copies {
		p := filepath.Join(binDir, src)
		app = append(app, File{Src: p, Dst: dst, Mode: 0o755})
		bins = append(bins, p)
	}
	sort.Slice(app, func(i, j int) bool { return app[i].Dst < app[j].Dst })
	var base []File
	if arch == runtime.GOARCH {
		base, err = BaseFiles(d.BaseImage, bins)
	} else {
		base, err = CrossBaseFiles(d.BaseImage, bins, arch)
	}
	if err != nil {
		return Spec{}, fmt.Errorf("%s: %w", dockerfile, err)
	}
	return Spec{Ref: ref, Layers: [][]File{base, app}, Config: d.Config, Arch: arch}, nil
}

// baseUsers are the users and groups of a distroless base image.
func baseUsers() []File {
	return []File{
		{Dst: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Dst: "/etc/group", Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
	}
}

func hasLibc(baseImage string) bool {
	return strings.Contains(baseImage, "base-debian") || strings.Contains(baseImage, "cc-debian")
}

// BaseFiles is the part of a distroless base image the binaries need: its
// users and groups (root, nonroot 65532, nobody) and, for a binary linked
// against the C library (base-debian12 holds glibc), the libraries and
// loader ldd names, copied from this machine (Debian 12, the glibc of
// base-debian12). A static binary needs nothing more (static-debian12).
func BaseFiles(baseImage string, binaries []string) ([]File, error) {
	files := baseUsers()
	libs := map[string]bool{}
	for _, b := range binaries {
		deps, err := sharedLibraries(b)
		if err != nil {
			return nil, err
		}
		if len(deps) > 0 && !hasLibc(baseImage) {
			return nil, fmt.Errorf("%s links %v but the base image %s has no C library", b, deps, baseImage)
		}
		for _, d := range deps {
			libs[d] = true
		}
	}
	for _, l := range sortedKeys(libs) {
		files = append(files, File{Src: l, Dst: l, Mode: 0o755})
	}
	return files, nil
}

// sharedLibraries lists the absolute paths of the shared objects a dynamic
// binary loads (ldd), none for a static one.
func sharedLibraries(binary string) ([]string, error) {
	out, err := exec.Command("ldd", binary).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", binary, err, out)
	}
	var libs []string
	for _, l := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(l) {
			if strings.HasPrefix(f, "/") {
				libs = append(libs, f)
				break
			}
		}
	}
	return libs, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
