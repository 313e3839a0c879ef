// SPDX-License-Identifier: MIT
/*
 * gpucopy.c - gather/scatter kernels vs cuMemcpyDtoD (see gpucopy.h).
 * Linked into kvbench (gpu mode) and kvbench-gpu; no kvbench helpers here.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cudadrv.h"
#include "../../kernels/page_cuda.h"
#include "../../kernels/page_ref.h"
#include "gpucopy.h"

#ifdef KVC_HAVE_CUDA
/* A failed driver call: its error into why, then to the cleanup. */
#define CK(call)                                                               \
	do {                                                                   \
		CUresult _r = (call);                                          \
		if (_r != CUDA_SUCCESS) {                                      \
			kvk_cu_err(_r, #call, why, whylen);                    \
			goto out;                                              \
		}                                                              \
	} while (0)

static void shuffle(uint64_t *a, uint64_t n, uint64_t seed)
{
	uint64_t i;

	for (i = 0; i < n; i++)
		a[i] = i;
	for (i = n - 1; i > 0; i--) {
		uint64_t j, t;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		j = (seed >> 33) % (i + 1);
		t = a[i];
		a[i] = a[j];
		a[j] = t;
	}
}

struct run {
	struct kvk_module mod;
	struct kvk_layout l;
	CUdeviceptr pool, dst;
	uint64_t page_bytes, n, bytes;
	uint32_t *pages;
	int64_t *blocks;
	CUstream s;
	enum kvk_dir dir;
	char *why;
	size_t whylen;
};

static int copy_kernel(struct run *r)
{
	int rc = kvk_copy_launch(&r->mod, r->dir, &r->l, r->pool, r->page_bytes, r->pages,
				 r->blocks, r->n, r->s);

	if (rc)
		snprintf(r->why, r->whylen, "kernel launch: %s", strerror(-rc));
	return rc;
}

static int copy_dtod(struct run *r)
{
	CUresult rc = kvk_cu.cuMemcpyDtoDAsync(r->dst, r->pool, r->bytes, r->s);

	if (rc != CUDA_SUCCESS) {
		kvk_cu_err(rc, "cuMemcpyDtoDAsync", r->why, r->whylen);
		return -EIO;
	}
	return 0;
}

/* Seconds per pass of fn, or a negative value (why set). */
static double timed(struct run *r, int iters, int (*fn)(struct run *))
{
	char *why = r->why;
	size_t whylen = r->whylen;
	CUevent a = NULL, b = NULL;
	double t = -1;
	float ms = 0;
	int i;

	CK(kvk_cu.cuEventCreate(&a, CU_EVENT_DEFAULT));
	CK(kvk_cu.cuEventCreate(&b, CU_EVENT_DEFAULT));
	for (i = 0; i < 3; i++)	/* warm-up */
		if (fn(r))
			goto out;
	CK(kvk_cu.cuEventRecord(a, r->s));
	for (i = 0; i < iters; i++)
		if (fn(r))
			goto out;
	CK(kvk_cu.cuEventRecord(b, r->s));
	CK(kvk_cu.cuEventSynchronize(b));
	CK(kvk_cu.cuEventElapsedTime(&ms, a, b));
	t = ms / 1e3 / iters;
out:
	if (a)
		kvk_cu.cuEventDestroy(a);
	if (b)
		kvk_cu.cuEventDestroy(b);
	return t;
}
#endif

int gpucopy_run(const struct gpucopy_cfg *c, struct gpucopy_res *res, char *why, size_t whylen)
{
	const char *w = NULL;

	memset(res, 0, sizeof(*res));
	if (kvk_cuda_load(&w)) {
		snprintf(why, whylen, "%s", w);
		return 1;
	}
#ifdef KVC_HAVE_CUDA
	{
		struct run r;
		CUdevice dev = 0;
		CUcontext ctx = NULL;
		uint64_t *perm = NULL, tb, j;
		void **k = NULL, **v = NULL;
		int count = 0, rc = -1, mod = 0;

		memset(&r, 0, sizeof(r));
		r.why = why;
		r.whylen = whylen;
		if (kvk_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || (int)c->gpu >= count) {
			snprintf(why, whylen, "no GPU %lu: the driver sees %d", c->gpu, count);
			return 1;
		}
		CK(kvk_cu.cuDeviceGet(&dev, (int)c->gpu));
		snprintf(res->gpu_name, sizeof(res->gpu_name), "?");
		kvk_cu.cuDeviceGetName(res->gpu_name, sizeof(res->gpu_name), dev);
		CK(kvk_cu.cuDevicePrimaryCtxRetain(&ctx, dev));
		CK(kvk_cu.cuCtxSetCurrent(ctx));
		CK(kvk_cu.cuStreamCreate(&r.s, CU_STREAM_NON_BLOCKING));
		if (kvk_module_load(&r.mod, &w)) {
			snprintf(why, whylen, "%s", w);
			goto out;
		}
		mod = 1;
		res->half = (uint64_t)c->bt * c->heads * c->dim * c->dtype;
		r.page_bytes = res->page_bytes = res->half * 2 * c->layers;
		r.n = c->blocks;
		r.bytes = res->bytes = r.page_bytes * c->blocks;
		tb = res->half * c->blocks * (c->flash ? 2 : 1);
		k = calloc(c->layers, sizeof(void *));
		v = calloc(c->layers, sizeof(void *));
		perm = malloc(c->blocks * sizeof(*perm));
		r.pages = malloc(c->blocks * sizeof(*r.pages));
		r.blocks = malloc(c->blocks * sizeof(*r.blocks));
		if (!k || !v || !perm || !r.pages || !r.blocks) {
			snprintf(why, whylen, "out of memory");
			goto out;
		}
		CK(kvk_cu.cuMemAlloc(&r.pool, r.bytes));
		CK(kvk_cu.cuMemAlloc(&r.dst, r.bytes));
		CK(kvk_cu.cuMemsetD8(r.pool, 1, r.bytes));
		for (j = 0; j < c->layers; j++) {
			CUdeviceptr p;

			CK(kvk_cu.cuMemAlloc(&p, tb));
			k[j] = (void *)(uintptr_t)p;
			if (!c->flash) {
				CK(kvk_cu.cuMemAlloc(&p, tb));
				v[j] = (void *)(uintptr_t)p;
			}
		}
		shuffle(perm, c->blocks, 1);
		for (j = 0; j < c->blocks; j++)
			r.pages[j] = (uint32_t)perm[j];
		shuffle(perm, c->blocks, 2);
		for (j = 0; j < c->blocks; j++)
			r.blocks[j] = (int64_t)perm[j];
		r.l = (struct kvk_layout){ .kind = c->flash ? KVK_LAYOUT_FLASH : KVK_LAYOUT_KV,
					   .layers = (uint32_t)c->layers, .num_blocks = c->blocks,
					   .block_stride = res->half, .half = res->half, .k = k,
					   .v = c->flash ? NULL : v };
		kvk_layout_whole(&r.l);
		r.dir = KVK_GATHER;
		if ((res->gather_s = timed(&r, (int)c->iters, copy_kernel)) < 0)
			goto out;
		r.dir = KVK_SCATTER;
		if ((res->scatter_s = timed(&r, (int)c->iters, copy_kernel)) < 0)
			goto out;
		if ((res->dtod_s = timed(&r, (int)c->iters, copy_dtod)) < 0)
			goto out;
		rc = 0;
out:
		if (r.s)
			kvk_cu.cuStreamSynchronize(r.s);
		for (j = 0; k && j < c->layers; j++) {
			if (k[j])
				kvk_cu.cuMemFree((CUdeviceptr)(uintptr_t)k[j]);
			if (v && v[j])
				kvk_cu.cuMemFree((CUdeviceptr)(uintptr_t)v[j]);
		}
		if (r.pool)
			kvk_cu.cuMemFree(r.pool);
		if (r.dst)
			kvk_cu.cuMemFree(r.dst);
		if (mod)
			kvk_module_unload(&r.mod);
		if (r.s)
			kvk_cu.cuStreamDestroy(r.s);
		if (ctx)
			kvk_cu.cuDevicePrimaryCtxRelease(dev);
		free(k);
		free(v);
		free(perm);
		free(r.pages);
		free(r.blocks);
		return rc;
	}
#else
	(void)c;
	return 1;
#endif
}
