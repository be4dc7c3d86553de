package images

import (
	"debug/elf"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpufrac/gpufrac/tests/images/elftest"
)

// TestCrossBaseFiles checks the arm64 base layer of a cgo binary: the loader
// and glibc come from the cross packages' directory and go where arm64's
// Debian has them, and each way the result could not start on arm64 is an
// error (an amd64 binary, an amd64 library in the cross directory, glibc
// missing, a dynamic binary on a base without a C library).
func TestCrossBaseFiles(t *testing.T) {
	const base = "gcr.io/distroless/base-debian12"
	arm, amd := elf.EM_AARCH64, elf.EM_X86_64
	tests := []struct {
		name   string
		base   string
		bin    []byte
		libs   map[string][]byte // the cross directory's files
		placed map[string]string // image path -> name in the cross directory; nil when want is an error
		want   string
	}{
		{"cgo binary", base, elftest.File(arm, "/lib/ld-linux-aarch64.so.1", "libc.so.6"),
			map[string][]byte{"ld-linux-aarch64.so.1": elftest.File(arm, ""), "libc.so.6": elftest.File(arm, "", "ld-linux-aarch64.so.1")},
			map[string]string{"/lib/ld-linux-aarch64.so.1": "ld-linux-aarch64.so.1", "/lib/aarch64-linux-gnu/libc.so.6": "libc.so.6"}, ""},
		{"a library glibc's libraries need", base, elftest.File(arm, "/lib/ld-linux-aarch64.so.1", "libdl.so.2"),
			map[string][]byte{"ld-linux-aarch64.so.1": elftest.File(arm, ""), "libdl.so.2": elftest.File(arm, "", "libc.so.6"), "libc.so.6": elftest.File(arm, "")},
			map[string]string{"/lib/ld-linux-aarch64.so.1": "ld-linux-aarch64.so.1", "/lib/aarch64-linux-gnu/libdl.so.2": "libdl.so.2", "/lib/aarch64-linux-gnu/libc.so.6": "libc.so.6"}, ""},
		{"static binary on a static base", "gcr.io/distroless/static-debian12:nonroot", elftest.File(arm, ""), nil, map[string]string{}, ""},
		{"an amd64 binary", base, elftest.File(amd, "/lib64/ld-linux-x86-64.so.2", "libc.so.6"), nil, nil, "is a EM_X86_64 binary, not arm64's EM_AARCH64"},
		{"an amd64 glibc in the cross directory", base, elftest.File(arm, "/lib/ld-linux-aarch64.so.1", "libc.so.6"),
			map[string][]byte{"ld-linux-aarch64.so.1": elftest.File(arm, ""), "libc.so.6": elftest.File(amd, "")}, nil, "libc.so.6 is a EM_X86_64 ELF"},
		{"no glibc in the cross directory", base, elftest.File(arm, "/lib/ld-linux-aarch64.so.1", "libc.so.6"),
			map[string][]byte{"ld-linux-aarch64.so.1": elftest.File(arm, "")}, nil, "apt-get install libc6-arm64-cross"},
		{"no loader in the cross directory", base, elftest.File(arm, "/lib/ld-linux-aarch64.so.1", "libc.so.6"),
			map[string][]byte{"libc.so.6": elftest.File(arm, "")}, nil, "ld-linux-aarch64.so.1 for /lib/ld-linux-aarch64.so.1"},
		{"a dynamic binary on a static base", "gcr.io/distroless/static-debian12:nonroot", elftest.File(arm, "/lib/ld-linux-aarch64.so.1", "libc.so.6"),
			nil, nil, "has no C library"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(t.TempDir(), "gpufrac-node")
			if err := os.WriteFile(bin, tc.bin, 0o755); err != nil {
				t.Fatal(err)
			}
			for n, data := range tc.libs {
				if err := os.WriteFile(filepath.Join(dir, n), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			files, err := crossBaseFiles(tc.base, []string{bin}, "arm64", dir)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, f := range files {
				if f.Src != "" {
					got[f.Dst] = strings.TrimPrefix(f.Src, dir+"/")
				}
			}
			if !reflect.DeepEqual(got, tc.placed) {
				t.Errorf("placed %v, want %v", got, tc.placed)
			}
			if !reflect.DeepEqual(files[:2], baseUsers()) {
				t.Errorf("the base layer does not start with the users: %v", files[:2])
			}
		})
	}
}
