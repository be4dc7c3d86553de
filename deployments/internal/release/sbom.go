package release

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/gpufrac/gpufrac/tests/images"
)

// SPDX is the part of an SPDX 2.3 JSON document the dry run writes.
type SPDX struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      SPDXCreation   `json:"creationInfo"`
	DocumentDescribes []string       `json:"documentDescribes"`
	Packages          []SPDXPackage  `json:"packages"`
	Files             []SPDXFile     `json:"files"`
	Relationships     []SPDXRelation `json:"relationships"`
}

// SPDXCreation is the document's creationInfo.
type SPDXCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

// SPDXPackage is one package: the image, a Go module, the Go standard
// library or a Debian package.
type SPDXPackage struct {
	SPDXID                string         `json:"SPDXID"`
	Name                  string         `json:"name"`
	VersionInfo           string         `json:"versionInfo,omitempty"`
	DownloadLocation      string         `json:"downloadLocation"`
	FilesAnalyzed         bool           `json:"filesAnalyzed"`
	LicenseConcluded      string         `json:"licenseConcluded"`
	LicenseDeclared       string         `json:"licenseDeclared"`
	CopyrightText         string         `json:"copyrightText"`
	Checksums             []SPDXChecksum `json:"checksums,omitempty"`
	ExternalRefs          []SPDXRef      `json:"externalRefs,omitempty"`
	PrimaryPackagePurpose string         `json:"primaryPackagePurpose,omitempty"`
	Comment               string         `json:"comment,omitempty"`
}

// SPDXFile is one file of the image.
type SPDXFile struct {
	SPDXID           string         `json:"SPDXID"`
	FileName         string         `json:"fileName"`
	Checksums        []SPDXChecksum `json:"checksums"`
	LicenseConcluded string         `json:"licenseConcluded"`
	CopyrightText    string         `json:"copyrightText"`
	Comment          string         `json:"comment,omitempty"`
}

// SPDXChecksum is a checksum of a file or package.
type SPDXChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

// SPDXRef is an external reference (a package URL).
type SPDXRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

// SPDXRelation is a relationship between two elements.
type SPDXRelation struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

const noAssertion = "NOASSERTION"

var spdxIDChars = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(kind, name string) string {
	return "SPDXRef-" + kind + "-" + strings.Trim(spdxIDChars.ReplaceAllString(name, "-"), "-")
}

// SBOM is the SPDX document of the image spec describes (digest its
// manifest's): every file of its layers with its checksums; for each Go
// binary, the modules its build information names (debug/buildinfo: path,
// version, go.sum hash) and the Go standard library's version; for each
// file copied from this machine (the base layer's C library), the Debian
// package dpkg says owns it. created is the document's time (RFC 3339, UTC).
func SBOM(spec images.Spec, name, version, platform, digest, created string) (*SPDX, error) {
	_, arch, _ := strings.Cut(platform, "/")
	hexDigest := strings.TrimPrefix(digest, "sha256:")
	doc := &SPDX{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              fmt.Sprintf("%s %s %s", name, version, platform),
		DocumentNamespace: fmt.Sprintf("https://github.com/gpufrac/gpufrac/spdx/%s/%s/%s", name, version, digest),
		CreationInfo:      SPDXCreation{Created: created, Creators: []string{"Tool: gpufrac-release-dry-run", "Organization: gpufrac"}},
		DocumentDescribes: []string{"SPDXRef-Image"},
	}
	doc.Packages = append(doc.Packages, SPDXPackage{
		SPDXID: "SPDXRef-Image", Name: name, VersionInfo: version, DownloadLocation: noAssertion,
		LicenseConcluded: noAssertion, LicenseDeclared: "Apache-2.0", CopyrightText: noAssertion,
		Checksums:             []SPDXChecksum{{Algorithm: "SHA256", Value: hexDigest}},
		ExternalRefs:          []SPDXRef{{"PACKAGE-MANAGER", "purl", fmt.Sprintf("pkg:oci/%s@sha256%%3A%s?arch=%s&tag=%s", name, hexDigest, arch, version)}},
		PrimaryPackagePurpose: "CONTAINER",
	})
	rel := func(a, t, b string) { doc.Relationships = append(doc.Relationships, SPDXRelation{a, t, b}) }
	rel("SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-Image")
	pkgs := map[string]bool{}
	addPkg := func(p SPDXPackage) {
		if !pkgs[p.SPDXID] {
			pkgs[p.SPDXID] = true
			doc.Packages = append(doc.Packages, p)
			rel("SPDXRef-Image", "CONTAINS", p.SPDXID)
		}
	}
	distro := debianRelease()
	for li, layer := range spec.Layers {
		for _, f := range layer {
			data := f.Data
			if f.Src != "" {
				var err error
				if data, err = os.ReadFile(f.Src); err != nil {
					return nil, err
				}
			}
			fid := spdxID("File", f.Dst)
			s1, s256 := sha1.Sum(data), sha256.Sum256(data)
			file := SPDXFile{SPDXID: fid, FileName: f.Dst, LicenseConcluded: noAssertion, CopyrightText: noAssertion,
				Checksums: []SPDXChecksum{{"SHA1", hex.EncodeToString(s1[:])}, {"SHA256", hex.EncodeToString(s256[:])}}}
			bi, goErr := buildinfo.Read(bytes.NewReader(data))
			switch {
			case goErr == nil:
				main := goPackages(bi, version)
				for _, p := range main {
					addPkg(p)
				}
				rel(main[0].SPDXID, "CONTAINS", fid)
				for _, p := range main[1:] {
					rel(main[0].SPDXID, "DEPENDS_ON", p.SPDXID)
				}
			case f.Src != "":
				p, err := debianPackage(f.Src, distro)
				if err != nil {
					return nil, err
				}
				addPkg(p)
				rel(p.SPDXID, "CONTAINS", fid)
				file.Comment = "copied from this machine's " + f.Src
			default:
				file.Comment = fmt.Sprintf("written by the image build (tests/images, layer %d)", li)
				rel("SPDXRef-Image", "CONTAINS", fid)
			}
			doc.Files = append(doc.Files, file)
		}
	}
	return doc, nil
}

