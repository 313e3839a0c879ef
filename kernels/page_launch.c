// SPDX-License-Identifier: MIT
/*
 * page_launch.c - the host side of the page kernels: load the embedded
 * fatbin, marshal a call's arguments into a stream-ordered device buffer,
 * launch on the caller's stream. See page_cuda.h.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "page_cuda.h"

#ifdef KVC_HAVE_CUDA
#include "cudadrv.h"

/* Enough thread blocks to fill any current GPU several times over; the
 * kernels loop over the rest. */
#define KVK_MAX_GRID 65535u

int kvk_module_load(struct kvk_module *m, const char **why)
{
	CUresult r;

	memset(m, 0, sizeof(*m));
	r = kvk_cu.cuModuleLoadData(&m->mod, kvk_fatbin);
	if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
		*why = "cuModuleLoadData: the driver is older than the CUDA toolkit the kernels were built with (update the driver, or build with an older toolkit)";
		return -ENOEXEC;
	}
	if (r == CUDA_ERROR_NO_BINARY_FOR_GPU) {
		*why = "cuModuleLoadData: no kernel image for this GPU (built for sm_75, sm_80, sm_90 and compute_90 PTX)";
		return -ENOEXEC;
	}
	if (r != CUDA_SUCCESS) {
		*why = "cuModuleLoadData: the embedded kernels do not load (driver error)";
		return -ENOEXEC;
	}
	if (kvk_cu.cuModuleGetFunction(&m->copy, m->mod, "kvk_copy") != CUDA_SUCCESS ||
	    kvk_cu.cuModuleGetFunction(&m->csum, m->mod, "kvk_csum") != CUDA_SUCCESS) {
		kvk_cu.cuModuleUnload(m->mod);
		m->mod = NULL;
		*why = "cuModuleGetFunction: kvk_copy or kvk_csum missing from the embedded kernels";
		return -ENOEXEC;
	}
	return 0;
}

void kvk_module_unload(struct kvk_module *m)
{
	if (m->mod)
		kvk_cu.cuModuleUnload(m->mod);
	m->mod = NULL;
}

static int cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS: return 0;
	case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE: return -EINVAL;
	case CUDA_ERROR_INVALID_CONTEXT: return -EBADF;
	default: return -EIO;
	}
}

static unsigned grid_for(uint64_t work)
{
	return work < KVK_MAX_GRID ? (unsigned)work : KVK_MAX_GRID;
}

/*
 * Copy a call's arguments (host, `words` words) into dev and launch the
 * copy kernel for n blocks, both on the caller's stream: ordered for any
 * kind of stream (a synchronous copy would run on the legacy stream, which
 * a non-blocking stream does not wait for). From pageable memory the
 * driver stages the bytes before it returns, so `host` may be freed then.
 */
static CUresult upload_and_launch(const struct kvk_module *m, enum kvk_dir dir,
				  const struct kvk_layout *l, CUdeviceptr pool,
				  const uint64_t *host, size_t words, size_t n, CUdeviceptr dev,
				  CUstream stream)
{
	struct kvk_copy_params p;
	void *args[] = { &p };
	CUresult r;

	r = kvk_cu.cuMemcpyHtoDAsync(dev, host, words * sizeof(*host), stream);
	if (r != CUDA_SUCCESS)
		return r;
	memset(&p, 0, sizeof(p));
	p.pool = pool;
	p.half = l->half;
	p.page_half = l->page_half;
	p.rows = l->rows;
	p.row = l->row;
	p.page_row = l->page_row;
	p.page_off = l->page_off;
	p.halves = kvk_halves(l);
	p.segs = (uint64_t)n * p.halves * l->layers;
	p.args = dev;
	p.layers = l->layers;
	p.dir = dir;
	return kvk_cu.cuLaunchKernel(m->copy, grid_for(p.segs), 1, 1, KVK_THREADS, 1, 1, 0,
				     stream, args, NULL);
}

