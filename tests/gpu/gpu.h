/* SPDX-License-Identifier: MIT */
/*
 * gpu.h - helpers for the GPU tests (`make test-gpu`): is a usable GPU
 * here (asked in a forked child, so that the test process itself never
 * initialises CUDA and can still fork clients that do), and the device
 * memory hooks that let tests/lib/engine.c's engine live on the GPU.
 * Everything goes through kernels/cudadrv.h: no libcudart.
 */
#ifndef KVT_GPU_H
#define KVT_GPU_H

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../kernels/cudadrv.h"
#include "../lib/engine.h"
#include "../lib/harness.h"

/* In a cmocka test: skip, saying why, where kvt_gpu_missing() said so. */
#define KVT_GPU_SKIP_IF_MISSING(missing)                                    \
	do {                                                                \
		if (missing) {                                              \
			print_message("[  SKIP    ] no GPU: %s\n", missing);   \
			skip();                                             \
		}                                                           \
	} while (0)

/*
 * NULL when this process can use GPU 0 with VMM fd export, else why not.
 * Runs the check in a child: CUDA state does not survive fork().
 */
static inline const char *kvt_gpu_missing(void)
{
	static char why[320];
	int p[2];
	pid_t pid;
	ssize_t n;

	if (pipe(p))
		return "pipe failed";
	pid = fork();
	if (pid == 0) {
		const char *w = NULL;
		char msg[300] = "";

		close(p[0]);
		if (kvk_cuda_load(&w))
			snprintf(msg, sizeof(msg), "%s", w);
#ifdef KVC_HAVE_CUDA
		else {
			int count = 0;
			CUdevice dev;

			if (kvk_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 1)
				snprintf(msg, sizeof(msg), "the CUDA driver sees no GPU");
			else if (kvk_cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS)
				kvk_cu_check_vmm(dev, 0, msg, sizeof(msg));
		}
#endif
		(void)!write(p[1], msg, strlen(msg));
		_exit(0);
	}
	close(p[1]);
	n = read(p[0], why, sizeof(why) - 1);
	close(p[0]);
	waitpid(pid, NULL, 0);
	if (n < 0)
		return "cannot ask a child about the GPU";
	why[n] = 0;
	return n ? why : NULL;
}

/*
 * Group setup of a GPU suite around a daemon started with args: without a
 * usable GPU (*missing says why) no daemon and *state NULL, every test
 * then skipping. kvt_gpu_teardown stops it, failing unless it stopped
 * cleanly.
 */
static inline int kvt_gpu_setup(void **state, const char **missing, const char *const *args)
{
	*state = NULL;
	*missing = kvt_gpu_missing();
	if (*missing)
		return 0;
	return kvt_setup_args(state, args);
}

static inline int kvt_gpu_teardown(void **state)
{
	return *state ? kvt_teardown(state) : 0;
}

#ifdef KVC_HAVE_CUDA
/* Make GPU `ordinal`'s primary context current on this thread (the one
 * libkvclient launches in) and create a stream in it. 0 or -1. */
static inline int kvt_gpu_enter(int ordinal, CUstream *stream)
{
	CUdevice dev;
	CUcontext ctx;

	if (kvk_cuda_load(NULL) || kvk_cu.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS ||
	    kvk_cu.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
	    kvk_cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		return -1;
	return stream && kvk_cu.cuStreamCreate(stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ? -1 : 0;
}

static inline int kvt_gpu_upload(const struct kvt_engine *e, void **t_k, void **t_v)
{
	uint32_t l;

	for (l = 0; l < e->layers; l++) {
		CUdeviceptr k = 0, v = 0;

		if (kvk_cu.cuMemAlloc(&k, e->tensor_bytes) != CUDA_SUCCESS ||
		    kvk_cu.cuMemcpyHtoD(k, e->k[l], e->tensor_bytes) != CUDA_SUCCESS)
			return -1;
		if (e->kind == KVC_LAYOUT_KV &&
		    (kvk_cu.cuMemAlloc(&v, e->tensor_bytes) != CUDA_SUCCESS ||
		     kvk_cu.cuMemcpyHtoD(v, e->v[l], e->tensor_bytes) != CUDA_SUCCESS))
			return -1;
		t_k[l] = (void *)(uintptr_t)k;
		t_v[l] = (void *)(uintptr_t)v;
	}
	/* Pageable uploads may still be landing; the kernels run on a
	 * non-blocking stream that does not wait for them. */
	return kvk_cu.cuCtxSynchronize() == CUDA_SUCCESS ? 0 : -1;
}

static inline int kvt_gpu_download(struct kvt_engine *e, void **t_k, void **t_v)
{
	uint32_t l;
	int rc = 0;

	for (l = 0; l < e->layers; l++) {
		if (kvk_cu.cuMemcpyDtoH(e->k[l], (CUdeviceptr)(uintptr_t)t_k[l], e->tensor_bytes) != CUDA_SUCCESS)
			rc = -1;
		kvk_cu.cuMemFree((CUdeviceptr)(uintptr_t)t_k[l]);
		if (e->kind == KVC_LAYOUT_KV) {
			if (kvk_cu.cuMemcpyDtoH(e->v[l], (CUdeviceptr)(uintptr_t)t_v[l], e->tensor_bytes) != CUDA_SUCCESS)
				rc = -1;
			kvk_cu.cuMemFree((CUdeviceptr)(uintptr_t)t_v[l]);
		}
	}
	return rc;
}

static inline int kvt_gpu_sync(void *stream)
{
	return kvk_cu.cuStreamSynchronize((CUstream)stream) == CUDA_SUCCESS ? 0 : -1;
}

/* kvc_gather_v2 of n blocks from 0 with an event per layer (at most 8
 * layers), each waited for in turn: a kvt_mem gather. */
static inline int kvt_gpu_gather_by_layer(struct kvc_req *r, size_t n, const struct kvc_layout *l,
			   const int64_t *ids, void *stream)
{
	CUevent ev[8];
	struct kvc_copy_opts o = { .size = sizeof(o), .stream = stream,
				   .layer_events = (void *const *)ev };
	uint32_t i;
	int rc = 0;

	for (i = 0; i < l->layers; i++)
		if (kvk_cu.cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
			return -EIO;
	rc = kvc_gather_v2(r, 0, n, l, ids, &o);
	for (i = 0; i < l->layers && !rc; i++)
		if (kvk_cu.cuEventSynchronize(ev[i]) != CUDA_SUCCESS)
			rc = -EIO;
	for (i = 0; i < l->layers; i++)
		kvk_cu.cuEventDestroy(ev[i]);
	return rc;
}

/* tests/lib/engine.c's engine on GPU `ordinal`, on a stream of its own. */
static inline int kvt_gpu_mem(int ordinal, struct kvt_mem *mem)
{
	CUstream s;

	memset(mem, 0, sizeof(*mem));
	if (kvt_gpu_enter(ordinal, &s))
		return -1;
	mem->upload = kvt_gpu_upload;
	mem->download = kvt_gpu_download;
	mem->sync = kvt_gpu_sync;
	mem->stream = s;
	mem->device = ordinal;
	return 0;
}
#endif

#endif
