package nvidia

import (
	"errors"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Sentinels callers test with errors.Is. An *Error matches the sentinel of
// its NVML return code (see (*Error).Is).
var (
	// ErrNotFound is returned for a GPU UUID or index the library does not
	// know (NVML_ERROR_NOT_FOUND, or a failed handle lookup).
	ErrNotFound = errors.New("gpu not found")
	// ErrNotSupported means the GPU or driver does not support the call
	// (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND).
	ErrNotSupported = errors.New("not supported by the GPU or driver")
	// ErrGPULost means the GPU fell off the bus or needs a reset
	// (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED): it is unhealthy.
	ErrGPULost = errors.New("gpu is lost or needs a reset")
	// ErrNoPermission means the caller may not make the call
	// (NVML_ERROR_NO_PERMISSION).
	ErrNoPermission = errors.New("no permission")
	// ErrDriverUnavailable means libnvidia-ml.so or the kernel driver is
	// missing, or they do not match (NVML_ERROR_LIBRARY_NOT_FOUND,
	// NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH): the
	// node has no usable GPU stack.
	ErrDriverUnavailable = errors.New("nvidia driver unavailable")
	// ErrUninitialized means a call before Init or after Shutdown
	// (NVML_ERROR_UNINITIALIZED).
	ErrUninitialized = errors.New("nvml not initialized")
	// ErrTimeout means the call timed out (NVML_ERROR_TIMEOUT).
	ErrTimeout = errors.New("nvml timeout")
)

// Error is a failed NVML call. It keeps NVML's return code: errors.Is matches
// it against the sentinels above, and Unwrap gives the nvml.Return for callers
// that import go-nvml (errors.Is(err, nvml.ERROR_GPU_IS_LOST)).
type Error struct {
	ret nvml.Return
}

// nvmlError converts an NVML return code to an error; SUCCESS gives nil.
func nvmlError(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &Error{ret: ret}
}

// Error implements error ("nvml: ERROR_GPU_IS_LOST" without the driver
// loaded, NVML's own text with it).
func (e *Error) Error() string { return "nvml: " + e.ret.Error() }

// Code is NVML's numeric return code (nvmlReturn_t).
func (e *Error) Code() int { return int(e.ret) }

// Unwrap returns the nvml.Return, itself an error.
func (e *Error) Unwrap() error { return e.ret }

// Is reports whether target is the sentinel for e's return code.
func (e *Error) Is(target error) bool {
	return target != nil && sentinel(e.ret) == target
}

// sentinel maps an NVML return code to gpufrac's sentinel, or nil.
func sentinel(ret nvml.Return) error {
	switch ret {
	case nvml.ERROR_NOT_FOUND:
		return ErrNotFound
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return ErrNotSupported
	case nvml.ERROR_GPU_IS_LOST, nvml.ERROR_RESET_REQUIRED:
		return ErrGPULost
	case nvml.ERROR_NO_PERMISSION:
		return ErrNoPermission
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return ErrDriverUnavailable
	case nvml.ERROR_UNINITIALIZED:
		return ErrUninitialized
	case nvml.ERROR_TIMEOUT:
		return ErrTimeout
	default:
		return nil
	}
}