/*
 * For a GPU without stream-ordered allocation (no memory pools: some
 * vGPU set-ups): a plain buffer, and the call waits for the stream before
 * freeing it. Correct, but the caller's thread blocks until the copy ends.
 */
static CUresult copy_launch_sync(const struct kvk_module *m, enum kvk_dir dir,
				 const struct kvk_layout *l, CUdeviceptr pool,
				 const uint64_t *host, size_t words, size_t n, CUstream stream)
{
	CUdeviceptr dev;
	CUresult r;

	r = kvk_cu.cuMemAlloc(&dev, words * sizeof(*host));
	if (r != CUDA_SUCCESS)
		return r;
	r = upload_and_launch(m, dir, l, pool, host, words, n, dev, stream);
	if (r == CUDA_SUCCESS)
		r = kvk_cu.cuStreamSynchronize(stream);
	kvk_cu.cuMemFree(dev);
	return r;
}

int kvk_copy_launch(const struct kvk_module *m, enum kvk_dir dir,
		    const struct kvk_layout *l, CUdeviceptr pool, uint64_t slot_bytes,
		    const uint32_t *pages, const int64_t *blocks, size_t n,
		    CUstream stream)
{
	const uint32_t halves = kvk_halves(l);
	size_t words = halves * (size_t)l->layers + 2 * n, j;
	uint64_t *host;
	CUdeviceptr dev;
	CUresult r;
	uint32_t i;

	if (!n)
		return 0;
	host = malloc(words * sizeof(*host));
	if (!host)
		return -ENOMEM;
	for (i = 0; i < l->layers; i++) {
		host[halves * i] = kvk_tensor(l, i, 0);
		if (halves == 2)
			host[2 * i + 1] = kvk_tensor(l, i, 1);
	}
	for (j = 0; j < n; j++) {
		host[halves * l->layers + 2 * j] = (uint64_t)pages[j] * slot_bytes;
		host[halves * l->layers + 2 * j + 1] = (uint64_t)blocks[j] * l->block_stride;
	}
	r = kvk_cu.cuMemAllocAsync(&dev, words * sizeof(*host), stream);
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		r = copy_launch_sync(m, dir, l, pool, host, words, n, stream);
		goto out;
	}
	if (r != CUDA_SUCCESS)
		goto out;
	/* The copy, the kernel and the free after them are ordered on the
	 * stream; `host` may be freed at once. */
	r = upload_and_launch(m, dir, l, pool, host, words, n, dev, stream);
	kvk_cu.cuMemFreeAsync(dev, stream);
out:
	free(host);
	return cu_errno(r);
}

int kvk_csum_run(const struct kvk_module *m, const CUdeviceptr *pages, size_t n,
		 uint64_t bytes, uint64_t *out, CUstream stream)
{
	struct kvk_csum_params p;
	CUdeviceptr dev;
	CUresult r;
	void *args[] = { &p };

	if (!n)
		return 0;
	r = kvk_cu.cuMemAllocAsync(&dev, 2 * n * sizeof(uint64_t), stream);
	if (r != CUDA_SUCCESS)
		return cu_errno(r);
	r = kvk_cu.cuMemcpyHtoDAsync(dev, pages, n * sizeof(uint64_t), stream);
	if (r == CUDA_SUCCESS) {
		p.addrs = dev;
		p.out = dev + n * sizeof(uint64_t);
		p.bytes = bytes;
		p.n = n;
		r = kvk_cu.cuLaunchKernel(m->csum, grid_for(n), 1, 1, KVK_THREADS, 1, 1, 0,
					  stream, args, NULL);
	}
	if (r == CUDA_SUCCESS)
		r = kvk_cu.cuMemcpyDtoHAsync(out, dev + n * sizeof(uint64_t), n * sizeof(uint64_t),
					     stream);
	kvk_cu.cuMemFreeAsync(dev, stream);
	if (r == CUDA_SUCCESS)
		r = kvk_cu.cuStreamSynchronize(stream);
	return cu_errno(r);
}

_Static_assert(sizeof(CUdeviceptr) == sizeof(uint64_t), "device addresses are 64-bit");
#endif
