package resource

import (
	"fmt"
	"strconv"
	"strings"
)

// idSeparator joins a GPU UUID and a unit or replica index in a device ID.
// UUIDs never contain it ("GPU-xxxxxxxx-..." and "MIG-..." use single dashes).
const idSeparator = "::"

// UnitID returns the device ID of unit k of a shared GPU: "<uuid>::<k>".
func UnitID(uuid string, k int) string {
	return uuid + idSeparator + strconv.Itoa(k)
}

// ParseUnitID splits a shared-GPU device ID into its GPU UUID and unit index.
func ParseUnitID(id string) (uuid string, k int, err error) {
	i := strings.LastIndex(id, idSeparator)
	if i <= 0 {
		return "", 0, fmt.Errorf("device ID %q: want <gpu-uuid>::<index>", id)
	}
	k, err = strconv.Atoi(id[i+len(idSeparator):])
	if err != nil || k < 0 {
		return "", 0, fmt.Errorf("device ID %q: unit index is not a non-negative integer", id)
	}
	return id[:i], k, nil
}

// GPUOfUnits returns the one GPU all the given unit IDs belong to, or an
// error when they are malformed or span several GPUs.
func GPUOfUnits(ids []string) (string, error) {
	if len(ids) == 0 {
		return "", fmt.Errorf("no device IDs")
	}
	var gpu string
	for _, id := range ids {
		uuid, _, err := ParseUnitID(id)
		if err != nil {
			return "", err
		}
		if gpu == "" {
			gpu = uuid
		} else if uuid != gpu {
			return "", fmt.Errorf("units span GPUs %s and %s: a fraction must stay on one GPU", gpu, uuid)
		}
	}
	return gpu, nil
}
