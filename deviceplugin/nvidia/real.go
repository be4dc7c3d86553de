package nvidia

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/utils/clock"
)

// NewReal returns the Lib backed by the driver's libnvidia-ml.so, loaded by
// Init (which fails with ErrDriverUnavailable on a node without the driver).
func NewReal() Lib {
	return newNVMLLib(nvml.New(), clock.RealClock{})
}
