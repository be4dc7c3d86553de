// Package images builds the test bed's OCI images without a daemon and
// without a registry: each image is a few layers of files from this machine
// (the project's binaries, the C library a cgo binary links, the users a
// distroless base would carry), written as an image tarball that a node's
// containerd imports (ctr images import).
//
// The component images follow their Dockerfiles (deployments/images/*):
// FromDockerfile reads the final stage's COPY, ENV, LABEL, USER and
// ENTRYPOINT, so the files sit at the paths the published image has them and
// the container starts the same way. What differs is the base: distroless is
// not reachable here, so BaseFiles makes the part of it the binary needs.
//
// Builds are reproducible: file times are the epoch, owners root, entries
// sorted, the config has no creation time; the same inputs give the same
// image digest.
package images

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of an image layer.
type File struct {
	// Dst is the absolute path in the image.
	Dst string
	// Src is the file on this machine whose content Dst gets (symlinks
	// followed). Empty uses Data.
	Src string
	// Data is the content when Src is empty.
	Data []byte
	// Mode is the permission bits; zero means Src's (or 0644 for Data).
	Mode os.FileMode
}

// Spec is one image.
type Spec struct {
	// Ref names the image, e.g. "gpufrac.test/gpufrac-node:dev". The node's
	// containerd knows it by this name after the import.
	Ref string
	// Layers are applied in order, each a list of files; directories are
	// made as needed.
	Layers [][]File
	// Config is the image's run configuration (Entrypoint, Env, User, Labels...).
	Config v1.Config
	// Arch is the image's architecture (linux/<Arch>); empty is this
	// machine's. The layers' binaries must be built for it.
	Arch string
}

// Write builds spec's image and writes it to tarPath as an image tarball
// (the docker-archive format, which ctr images import reads). It returns the
// image's digest.
func Write(spec Spec, tarPath string) (v1.Hash, error) {
	img, err := Build(spec)
	if err != nil {
		return v1.Hash{}, err
	}
	ref, err := name.NewTag(spec.Ref, name.WeakValidation)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image reference %q: %w", spec.Ref, err)
	}
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		return v1.Hash{}, fmt.Errorf("writing %s: %w", tarPath, err)
	}
	return img.Digest()
}

// Build returns spec's image.
func Build(spec Spec) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i, files := range spec.Layers {
		data, err := layerTar(files)
		if err != nil {
			return nil, fmt.Errorf("%s layer %d: %w", spec.Ref, i, err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("%s layer %d: %w", spec.Ref, i, err)
		}
		if img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			History:   v1.History{CreatedBy: fmt.Sprintf("gpufrac tests/images layer %d", i), Created: v1.Time{Time: time.Unix(0, 0).UTC()}},
			MediaType: types.OCILayer,
		}); err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = runtime.GOARCH
	if spec.Arch != "" {
		cf.Architecture = spec.Arch
	}
	cf.OS = "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config = spec.Config
	return mutate.ConfigFile(img, cf)
}

// layerTar is the uncompressed tar of files: parents first, entries sorted,
// every time the epoch and every owner root.
func layerTar(files []File) ([]byte, error) {
	type entry struct {
		hdr  tar.Header
		data []byte
	}
	entries := map[string]*entry{}
	epoch := time.Unix(0, 0).UTC()
	addDir := func(dir string) {
		for d := dir; d != "/" && d != "."; d = path.Dir(d) {
			key := strings.TrimPrefix(d, "/") + "/"
			if _, ok := entries[key]; !ok {
				entries[key] = &entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: key, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}}
			}
		}
	}
	for _, f := range files {
		if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst {
			return nil, fmt.Errorf("image path %q: want a clean absolute path", f.Dst)
		}
		data, mode := f.Data, f.Mode
		if f.Src != "" {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return nil, err
			}
			if mode == 0 {
				st, err := os.Stat(f.Src)
				if err != nil {
					return nil, err
				}
				mode = st.Mode().Perm()
			}
		}
		if mode == 0 {
			mode = 0o644
		}
		key := strings.TrimPrefix(f.Dst, "/")
		if _, dup := entries[key]; dup {
			return nil, fmt.Errorf("image path %s given twice", f.Dst)
		}
		addDir(path.Dir(f.Dst))
		entries[key] = &entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: key, Mode: int64(mode.Perm()), Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}, data: data}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ErrNotFound is returned by FromDockerfile for a Dockerfile without what an
// image needs (a final stage with an ENTRYPOINT).
var ErrNotFound = errors.New("not found")
