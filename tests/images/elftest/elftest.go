// Package elftest writes small synthetic ELF files for tests: an
// architecture's binary or shared library with the interpreter and the
// shared objects it names, without a compiler for that architecture.
package elftest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
)

// File is a minimal little-endian ELF64 file of machine: a PT_INTERP
// program header naming interp (none when empty) and a .dynamic section with
// a DT_NEEDED entry for each of needed (debug/elf reads both as from a real
// binary).
func File(machine elf.Machine, interp string, needed ...string) []byte {
	le := binary.LittleEndian
	const ehsize, phsize, shsize = 64, 56, 64
	nph := 0
	if interp != "" {
		nph = 1
	}
	// Data after the headers: interp, .dynstr, .dynamic, .shstrtab.
	off := ehsize + nph*phsize
	var data bytes.Buffer
	interpOff := off
	if interp != "" {
		data.WriteString(interp + "\x00")
	}
	dynstrOff := off + data.Len()
	dynstr := []byte{0}
	var names []uint64
	for _, n := range needed {
		names = append(names, uint64(len(dynstr)))
		dynstr = append(dynstr, n+"\x00"...)
	}
	data.Write(dynstr)
	dynamicOff := off + data.Len()
	for _, n := range names {
		binary.Write(&data, le, [2]uint64{uint64(elf.DT_NEEDED), n})
	}
	binary.Write(&data, le, [2]uint64{uint64(elf.DT_NULL), 0})
	dynamicSize := off + data.Len() - dynamicOff
	shstrtabOff := off + data.Len()
	shstrtab := "\x00.dynstr\x00.dynamic\x00.shstrtab\x00"
	data.WriteString(shstrtab)
	shoff := off + data.Len()

	var b bytes.Buffer
	ident := [16]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)}
	b.Write(ident[:])
	binary.Write(&b, le, struct {
		Type, Machine              uint16
		Version                    uint32
		Entry, Phoff, Shoff        uint64
		Flags                      uint32
		Ehsize, Phentsize, Phnum   uint16
		Shentsize, Shnum, Shstrndx uint16
	}{uint16(elf.ET_DYN), uint16(machine), uint32(elf.EV_CURRENT), 0, ehsize, uint64(shoff), 0,
		ehsize, phsize, uint16(nph), shsize, 4, 3})
	if interp != "" {
		binary.Write(&b, le, elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: uint64(interpOff),
			Filesz: uint64(len(interp) + 1), Memsz: uint64(len(interp) + 1), Align: 1})
	}
	b.Write(data.Bytes())
	for _, sh := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_STRTAB), Off: uint64(dynstrOff), Size: uint64(len(dynstr)), Addralign: 1},
		{Name: 9, Type: uint32(elf.SHT_DYNAMIC), Off: uint64(dynamicOff), Size: uint64(dynamicSize), Link: 1, Addralign: 8, Entsize: 16},
		{Name: 18, Type: uint32(elf.SHT_STRTAB), Off: uint64(shstrtabOff), Size: uint64(len(shstrtab)), Addralign: 1},
	} {
		binary.Write(&b, le, sh)
	}
	return b.Bytes()
}
