package dra

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
)

// recordVersion is the version of the prepared-claims file this code writes
// and reads.
const recordVersion = 1

// PreparedClaim is one claim the driver prepared: what the kubelet was told
// and what each device of it holds, kept across restarts because the
// kubelet's unprepare names only the claim, and because the next prepare
// must count it.
type PreparedClaim struct {
	UID       types.UID        `json:"uid"`
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []PreparedDevice `json:"devices"`
}

// PreparedDevice is one allocated device (or share of one) of a claim.
type PreparedDevice struct {
	// Requests are the claim's requests the device serves.
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	// ShareID is the allocation's share of a device that allows several.
	ShareID string      `json:"shareID,omitempty"`
	View    api.DRAView `json:"view"`
	// GPU is the physical GPU's UUID (the parent of a MIG device).
	GPU string `json:"gpu"`
	// MIG is the MIG device's UUID in view mig.
	MIG string `json:"mig,omitempty"`
	// Shares is what a shares-view allocation holds (percent of the GPU).
	Shares int64 `json:"shares,omitempty"`
	// MemoryBytes is what a memory-view allocation holds.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// LimitMiB is the GPU memory limit the container was told; 0 with
	// Unlimited for whole GPUs and MIG devices.
	LimitMiB  uint64 `json:"limitMiB,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	// CDIDeviceIDs are the CDI devices the kubelet was given.
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

// recordFile is the on-disk form of the prepared claims.
type recordFile struct {
	Version int             `json:"version"`
	Claims  []PreparedClaim `json:"claims"`
}

// ErrCorruptRecord means the prepared-claims file cannot be read: the
// driver does not start, because preparing without knowing what is already
// prepared could give a GPU twice. The file is left as it is.
var ErrCorruptRecord = errors.New("prepared-claims record is unreadable")

// loadRecord reads the prepared claims from path; a missing file is an
// empty record.
func loadRecord(path string) (map[types.UID]PreparedClaim, error) {
	out := map[types.UID]PreparedClaim{}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading prepared claims from %s: %w", path, err)
	}
	var f recordFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%w: %s: %v (move it away only once no pod on this node holds a claim of driver %s)", ErrCorruptRecord, path, err, api.DRADriver)
	}
	if f.Version != recordVersion {
		return nil, fmt.Errorf("%w: %s has version %d, this gpufrac-node reads version %d", ErrCorruptRecord, path, f.Version, recordVersion)
	}
	for _, c := range f.Claims {
		if c.UID == "" {
			return nil, fmt.Errorf("%w: %s lists a claim without a UID", ErrCorruptRecord, path)
		}
		out[c.UID] = c
	}
	return out, nil
}

// saveRecord writes the prepared claims to path atomically (a new file
// renamed over the old one, synced first), sorted by namespace, name, UID.
func saveRecord(path string, claims map[types.UID]PreparedClaim) error {
	f := recordFile{Version: recordVersion, Claims: make([]PreparedClaim, 0, len(claims))}
	for _, c := range claims {
		f.Claims = append(f.Claims, c)
	}
	slices.SortFunc(f.Claims, func(a, b PreparedClaim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding prepared claims: %w", err)
	}
	return writeFileAtomic(path, b)
}

// writeFileAtomic writes b to path through a temporary file in the same
// directory, synced and renamed, so a reader sees the old or the new file.
func writeFileAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