// goPackages is a Go binary's main module (first, at the release's version:
// a build from a checkout says "(devel)"), its dependencies as the binary
// was built with them (replacements applied) and the standard library.
func goPackages(bi *debug.BuildInfo, version string) []SPDXPackage {
	mk := func(path, v, sum, comment string) SPDXPackage {
		p := SPDXPackage{SPDXID: spdxID("Go", path+"-"+v), Name: path, VersionInfo: v,
			DownloadLocation: noAssertion, LicenseConcluded: noAssertion, LicenseDeclared: noAssertion, CopyrightText: noAssertion,
			ExternalRefs: []SPDXRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + path + "@" + v}}, Comment: comment}
		if sum != "" {
			p.Comment = strings.TrimSpace("go.sum " + sum + " " + comment)
		}
		return p
	}
	out := []SPDXPackage{mk(bi.Main.Path, version, "", "main module, built from "+bi.Main.Version+" at release version "+version)}
	out[0].PrimaryPackagePurpose = "APPLICATION"
	deps := append([]*debug.Module(nil), bi.Deps...)
	sort.Slice(deps, func(i, j int) bool { return deps[i].Path < deps[j].Path })
	for _, d := range deps {
		path, v, sum := ModuleUsed(d)
		comment := ""
		if d.Replace != nil {
			comment = "replaces " + d.Path + "@" + d.Version
		}
		out = append(out, mk(path, v, sum, comment))
	}
	std := mk("stdlib", bi.GoVersion, "", "the Go standard library and runtime")
	std.ExternalRefs[0].Locator = "pkg:golang/stdlib@" + bi.GoVersion
	return append(out, std)
}

// ModuleUsed is the module a dependency was built from: its replacement's
// path and version when replaced.
func ModuleUsed(d *debug.Module) (path, version, sum string) {
	if d.Replace != nil {
		return d.Replace.Path, d.Replace.Version, d.Replace.Sum
	}
	return d.Path, d.Version, d.Sum
}

// debianPackage is the Debian package that owns file (dpkg -S), at its
// installed version.
func debianPackage(file, distro string) (SPDXPackage, error) {
	out, err := exec.Command("dpkg", "-S", file).Output()
	if err != nil {
		return SPDXPackage{}, fmt.Errorf("dpkg -S %s: %v (the SBOM must name the package of every base file)", file, err)
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	pkg, _, ok := strings.Cut(first, ": ")
	if !ok || strings.Contains(pkg, ",") {
		return SPDXPackage{}, fmt.Errorf("dpkg -S %s: %q names no single package", file, first)
	}
	q, err := exec.Command("dpkg-query", "-W", "-f", "${Version} ${Architecture}", pkg).Output()
	if err != nil {
		return SPDXPackage{}, fmt.Errorf("dpkg-query %s: %v", pkg, err)
	}
	v, pkgArch, _ := strings.Cut(strings.TrimSpace(string(q)), " ")
	name, arch, _ := strings.Cut(pkg, ":")
	if arch == "" {
		arch = pkgArch // a package of one architecture only, e.g. libc6-arm64-cross: all
	}
	purl := fmt.Sprintf("pkg:deb/debian/%s@%s", name, v)
	if arch != "" {
		purl += "?arch=" + arch
		if distro != "" {
			purl += "&distro=" + distro
		}
	}
	comment := "Debian package " + pkg + " of the build machine"
	if strings.HasSuffix(name, "-cross") {
		// dpkg-cross's packages hold another architecture's files under
		// /usr/<triplet>; the image has them where that architecture's
		// Debian does (tests/images.CrossBaseFiles).
		comment += ": another architecture's Debian package repackaged by dpkg-cross for cross compiling (files under /usr/<triplet>/), its files placed in the image at that architecture's paths"
	}
	return SPDXPackage{SPDXID: spdxID("Deb", pkg+"-"+v), Name: name, VersionInfo: v,
		DownloadLocation: noAssertion, LicenseConcluded: noAssertion, LicenseDeclared: noAssertion, CopyrightText: noAssertion,
		ExternalRefs: []SPDXRef{{"PACKAGE-MANAGER", "purl", purl}}, Comment: comment}, nil
}

// debianRelease is "debian-<VERSION_ID>" from /etc/os-release, or empty.
func debianRelease() string {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return ""
	}
	var id, ver string
	for _, l := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(l, "=")
		v = strings.Trim(v, `"`)
		switch k {
		case "ID":
			id = v
		case "VERSION_ID":
			ver = v
		}
	}
	if id == "" || ver == "" {
		return ""
	}
	return id + "-" + ver
}
