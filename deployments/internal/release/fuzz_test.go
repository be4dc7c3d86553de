package release

import (
	"debug/elf"
	"testing"

	"github.com/gpufrac/gpufrac/tests/images/elftest"
)

// FuzzCheckBinary: checkBinary reads an image's entrypoint, its loader and
// its libraries with debug/elf; whatever bytes they hold (a truncated or
// corrupt layer, a crafted file), it returns an error or nil and does not
// panic. The seeds are a dynamic amd64 binary with its loader and libc.
func FuzzCheckBinary(f *testing.F) {
	const ld, libc = "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6"
	amd := elf.EM_X86_64
	f.Add(elftest.File(amd, ld, "libc.so.6"), elftest.File(amd, ""), elftest.File(amd, "", "ld-linux-x86-64.so.2"))
	f.Add(elftest.File(amd, ld, "libc.so.6", "libc.so.6", "../../../x"), elftest.File(elf.EM_AARCH64, ""), []byte("\x7fELF"))
	f.Fuzz(func(t *testing.T, bin, loader, lib []byte) {
		files := map[string][]byte{"/bin/gpufrac-node": bin, ld: loader, libc: lib}
		_ = checkBinary(files, "/bin/gpufrac-node", "linux/amd64")
	})
}
