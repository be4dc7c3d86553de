package images

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// The architectures the images are built for: Debian's multiarch triplet
// (the directory of its C library) and the ELF machine of its binaries.
var (
	triplets = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
	machines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
)

// Triplet is arch's Debian multiarch triplet (arm64: aarch64-linux-gnu).
func Triplet(arch string) (string, error) {
	t, ok := triplets[arch]
	if !ok {
		return "", fmt.Errorf("architecture %q: want one of amd64, arm64", arch)
	}
	return t, nil
}

// ELFMachine is the ELF machine of arch's binaries.
func ELFMachine(arch string) (elf.Machine, error) {
	m, ok := machines[arch]
	if !ok {
		return 0, fmt.Errorf("architecture %q: want one of amd64, arm64", arch)
	}
	return m, nil
}

// CrossLibDir is where Debian's cross packages (libc6-<arch>-cross, arch's
// libc6 repackaged by dpkg-cross) install arch's C library on this machine:
// /usr/<triplet>/lib. Empty for an unknown architecture.
func CrossLibDir(arch string) string {
	t, ok := triplets[arch]
	if !ok {
		return ""
	}
	return "/usr/" + t + "/lib"
}

// LibDirs are the directories Debian's loader for arch searches without an
// ld.so.cache or a RUNPATH, in its order: /lib/<triplet>, /usr/lib/<triplet>,
// /lib, /usr/lib.
func LibDirs(arch string) []string {
	t, ok := triplets[arch]
	if !ok {
		return nil
	}
	return []string{"/lib/" + t, "/usr/lib/" + t, "/lib", "/usr/lib"}
}

// Dynamic is what an ELF file asks of the system to run.
type Dynamic struct {
	Machine elf.Machine
	// Interp is the program interpreter (PT_INTERP), the loader: empty for a
	// static binary or a shared library.
	Interp string
	// Needed are the shared objects it names (DT_NEEDED).
	Needed []string
}

// ReadELF reads r's ELF machine, interpreter and needed shared objects.
func ReadELF(r io.ReaderAt) (Dynamic, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return Dynamic{}, err
	}
	defer f.Close()
	d := Dynamic{Machine: f.Machine}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			return Dynamic{}, fmt.Errorf("PT_INTERP: %w", err)
		}
		d.Interp = strings.TrimRight(string(data), "\x00")
	}
	if d.Needed, err = f.ImportedLibraries(); err != nil {
		return Dynamic{}, fmt.Errorf("DT_NEEDED: %w", err)
	}
	return d, nil
}

func readELFFile(p string) (Dynamic, error) {
	f, err := os.Open(p)
	if err != nil {
		return Dynamic{}, err
	}
	defer f.Close()
	d, err := ReadELF(f)
	if err != nil {
		return Dynamic{}, fmt.Errorf("%s: %w", p, err)
	}
	return d, nil
}

// CrossBaseFiles is BaseFiles for binaries built for another architecture
// than this machine's: ldd cannot run them, so their ELF headers say what
// they need. A static binary needs the users only. A dynamic one needs its
// interpreter (PT_INTERP, e.g. /lib/ld-linux-aarch64.so.1) and the shared
// objects it and they name (DT_NEEDED), which come from arch's cross packages
// on this machine (CrossLibDir: Debian's libc6-arm64-cross holds the files
// of libc6:arm64 under /usr/aarch64-linux-gnu/lib) and go where arch's
// Debian has them: the interpreter at its path, the libraries in
// /lib/<triplet>. Every file must be an ELF of arch's machine.
func CrossBaseFiles(baseImage string, binaries []string, arch string) ([]File, error) {
	return crossBaseFiles(baseImage, binaries, arch, CrossLibDir(arch))
}

// crossBaseFiles is CrossBaseFiles with arch's C library in dir.
func crossBaseFiles(baseImage string, binaries []string, arch, dir string) ([]File, error) {
	machine, err := ELFMachine(arch)
	if err != nil {
		return nil, err
	}
	triplet, _ := Triplet(arch)
	place := map[string]string{} // path in the image -> file on this machine
	interps := map[string]bool{} // the interpreters' names: a library that needs one has it loaded already
	var queue []string
	for _, b := range binaries {
		d, err := readELFFile(b)
		if err != nil {
			return nil, err
		}
		if d.Machine != machine {
			return nil, fmt.Errorf("%s is a %s binary, not %s's %s", b, d.Machine, arch, machine)
		}
		if d.Interp == "" && len(d.Needed) == 0 {
			continue // static
		}
		if !hasLibc(baseImage) {
			return nil, fmt.Errorf("%s links %v but the base image %s has no C library", b, d.Needed, baseImage)
		}
		if d.Interp == "" || !path.IsAbs(d.Interp) {
			return nil, fmt.Errorf("%s links %v but names no absolute interpreter (%q)", b, d.Needed, d.Interp)
		}
		place[path.Clean(d.Interp)] = filepath.Join(dir, path.Base(d.Interp))
		interps[path.Base(d.Interp)] = true
		queue = append(queue, d.Needed...)
	}
	seen := map[string]bool{}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] || interps[name] {
			continue
		}
		seen[name] = true
		if strings.Contains(name, "/") {
			return nil, fmt.Errorf("needed shared object %q is a path", name)
		}
		src := filepath.Join(dir, name)
		place["/lib/"+triplet+"/"+name] = src
		d, err := readELFFile(src)
		if err != nil {
			return nil, fmt.Errorf("%s's C library (%s) is not on this machine: %w (Debian: apt-get install libc6-%s-cross)", arch, name, err, arch)
		}
		queue = append(queue, d.Needed...)
	}
	dsts := make([]string, 0, len(place))
	for dst := range place {
		dsts = append(dsts, dst)
	}
	sort.Strings(dsts)
	files := baseUsers()
	for _, dst := range dsts {
		src := place[dst]
		d, err := readELFFile(src)
		if err != nil {
			return nil, fmt.Errorf("%s for %s: %w (Debian: apt-get install libc6-%s-cross)", src, dst, err, arch)
		}
		if d.Machine != machine {
			return nil, fmt.Errorf("%s for %s is a %s ELF, not %s's %s", src, dst, d.Machine, arch, machine)
		}
		files = append(files, File{Src: src, Dst: dst, Mode: 0o755})
	}
	return files, nil
}
