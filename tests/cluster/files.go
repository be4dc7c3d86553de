package cluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// modulePath is gpufrac's module path, used to recognise the repository root.
const modulePath = "github.com/gpufrac/gpufrac"

// ErrToolsMissing is returned (wrapped, with the names) when a tool binary is missing
// from the bin directory.
var ErrToolsMissing = errors.New("tool binaries missing: run make tools")

// RepoRoot walks up from the working directory to the directory whose go.mod declares
// gpufrac's module (wrapper modules such as tests/tools/* are skipped).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && declaresModule(data, modulePath) {
			return dir, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("finding the repository root: %w", err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("finding the repository root: no go.mod declaring %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// declaresModule reports whether go.mod content declares the module path.
func declaresModule(gomod []byte, path string) bool {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == "module" && strings.Trim(fields[1], `"`) == path {
			return true
		}
	}
	return false
}

// toolFiles lists what `make tools` puts in the bin dir that a cluster with opts needs.
func toolFiles(opts Options) []string {
	files := []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "kwok-stages"}
	if opts.Karpenter != nil {
		files = append(files, "karpenter-kwok", "karpenter-crds")
	}
	if opts.Kueue != nil {
		files = append(files, "kueue", "kueue-manifests")
	}
	if opts.KubeRay != nil {
		files = append(files, kuberayOperator, "kuberay-crds")
	}
	return files
}

// checkTools fails with ErrToolsMissing when a binary or directory a cluster
// with opts needs is missing.
func checkTools(binDir string, opts Options) error {
	var missing []string
	for _, f := range toolFiles(opts) {
		if _, err := os.Stat(filepath.Join(binDir, f)); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s not in %s", ErrToolsMissing, strings.Join(missing, ", "), binDir)
	}
	return nil
}

// vmHWM reads a process's peak resident set size in bytes from /proc/<pid>/status.
func vmHWM(pid int) (int64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, fmt.Errorf("reading status of pid %d: %w", pid, err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			// "VmHWM:	  123456 kB"
			fields := strings.Fields(rest)
			if len(fields) != 2 || fields[1] != "kB" {
				return 0, fmt.Errorf("parsing VmHWM of pid %d: %q", pid, line)
			}
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmHWM of pid %d: %w", pid, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in the status of pid %d", pid)
}

// componentKubeconfig is the kubeconfig file a component (or "admin") uses.
func (c *Cluster) componentKubeconfig(name string) string {
	return filepath.Join(c.Dir, "kubeconfig", name+".kubeconfig")
}

// writeKubeconfigs writes one kubeconfig per identity, each with its own token, and
// sets KubeconfigPath to the admin one.
func (c *Cluster) writeKubeconfigs() error {
	if err := os.MkdirAll(filepath.Join(c.Dir, "kubeconfig"), 0o700); err != nil {
		return fmt.Errorf("creating kubeconfig dir: %w", err)
	}
	for name := range identities() {
		if err := c.writeKubeconfig(name, name, c.pki.tokens[name]); err != nil {
			return err
		}
	}
	c.KubeconfigPath = c.componentKubeconfig("admin")
	return nil
}
