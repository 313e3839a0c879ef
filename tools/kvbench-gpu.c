// SPDX-License-Identifier: MIT
/*
 * kvbench-gpu.c - the page kernels' bandwidth next to the GPU's own copy
 * engine path, measured in the same run on the same GPU and printed as a
 * ratio (kvbench's rule: every figure next to its peer).
 *
 * What is timed (CUDA events on one stream, after a warm-up, over --iters
 * repetitions):
 *
 *   gather   kvk_copy_launch(KVK_GATHER): --blocks pool pages, each to a
 *            random engine block, all layers, K and V, in one launch; the
 *            kernel libkvclient's kvc_gather runs on a cuda pool.
 *   scatter  the same, engine -> pool (kvc_scatter).
 *   dtod     cuMemcpyDtoD of the same number of bytes, one contiguous
 *            range: the best case a plain copy gets, with none of the
 *            gather's scattering into layers x 2 x blocks pieces.
 *
 * GB/s are 1e9 bytes of KV copied (each byte read once and written once).
 * The target is gather >= 80% of dtod. Geometry defaults to Llama-3-8B
 * (32 layers, 8 kv heads, head dim 128, bf16, 16-token blocks: 2 MiB
 * pages, 32 KiB pieces). Exits 77, saying why, where there is no GPU.
 *
 *   kvbench-gpu [--gpu N] [--blocks N] [--iters N] [--layers N]
 *               [--kv-heads N] [--head-dim N] [--dtype N] [--block-tokens N]
 *               [--layout kv|flash]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cudadrv.h"
#include "../kernels/page_cuda.h"
#include "../kernels/page_ref.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: kvbench-gpu [--gpu N] [--blocks N] [--iters N] [--layers N] [--kv-heads N]\n"
		   "                   [--head-dim N] [--dtype N] [--block-tokens N] [--layout kv|flash]\n");
}

#ifdef KVC_HAVE_CUDA
#define CK(call)                                                                   \
	do {                                                                       \
		CUresult _r = (call);                                              \
		if (_r != CUDA_SUCCESS) {                                          \
			char _e[200];                                              \
			fprintf(stderr, "kvbench-gpu: %s\n", kvk_cu_err(_r, #call, _e, sizeof(_e))); \
			exit(1);                                                   \
		}                                                                  \
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

static double timed(CUstream s, int iters, int (*fn)(void *), void *arg)
{
	CUevent a, b;
	float ms = 0;
	int i;

	CK(kvk_cu.cuEventCreate(&a, CU_EVENT_DEFAULT));
	CK(kvk_cu.cuEventCreate(&b, CU_EVENT_DEFAULT));
	for (i = 0; i < 3; i++)	/* warm-up */
		if (fn(arg))
			exit(1);
	CK(kvk_cu.cuEventRecord(a, s));
	for (i = 0; i < iters; i++)
		if (fn(arg))
			exit(1);
	CK(kvk_cu.cuEventRecord(b, s));
	CK(kvk_cu.cuEventSynchronize(b));
	CK(kvk_cu.cuEventElapsedTime(&ms, a, b));
	kvk_cu.cuEventDestroy(a);
	kvk_cu.cuEventDestroy(b);
	return ms / 1e3 / iters;
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
};

static int copy_kernel(void *arg)
{
	struct run *r = arg;
	int rc = kvk_copy_launch(&r->mod, r->dir, &r->l, r->pool, r->page_bytes, r->pages,
				 r->blocks, r->n, r->s);

	if (rc)
		fprintf(stderr, "kvbench-gpu: kernel launch: %s\n", strerror(-rc));
	return rc;
}

static int copy_dtod(void *arg)
{
	struct run *r = arg;

	CK(kvk_cu.cuMemcpyDtoDAsync(r->dst, r->pool, r->bytes, r->s));
	return 0;
}
#endif

int main(int argc, char **argv)
{
	unsigned long gpu = 0, blocks = 256, iters = 20, layers = 32, heads = 8, dim = 128,
		      dtype = 2, bt = 16;
	const char *layout = "kv", *why = NULL;
	int i;

	for (i = 1; i < argc; i++) {
		unsigned long *v = NULL;
		char *end;

		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
			layout = argv[++i];
			if (strcmp(layout, "kv") && strcmp(layout, "flash")) {
				fprintf(stderr, "kvbench-gpu: --layout %s: must be kv or flash\n", layout);
				return 2;
			}
			continue;
		}
		if (!strcmp(argv[i], "--gpu")) v = &gpu;
		else if (!strcmp(argv[i], "--blocks")) v = &blocks;
		else if (!strcmp(argv[i], "--iters")) v = &iters;
		else if (!strcmp(argv[i], "--layers")) v = &layers;
		else if (!strcmp(argv[i], "--kv-heads")) v = &heads;
		else if (!strcmp(argv[i], "--head-dim")) v = &dim;
		else if (!strcmp(argv[i], "--dtype")) v = &dtype;
		else if (!strcmp(argv[i], "--block-tokens")) v = &bt;
		if (!v || i + 1 >= argc) {
			fprintf(stderr, "kvbench-gpu: %s: unknown option or missing value\n", argv[i]);
			usage(stderr);
			return 2;
		}
		*v = strtoul(argv[++i], &end, 10);
		if (*end || (v != &gpu && (!*v || *v > 65536))) {
			fprintf(stderr, "kvbench-gpu: %s %s: must be a number 1..65536\n", argv[i - 1], argv[i]);
			return 2;
		}
	}
	if (kvk_cuda_load(&why)) {
		printf("kvbench-gpu: skipped, no GPU: %s\n", why);
		return 77;
	}
