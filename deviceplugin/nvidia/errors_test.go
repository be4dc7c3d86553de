package nvidia

import (
	"errors"
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNVMLError(t *testing.T) {
	sentinels := []error{ErrNotFound, ErrNotSupported, ErrGPULost, ErrNoPermission, ErrDriverUnavailable, ErrUninitialized, ErrTimeout}
	tests := []struct {
		name string
		ret  nvml.Return
		want error // the one sentinel the error matches; nil for none
	}{
		{name: "not found", ret: nvml.ERROR_NOT_FOUND, want: ErrNotFound},
		{name: "not supported", ret: nvml.ERROR_NOT_SUPPORTED, want: ErrNotSupported},
		{name: "function not found", ret: nvml.ERROR_FUNCTION_NOT_FOUND, want: ErrNotSupported},
		{name: "gpu lost", ret: nvml.ERROR_GPU_IS_LOST, want: ErrGPULost},
		{name: "reset required", ret: nvml.ERROR_RESET_REQUIRED, want: ErrGPULost},
		{name: "no permission", ret: nvml.ERROR_NO_PERMISSION, want: ErrNoPermission},
		{name: "library not found", ret: nvml.ERROR_LIBRARY_NOT_FOUND, want: ErrDriverUnavailable},
		{name: "driver not loaded", ret: nvml.ERROR_DRIVER_NOT_LOADED, want: ErrDriverUnavailable},
		{name: "version mismatch", ret: nvml.ERROR_LIB_RM_VERSION_MISMATCH, want: ErrDriverUnavailable},
		{name: "uninitialized", ret: nvml.ERROR_UNINITIALIZED, want: ErrUninitialized},
		{name: "timeout", ret: nvml.ERROR_TIMEOUT, want: ErrTimeout},
		{name: "unknown", ret: nvml.ERROR_UNKNOWN, want: nil},
		{name: "invalid argument", ret: nvml.ERROR_INVALID_ARGUMENT, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := fmt.Errorf("getting memory of GPU-x: %w", nvmlError(tc.ret))
			for _, s := range sentinels {
				if got, want := errors.Is(err, s), s == tc.want; got != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, s, got, want)
				}
			}
			var nerr *Error
			if !errors.As(err, &nerr) {
				t.Fatalf("errors.As(%v, *Error) = false", err)
			}
			if nerr.Code() != int(tc.ret) {
				t.Errorf("Code() = %d, want %d", nerr.Code(), int(tc.ret))
			}
			if !errors.Is(err, tc.ret) {
				t.Errorf("errors.Is(%v, nvml.Return %d) = false, want true (Unwrap)", err, int(tc.ret))
			}
			if errors.Is(err, nvml.ERROR_IN_USE) {
				t.Errorf("errors.Is(%v, nvml.ERROR_IN_USE) = true, want false", err)
			}
		})
	}
}

func TestNVMLErrorSuccessIsNil(t *testing.T) {
	if err := nvmlError(nvml.SUCCESS); err != nil {
		t.Errorf("nvmlError(SUCCESS) = %v, want nil", err)
	}
}

func TestNewRealWithoutDriver(t *testing.T) {
	lib := NewReal()
	err := lib.Init()
	if err == nil {
		if err := lib.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		t.Skip("an NVIDIA driver is present; this test checks the driverless error")
	}
	if !errors.Is(err, ErrDriverUnavailable) {
		t.Errorf("Init() = %v, want an error matching ErrDriverUnavailable", err)
	}
}
