package release

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpufrac/gpufrac/tests/images"
	"github.com/gpufrac/gpufrac/tests/images/elftest"
)

func TestElfFileReadsBack(t *testing.T) {
	d, err := images.ReadELF(bytes.NewReader(elftest.File(elf.EM_AARCH64, "/lib/ld-linux-aarch64.so.1", "libc.so.6", "libdl.so.2")))
	if err != nil {
		t.Fatal(err)
	}
	if d.Machine != elf.EM_AARCH64 || d.Interp != "/lib/ld-linux-aarch64.so.1" || strings.Join(d.Needed, ",") != "libc.so.6,libdl.so.2" {
		t.Fatalf("read back %+v", d)
	}
}

// TestCheckBinary builds one-layer images (through tests/images, as the dry
// run does, and reads their files back as Verify does) and checks that
// checkBinary, which Verify runs on every platform's image, accepts an
// entrypoint that can start on the image's platform and names each way one
// cannot: an amd64 binary in an arm64 image, no loader, the build machine's
// amd64 loader or glibc in an arm64 image, a needed library missing.
func TestCheckBinary(t *testing.T) {
	const (
		bin      = "/usr/bin/gpufrac-node"
		ldArm    = "/lib/ld-linux-aarch64.so.1"
		libcArm  = "/lib/aarch64-linux-gnu/libc.so.6"
		ldAmd    = "/lib64/ld-linux-x86-64.so.2"
		libcAmd  = "/lib/x86_64-linux-gnu/libc.so.6"
		arm, amd = elf.EM_AARCH64, elf.EM_X86_64
	)
	arm64Node := func() map[string][]byte {
		return map[string][]byte{
			bin:     elftest.File(arm, ldArm, "libc.so.6"),
			ldArm:   elftest.File(arm, ""),
			libcArm: elftest.File(arm, "", "ld-linux-aarch64.so.1"),
		}
	}
	with := func(files map[string][]byte, edit func(map[string][]byte)) map[string][]byte {
		edit(files)
		return files
	}
	tests := []struct {
		name     string
		platform string
		files    map[string][]byte
		want     string // "" accepts
	}{
		{"arm64 node: aarch64 binary, loader and glibc", "linux/arm64", arm64Node(), ""},
		{"amd64 node: x86-64 binary, loader and glibc", "linux/amd64", map[string][]byte{
			bin: elftest.File(amd, ldAmd, "libc.so.6"), ldAmd: elftest.File(amd, ""), libcAmd: elftest.File(amd, "", "ld-linux-x86-64.so.2")}, ""},
		{"static arm64 binary", "linux/arm64", map[string][]byte{bin: elftest.File(arm, "")}, ""},
		{"a library in /usr/lib/<triplet>", "linux/arm64", with(arm64Node(), func(f map[string][]byte) {
			f[bin] = elftest.File(arm, ldArm, "libc.so.6", "libdl.so.2")
			f["/usr/lib/aarch64-linux-gnu/libdl.so.2"] = elftest.File(arm, "", "libc.so.6")
		}), ""},
		{"arm64 image with an amd64 binary", "linux/arm64", with(arm64Node(), func(f map[string][]byte) {
			f[bin] = elftest.File(amd, ldAmd, "libc.so.6")
		}), "entrypoint " + bin + " is a EM_X86_64 binary, not linux/arm64's EM_AARCH64"},
		{"amd64 image with an arm64 binary", "linux/amd64", arm64Node(), "is a EM_AARCH64 binary, not linux/amd64's EM_X86_64"},
		{"arm64 image without the loader", "linux/arm64", with(arm64Node(), func(f map[string][]byte) { delete(f, ldArm) }),
			"interpreter " + ldArm + " is not in the image"},
		{"arm64 image with the build machine's amd64 loader", "linux/arm64", with(arm64Node(), func(f map[string][]byte) { f[ldArm] = elftest.File(amd, "") }),
			"interpreter " + ldArm + " is a EM_X86_64 ELF"},
		{"arm64 image with the build machine's amd64 glibc", "linux/arm64", with(arm64Node(), func(f map[string][]byte) {
			f[libcArm] = elftest.File(amd, "", "ld-linux-x86-64.so.2")
		}), "shared object " + libcArm + " is a EM_X86_64 ELF"},
		{"glibc at the build machine's path only", "linux/arm64", with(arm64Node(), func(f map[string][]byte) {
			f[libcAmd] = f[libcArm]
			delete(f, libcArm)
		}), "needs libc.so.6, which is in none of [/lib/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu /lib /usr/lib]"},
		{"a library glibc needs missing", "linux/arm64", with(arm64Node(), func(f map[string][]byte) {
			f[libcArm] = elftest.File(arm, "", "ld-linux-aarch64.so.1", "libgone.so.1")
		}), "needs libgone.so.1"},
		{"the loader is not an ELF file", "linux/arm64", with(arm64Node(), func(f map[string][]byte) { f[ldArm] = []byte("#!/bin/sh\n") }),
			"interpreter " + ldArm + " is not an ELF file"},
		{"the entrypoint is not an ELF file", "linux/arm64", with(arm64Node(), func(f map[string][]byte) { f[bin] = []byte("#!/bin/sh\n") }),
			"entrypoint " + bin + " is not an ELF binary"},
		{"a dynamic binary without an interpreter", "linux/arm64", with(arm64Node(), func(f map[string][]byte) { f[bin] = elftest.File(arm, "", "libc.so.6") }),
			"needs [libc.so.6] but names no interpreter"},
		{"no entrypoint", "linux/arm64", with(arm64Node(), func(f map[string][]byte) { delete(f, bin) }), "has no entrypoint " + bin},
		{"an unknown platform", "linux/s390x", arm64Node(), `architecture "s390x"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var layer []images.File
			for p, data := range tc.files {
				layer = append(layer, images.File{Dst: p, Data: data, Mode: 0o755})
			}
			_, arch, _ := strings.Cut(tc.platform, "/")
			img, err := images.Build(images.Spec{Ref: "example.test/node:1", Arch: arch, Layers: [][]images.File{layer},
				Config: v1.Config{Entrypoint: []string{bin}}})
			if err != nil {
				t.Fatal(err)
			}
			files, err := imageFiles(img)
			if err != nil {
				t.Fatal(err)
			}
			err = checkBinary(files, bin, tc.platform)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("rejected: %v", err)
			case tc.want != "" && err == nil:
				t.Errorf("accepted, want an error saying %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// TestVerifyPlatformImageChecksTheBinary checks that Verify's check of one
// platform's image runs checkBinary: an arm64 image whose entrypoint is this
// amd64 test binary (a Go binary with build information, so that the SBOM
// checks pass) is refused for its machine.
func TestVerifyPlatformImageChecksTheBinary(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("the test binary must be an amd64 ELF; this is %s", runtime.GOARCH)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	const version = "9.9.9"
	spec := images.Spec{Ref: "example.test/gpufrac-node:" + version, Arch: "arm64",
		Layers: [][]images.File{{{Dst: "/usr/bin/gpufrac-node", Data: bin, Mode: 0o755}}},
		Config: v1.Config{Entrypoint: []string{"/usr/bin/gpufrac-node"}, Labels: map[string]string{"org.opencontainers.image.version": version}}}
	img, err := images.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	p := PlatformResult{Platform: "linux/arm64", Digest: d.String(), SBOM: "sbom/node.spdx.json"}
	doc, err := SBOM(spec, "gpufrac-node", version, p.Platform, p.Digest, "1970-01-01T00:00:00Z")
	if err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(out, p.SBOM), doc); err != nil {
		t.Fatal(err)
	}
	err = verifyPlatformImage(out, version, p, img)
	if err == nil {
		t.Fatal("an arm64 image with an amd64 binary verified")
	}
	if want := "is a EM_X86_64 binary, not linux/arm64's EM_AARCH64"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if strings.Contains(err.Error(), "SBOM") {
		t.Errorf("the SBOM should verify, so that only the binary is refused: %v", err)
	}
}
