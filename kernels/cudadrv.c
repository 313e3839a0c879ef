// SPDX-License-Identifier: MIT
/*
 * cudadrv.c - dlopen("libcuda.so.1") and the table of driver entry points
 * (see cudadrv.h). The only file that touches the dynamic loader.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cudadrv.h"

#ifdef KVC_HAVE_CUDA
#include <dlfcn.h>

struct kvk_cuda kvk_cu;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc;
static char load_why[256];

#define KVK_STR(x) #x
#define KVK_XSTR(x) KVK_STR(x)

static void load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CUresult r;

	load_rc = -ENOTSUP;
	if (!h) {
		snprintf(load_why, sizeof(load_why), "no CUDA driver: %s", dlerror());
		return;
	}
	/* The name <cuda.h> maps each API to (cuMemFree -> cuMemFree_v2). */
#define KVK_CUDA_SYM(f)                                                         \
	kvk_cu.f = (__typeof__(f) *)dlsym(h, KVK_XSTR(f));                      \
	if (!kvk_cu.f) {                                                        \
		snprintf(load_why, sizeof(load_why),                            \
			 "CUDA driver too old: libcuda.so.1 lacks %s (built with CUDA %d.%d)", \
			 KVK_XSTR(f), CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10); \
		return;                                                         \
	}
	KVK_CUDA_FUNCS(KVK_CUDA_SYM)
#undef KVK_CUDA_SYM
	r = kvk_cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		char e[160];

		snprintf(load_why, sizeof(load_why), "CUDA driver present but unusable: %s",
			 kvk_cu_err(r, "cuInit", e, sizeof(e)));
		return;
	}
	/* The handle stays open for the life of the process. */
	load_rc = 0;
}

int kvk_cuda_load(const char **why)
{
	pthread_once(&load_once, load);
	if (load_rc && why)
		*why = load_why;
	return load_rc;
}

const char *kvk_cu_err(CUresult r, const char *call, char *buf, size_t len)
{
	const char *s = NULL;

	if (kvk_cu.cuGetErrorString)
		kvk_cu.cuGetErrorString(r, &s);
	snprintf(buf, len, "%s: %s (%d)", call, s ? s : "unknown error", (int)r);
	return buf;
}

void kvk_cu_vmm_prop(CUmemAllocationProp *prop, CUdevice dev)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

void kvk_cu_rw_access(CUmemAccessDesc *acc, CUdevice dev)
{
	memset(acc, 0, sizeof(*acc));
	acc->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc->location.id = dev;
	acc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

int kvk_cu_check_vmm(CUdevice dev, int ordinal, char *buf, size_t len)
{
	int vmm = 0, fd = 0;
	CUresult r;

	r = kvk_cu.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
	if (r != CUDA_SUCCESS || !vmm) {
		snprintf(buf, len, "GPU %d does not support CUDA virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)",
			 ordinal);
		return -ENOTSUP;
	}
	r = kvk_cu.cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
	if (r != CUDA_SUCCESS || !fd) {
		snprintf(buf, len, "GPU %d cannot export memory as POSIX file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0; some virtualised GPUs and drivers lack it)",
			 ordinal);
		return -ENOTSUP;
	}
	return 0;
}

#else

int kvk_cuda_load(const char **why)
{
	if (why)
		*why = "built without CUDA (nvcc was not found at build time, or NO_CUDA=1)";
	return -ENOTSUP;
}

#endif
