/* SPDX-License-Identifier: MIT */
/*
 * cudadrv.h - the CUDA driver, loaded at run time. libkvclient and kvcached
 * never link libcuda: kvk_cuda_load() dlopen()s libcuda.so.1 and resolves
 * the entry points below, so both run (host pool) on machines with no
 * driver, and the cuda paths fail there with a message saying so.
 *
 * Each pointer has the exact type the toolkit's <cuda.h> gives the API at
 * build time, and is resolved by the symbol name that header maps it to
 * (cuMemcpyDtoH is cuMemcpyDtoH_v2 ...), so the ABI always matches the
 * prototypes we compiled against. A driver older than the toolkit lacks
 * some of those names: the load fails naming the first one missing.
 */
#ifndef KVK_CUDADRV_H
#define KVK_CUDADRV_H

#include <stdbool.h>

#ifdef KVC_HAVE_CUDA
#include <cuda.h>

#define KVK_CUDA_FUNCS(X)                                               \
	X(cuInit) X(cuGetErrorString) X(cuDriverGetVersion)             \
	X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute)      \
	X(cuDeviceGetUuid) X(cuDeviceGetName)                           \
	X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)        \
	X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxPushCurrent)       \
	X(cuCtxPopCurrent) X(cuCtxSynchronize)                          \
	X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) \
	X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) \
	X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap)          \
	X(cuMemUnmap) X(cuMemSetAccess)                                 \
	X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync) X(cuMemFreeAsync) \
	X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD)                 \
	X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync)  \
	X(cuMemsetD8) X(cuMemHostRegister) X(cuMemHostUnregister)       \
	X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)     \
	X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)             \
	X(cuEventSynchronize) X(cuEventElapsedTime)                     \
	X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)    \
	X(cuLaunchKernel) X(cuPointerGetAttribute)                      \
	X(cuCtxGetDevice) X(cuMemHostGetDevicePointer)                  \
	X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolSetAttribute) \
	X(cuMemAllocFromPoolAsync)

struct kvk_cuda {
#define KVK_CUDA_PTR(f) __typeof__(f) *f;
	KVK_CUDA_FUNCS(KVK_CUDA_PTR)
#undef KVK_CUDA_PTR
};

/* The table, valid once kvk_cuda_load() returned 0. */
extern struct kvk_cuda kvk_cu;

/* A driver error as text: "cuMemCreate: out of memory (2)" into buf. */
const char *kvk_cu_err(CUresult r, const char *call, char *buf, size_t len);

/* cuMemGetAllocationGranularity etc.: properties of a pinned device
 * allocation on `dev` exportable as a POSIX file descriptor. */
void kvk_cu_vmm_prop(CUmemAllocationProp *prop, CUdevice dev);
/* Read-write access for device dev, as the daemon and every client map
 * the pool (cuMemSetAccess). */
void kvk_cu_rw_access(CUmemAccessDesc *acc, CUdevice dev);

/*
 * Check that device `dev` can hold a VMM pool shared by fd: virtual memory
 * management and POSIX-fd handle export supported. 0 or -ENOTSUP with a
 * message naming the missing attribute in buf.
 */
int kvk_cu_check_vmm(CUdevice dev, int ordinal, char *buf, size_t len);
#endif

/*
 * Load the driver once per process (thread-safe) and cuInit(0) it.
 * Returns 0, or -ENOTSUP with *why saying what is missing: "built without
 * CUDA", "libcuda.so.1: cannot open shared object file" (no driver),
 * a missing entry point (driver older than the toolkit), or cuInit's error
 * (no device, driver/kernel module mismatch).
 */
int kvk_cuda_load(const char **why);

#endif
