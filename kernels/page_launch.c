// SPDX-License-Identifier: MIT
/*
 * page_launch.c - the host side of the page kernels: load the embedded
 * fatbin, marshal a call's arguments into a stream-ordered device buffer,
 * launch on the caller's stream. See page_cuda.h.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "page_cuda.h"

#ifdef KVC_HAVE_CUDA
#include "cudadrv.h"

/* Enough thread blocks to fill any current GPU several times over; the
 * kernels loop over the rest. */
#define KVK_MAX_GRID 65535u

/* Argument buffers of up to this many bytes are mapped into the pool at
 * load: a 4096-block call of an 80-layer model needs 65 KiB. */
#define KVK_ARGS_WARM (256u << 10)

/*
 * See kvk_module_load. Nothing here is needed for correctness: where a
 * step fails, the calls do it later (a missing pool means the default
 * one).
 */
static void warm_up(struct kvk_module *m)
{
	struct kvk_copy_params cp = { 0 };
	struct kvk_csum_params sp = { 0 };
	void *cargs[] = { &cp }, *sargs[] = { &sp };
	CUmemPoolProps pp;
	CUdeviceptr buf;
	CUstream s;
	CUdevice dev;

	if (kvk_cu.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
		return;
	memset(&pp, 0, sizeof(pp));
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = dev;
	if (kvk_cu.cuMemPoolCreate(&m->args, &pp) == CUDA_SUCCESS) {
		cuuint64_t keep = UINT64_MAX;	/* never give memory back */

		kvk_cu.cuMemPoolSetAttribute(m->args, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
	} else {
		m->args = NULL;
	}
	if (kvk_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return;
	if (m->args &&
	    kvk_cu.cuMemAllocFromPoolAsync(&buf, KVK_ARGS_WARM, m->args, s) == CUDA_SUCCESS)
		kvk_cu.cuMemFreeAsync(buf, s);
	/* No segment, no page: the kernels return at once. */
	kvk_cu.cuLaunchKernel(m->copy, 1, 1, 1, KVK_THREADS, 1, 1, 0, s, cargs, NULL);
	kvk_cu.cuLaunchKernel(m->csum, 1, 1, 1, KVK_THREADS, 1, 1, 0, s, sargs, NULL);
	kvk_cu.cuStreamSynchronize(s);
	kvk_cu.cuStreamDestroy(s);
}

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
	warm_up(m);
	return 0;
}

void kvk_module_unload(struct kvk_module *m)
{
	if (m->args)
		kvk_cu.cuMemPoolDestroy(m->args);
	m->args = NULL;
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

static CUresult args_alloc(const struct kvk_module *m, CUdeviceptr *dev, size_t bytes,
			   CUstream stream)
{
	return m->args ? kvk_cu.cuMemAllocFromPoolAsync(dev, bytes, m->args, stream)
		       : kvk_cu.cuMemAllocAsync(dev, bytes, stream);
}

/*
 * The arguments are copied on the caller's stream: ordered for any kind of
 * stream (a synchronous copy would run on the legacy stream, which a
 * non-blocking stream does not wait for). From pageable memory the driver
 * stages the bytes before it returns, so `host` may be freed then. A GPU
 * without stream-ordered allocation (no memory pools: some vGPU set-ups)
 * gets a plain buffer, freed after waiting for the stream: correct, but
 * the caller's thread then blocks until the copies end.
 */
int kvk_args_upload(const struct kvk_module *m, const struct kvk_layout *l,
		    uint64_t slot_bytes, const uint32_t *pages, const int64_t *blocks,
		    size_t n, CUstream stream, struct kvk_args *a)
{
	const uint32_t halves = kvk_halves(l);
	size_t words = halves * (size_t)l->layers + 2 * n, j;
	uint64_t *host;
	CUresult r;
	uint32_t i;

	memset(a, 0, sizeof(*a));
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
	r = args_alloc(m, &a->dev, words * sizeof(*host), stream);
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		a->sync = 1;
		r = kvk_cu.cuMemAlloc(&a->dev, words * sizeof(*host));
	}
	if (r == CUDA_SUCCESS) {
		r = kvk_cu.cuMemcpyHtoDAsync(a->dev, host, words * sizeof(*host), stream);
		if (r != CUDA_SUCCESS)
			kvk_args_free(a, stream);
	}
	free(host);
	if (r != CUDA_SUCCESS) {
		a->dev = 0;
		return cu_errno(r);
	}
	a->layers = l->layers;
	a->halves = halves;
	return 0;
}

int kvk_copy_run(const struct kvk_module *m, enum kvk_dir dir, const struct kvk_layout *l,
		 CUdeviceptr pool, const struct kvk_args *a, uint32_t first, uint32_t count,
		 size_t n, CUstream stream)
{
	struct kvk_copy_params p;
	void *args[] = { &p };

	if (!n || !count)
		return 0;
	if (first >= a->layers || count > a->layers - first)
		return -EINVAL;
	memset(&p, 0, sizeof(p));
	p.halves = kvk_halves(l);
	if (p.halves != a->halves)
		return -EINVAL;
	p.pool = pool + (uint64_t)p.halves * first * l->page_half;
	p.half = l->half;
	p.page_half = l->page_half;
	p.rows = l->rows;
	p.row = l->row;
	p.page_row = l->page_row;
	p.page_off = l->page_off;
	p.segs = (uint64_t)n * p.halves * count;
	p.tensors = a->dev + (uint64_t)p.halves * first * sizeof(uint64_t);
	p.offs = a->dev + (uint64_t)p.halves * a->layers * sizeof(uint64_t);
	p.layers = count;
	p.dir = dir;
	return cu_errno(kvk_cu.cuLaunchKernel(m->copy, grid_for(p.segs), 1, 1, KVK_THREADS, 1, 1,
					      0, stream, args, NULL));
}

int kvk_args_free(struct kvk_args *a, CUstream stream)
{
	CUresult r = CUDA_SUCCESS;

	if (!a->dev)
		return 0;
	if (a->sync) {
		r = kvk_cu.cuStreamSynchronize(stream);
		kvk_cu.cuMemFree(a->dev);
	} else {
		/* After the launches queued on the stream. */
		kvk_cu.cuMemFreeAsync(a->dev, stream);
	}
	a->dev = 0;
	return cu_errno(r);
}

int kvk_copy_launch(const struct kvk_module *m, enum kvk_dir dir,
		    const struct kvk_layout *l, CUdeviceptr pool, uint64_t slot_bytes,
		    const uint32_t *pages, const int64_t *blocks, size_t n,
		    CUstream stream)
{
	struct kvk_args a;
	int rc, rc2;

	if (!n)
		return 0;
	if ((rc = kvk_args_upload(m, l, slot_bytes, pages, blocks, n, stream, &a)))
		return rc;
	rc = kvk_copy_run(m, dir, l, pool, &a, 0, l->layers, n, stream);
	rc2 = kvk_args_free(&a, stream);
	return rc ? rc : rc2;
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
	r = args_alloc(m, &dev, 2 * n * sizeof(uint64_t), stream);
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

static int reachable(uint64_t a, uint64_t span, int ordinal)
{
	CUdeviceptr ends[2] = { a, a + span - 1 };
	int k;

	for (k = 0; k < 2; k++) {
		unsigned int type = 0, flag = 0;
		int dev = -1;

		if (kvk_cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ends[k]) != CUDA_SUCCESS) {
			/* VMM memory (cuMemCreate: PyTorch's expandable
			 * segments) may answer only "mapped". */
			if (kvk_cu.cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_MAPPED, ends[k]) == CUDA_SUCCESS &&
			    flag)
				continue;
			return -EFAULT;
		}
		if (type != CU_MEMORYTYPE_DEVICE)
			continue;
		if (kvk_cu.cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_MANAGED, ends[k]) == CUDA_SUCCESS &&
		    flag)
			continue;
		/* Refuse only what is known to be elsewhere. */
		if (kvk_cu.cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ends[k]) == CUDA_SUCCESS &&
		    dev != ordinal)
			return -EXDEV;
	}
	return 0;
}