#ifdef KVC_HAVE_CUDA
	{
		struct run r;
		CUdevice dev;
		CUcontext ctx;
		uint64_t *perm, half, tb, j;
		void **k, **v;
		char name[128] = "?";
		int count = 0;
		double t_g, t_s, t_d;

		if (kvk_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || (int)gpu >= count) {
			printf("kvbench-gpu: skipped, no GPU %lu: the driver sees %d\n", gpu, count);
			return 77;
		}
		memset(&r, 0, sizeof(r));
		CK(kvk_cu.cuDeviceGet(&dev, (int)gpu));
		kvk_cu.cuDeviceGetName(name, sizeof(name), dev);
		CK(kvk_cu.cuDevicePrimaryCtxRetain(&ctx, dev));
		CK(kvk_cu.cuCtxSetCurrent(ctx));
		CK(kvk_cu.cuStreamCreate(&r.s, CU_STREAM_NON_BLOCKING));
		if (kvk_module_load(&r.mod, &why)) {
			fprintf(stderr, "kvbench-gpu: %s\n", why);
			return 1;
		}
		half = (uint64_t)bt * heads * dim * dtype;
		r.page_bytes = half * 2 * layers;
		r.n = blocks;
		r.bytes = r.page_bytes * blocks;
		tb = half * blocks * (strcmp(layout, "flash") ? 1 : 2);
		CK(kvk_cu.cuMemAlloc(&r.pool, r.bytes));
		CK(kvk_cu.cuMemAlloc(&r.dst, r.bytes));
		CK(kvk_cu.cuMemsetD8(r.pool, 1, r.bytes));
		k = calloc(layers, sizeof(void *));
		v = calloc(layers, sizeof(void *));
		perm = malloc(blocks * sizeof(*perm));
		r.pages = malloc(blocks * sizeof(*r.pages));
		r.blocks = malloc(blocks * sizeof(*r.blocks));
		if (!k || !v || !perm || !r.pages || !r.blocks)
			return 1;
		for (j = 0; j < layers; j++) {
			CUdeviceptr p;

			CK(kvk_cu.cuMemAlloc(&p, tb));
			k[j] = (void *)(uintptr_t)p;
			if (strcmp(layout, "flash")) {
				CK(kvk_cu.cuMemAlloc(&p, tb));
				v[j] = (void *)(uintptr_t)p;
			}
		}
		shuffle(perm, blocks, 1);
		for (j = 0; j < blocks; j++)
			r.pages[j] = (uint32_t)perm[j];
		shuffle(perm, blocks, 2);
		for (j = 0; j < blocks; j++)
			r.blocks[j] = (int64_t)perm[j];
		r.l = (struct kvk_layout){ strcmp(layout, "flash") ? KVK_LAYOUT_KV : KVK_LAYOUT_FLASH,
					   (uint32_t)layers, blocks, half, half, k,
					   strcmp(layout, "flash") ? v : NULL };
		r.dir = KVK_GATHER;
		t_g = timed(r.s, (int)iters, copy_kernel, &r);
		r.dir = KVK_SCATTER;
		t_s = timed(r.s, (int)iters, copy_kernel, &r);
		t_d = timed(r.s, (int)iters, copy_dtod, &r);
		printf("kvbench-gpu: GPU %lu (%s), layout %s, %lu blocks x %llu-byte pages (%lu layers x 2 x %llu-byte pieces), %lu iterations\n",
		       gpu, name, layout, blocks, (unsigned long long)r.page_bytes, layers,
		       (unsigned long long)half, iters);
		printf("  dtod     %8.1f GB/s  (cuMemcpyDtoD, one %llu-byte range)\n",
		       r.bytes / t_d / 1e9, (unsigned long long)r.bytes);
		printf("  gather   %8.1f GB/s  %5.1f%% of dtod  (target >= 80%%: %s)\n",
		       r.bytes / t_g / 1e9, 100.0 * t_d / t_g, t_d / t_g >= 0.8 ? "met" : "MISSED");
		printf("  scatter  %8.1f GB/s  %5.1f%% of dtod\n", r.bytes / t_s / 1e9, 100.0 * t_d / t_s);
		return 0;
	}
#else
	return 77;
#endif
}
