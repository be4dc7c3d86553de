package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

// The few CUDA driver API types and entry points cudahold needs, declared
// here so that no CUDA header is needed: the ABI of these calls is stable
// since CUDA 4 (the _v2 entry points are what cuda.h maps the names to).
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

typedef CUresult (*cuInit_fn)(unsigned int);
typedef CUresult (*cuDriverGetVersion_fn)(int *);
typedef CUresult (*cuDeviceGet_fn)(CUdevice *, int);
typedef CUresult (*cuDeviceGetName_fn)(char *, int, CUdevice);
typedef CUresult (*cuDevicePrimaryCtxRetain_fn)(CUcontext *, CUdevice);
typedef CUresult (*cuCtxSetCurrent_fn)(CUcontext);
typedef CUresult (*cuMemAlloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*cuMemsetD8_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*cuCtxSynchronize_fn)(void);
typedef CUresult (*cuMemGetInfo_fn)(size_t *, size_t *);
typedef CUresult (*cuGetErrorName_fn)(CUresult, const char **);

typedef struct {
	CUresult rc;           // 0: success
	const char *step;      // the call that failed
	const char *err_name;  // CUDA's name of rc, when cuGetErrorName works
	const char *dl_error;  // dlopen/dlsym failure, when the library did not load
	char name[256];
	int driver;
	size_t free_b, total_b;
} hold_result;

static void cu_hold(size_t bytes, hold_result *r) {
	memset(r, 0, sizeof(*r));
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		r->step = "dlopen libcuda.so.1";
		r->dl_error = dlerror();
		return;
	}
#define SYM(var, sym) \
	var##_fn var = (var##_fn)dlsym(lib, sym); \
	if (!var) { r->step = "dlsym " sym; r->dl_error = dlerror(); return; }
	SYM(cuInit, "cuInit")
	SYM(cuDriverGetVersion, "cuDriverGetVersion")
	SYM(cuDeviceGet, "cuDeviceGet")
	SYM(cuDeviceGetName, "cuDeviceGetName")
	SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
	SYM(cuCtxSetCurrent, "cuCtxSetCurrent")
	SYM(cuMemAlloc, "cuMemAlloc_v2")
	SYM(cuMemsetD8, "cuMemsetD8_v2")
	SYM(cuCtxSynchronize, "cuCtxSynchronize")
	SYM(cuMemGetInfo, "cuMemGetInfo_v2")
	SYM(cuGetErrorName, "cuGetErrorName")
#undef SYM
#define CALL(expr) \
	if ((r->rc = (expr)) != 0) { r->step = #expr; cuGetErrorName(r->rc, &r->err_name); return; }
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr ptr;
	CALL(cuInit(0))
	CALL(cuDriverGetVersion(&r->driver))
	CALL(cuDeviceGet(&dev, 0))
	CALL(cuDeviceGetName(r->name, sizeof(r->name) - 1, dev))
	CALL(cuDevicePrimaryCtxRetain(&ctx, dev))
	CALL(cuCtxSetCurrent(ctx))
	CALL(cuMemAlloc(&ptr, bytes))
	CALL(cuMemsetD8(ptr, 0x5a, bytes))
	CALL(cuCtxSynchronize())
	CALL(cuMemGetInfo(&r->free_b, &r->total_b))
#undef CALL
	// The library, context and allocation stay until the process exits.
}
*/
import "C"

import (
	"fmt"
)

// cudaAllocate allocates and fills bytes of GPU memory on CUDA device 0 in
// one C call (so that the context is current on the thread that allocates),
// and leaves it allocated.
func cudaAllocate(bytes uint64) (holdInfo, error) {
	var r C.hold_result
	C.cu_hold(C.size_t(bytes), &r)
	if r.dl_error != nil {
		return holdInfo{}, fmt.Errorf("%w: %s: %s", errNoDriver, C.GoString(r.step), C.GoString(r.dl_error))
	}
	if r.rc != 0 {
		name := "unknown error"
		if r.err_name != nil {
			name = C.GoString(r.err_name)
		}
		return holdInfo{}, fmt.Errorf("CUDA call %s failed: %s (%d)", C.GoString(r.step), name, int(r.rc))
	}
	return holdInfo{
		Device:     C.GoString(&r.name[0]),
		Driver:     int(r.driver),
		FreeBytes:  uint64(r.free_b),
		TotalBytes: uint64(r.total_b),
	}, nil
}