int kvk_tensors_check(const struct kvk_layout *l, int ordinal)
{
	uint64_t span = (l->num_blocks - 1) * l->block_stride + l->half;
	uint32_t i;
	int rc;

	if (l->kind == KVK_LAYOUT_FLASH)
		span += l->num_blocks * l->block_stride;
	for (i = 0; i < l->layers; i++) {
		if ((rc = reachable(kvk_tensor(l, i, 0), span, ordinal)))
			return rc;
		if (l->kind == KVK_LAYOUT_KV && (rc = reachable(kvk_tensor(l, i, 1), span, ordinal)))
			return rc;
	}
	return 0;
}

/* The words a layout is compared by: geometry, GPU, every tensor. */
static size_t check_words(const struct kvk_layout *l, int ordinal, uint64_t *w)
{
	size_t n = 0;
	uint32_t i;

	if (w) {
		w[0] = l->kind;
		w[1] = l->layers;
		w[2] = l->num_blocks;
		w[3] = l->block_stride;
		w[4] = l->half;
		w[5] = (uint64_t)(int64_t)ordinal;
	}
	n = 6;
	for (i = 0; i < l->layers; i++) {
		if (w)
			w[n] = kvk_tensor(l, i, 0),
			w[n + 1] = kvk_halves(l) == 2 ? kvk_tensor(l, i, 1) : 0;
		n += 2;
	}
	return n;
}

int kvk_tensors_check_cached(struct kvk_check_cache *cc, const struct kvk_layout *l,
			     int ordinal)
{
	size_t n = check_words(l, ordinal, NULL);
	uint64_t *w = malloc(n * sizeof(*w));
	bool same;
	int rc;

	if (!w)
		return -ENOMEM;
	check_words(l, ordinal, w);
	pthread_mutex_lock(&cc->lock);
	same = cc->words && cc->n == n && !memcmp(cc->words, w, n * sizeof(*w));
	pthread_mutex_unlock(&cc->lock);
	if (same) {
		free(w);
		return 0;
	}
	rc = kvk_tensors_check(l, ordinal);
	if (rc) {
		free(w);
		return rc;
	}
	pthread_mutex_lock(&cc->lock);
	free(cc->words);
	cc->words = w;
	cc->n = n;
	pthread_mutex_unlock(&cc->lock);
	return 0;
}

void kvk_check_cache_free(struct kvk_check_cache *cc)
{
	free(cc->words);
	cc->words = NULL;
	cc->n = 0;
}

int kvk_copy_pieces(enum kvk_dir dir, const struct kvk_layout *l, uint8_t *pool_host,
		    uint64_t slot_bytes, const uint32_t *pages, const int64_t *blocks,
		    size_t n, CUstream stream)
{
	uint64_t t;
	size_t j;
	uint32_t i;
	int s;

	for (j = 0; j < n; j++) {
		uint8_t *page = pool_host + (uint64_t)pages[j] * slot_bytes;

		for (i = 0; i < l->layers; i++)
			for (s = 0; s < (int)kvk_halves(l); s++)
				for (t = 0; t < l->rows; t++) {
					uint8_t *h = page + kvk_page_off(l, i, s) + t * l->page_row;
					CUdeviceptr d = kvk_tensor(l, i, s) +
							(uint64_t)blocks[j] * l->block_stride + t * l->row;
					CUresult r = dir == KVK_GATHER
							     ? kvk_cu.cuMemcpyHtoDAsync(d, h, l->row, stream)
							     : kvk_cu.cuMemcpyDtoHAsync(h, d, l->row, stream);

					if (r != CUDA_SUCCESS)
						return cu_errno(r);
				}
	}
	return 0;
}

_Static_assert(sizeof(CUdeviceptr) == sizeof(uint64_t), "device addresses are 64-bit");
#endif
