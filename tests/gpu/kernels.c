// SPDX-License-Identifier: MIT
/*
 * kernels.c (GPU) - the CUDA page kernels against their CPU reference, on
 * a real GPU: gather and scatter in the engine layouts (KV, FLASH, and
 * MLA's one latent per token and layer) for the same odd geometries the
 * CPU tests use (1 layer, head_dim 1 to 256, dtype 2 and 4, padded
 * strides, partial runs, scattered engine block ids), for an engine that
 * holds every head and for each tensor-parallel rank's heads of a page
 * (the run per token row), compared byte for byte with kvk_ref_copy on
 * host copies of the same bytes; and
 * the device checksum against kvk_ref_checksum for aligned, unaligned and
 * odd-length pages. Skips, saying why, where there is no usable GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "../../kernels/page_cuda.h"
#include "../../kernels/page_ref.h"

static const char *missing;
static const char *broken;	/* a GPU is here but the kernels did not load */

#define SKIP_IF_NO_GPU()                                                   \
	do {                                                               \
		KVT_GPU_SKIP_IF_MISSING(missing);                          \
		if (broken)                                                \
			fail_msg("%s", broken);                            \
	} while (0)

#ifdef KVC_HAVE_CUDA
static CUstream stream;
static struct kvk_module mod;

static void fill(uint8_t *p, uint64_t n, uint64_t seed)
{
	uint64_t i, x = seed * 0x9e3779b97f4a7c15ull + 1;

	for (i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

static CUdeviceptr up(const void *h, uint64_t n)
{
	CUdeviceptr d;

	assert_int_equal(kvk_cu.cuMemAlloc(&d, n), CUDA_SUCCESS);
	assert_int_equal(kvk_cu.cuMemcpyHtoD(d, h, n), CUDA_SUCCESS);
	/* From pageable memory the copy may return before it lands, and the
	 * kernels run on a non-blocking stream: wait for it. */
	assert_int_equal(kvk_cu.cuCtxSynchronize(), CUDA_SUCCESS);
	return d;
}

static void down(void *h, CUdeviceptr d, uint64_t n)
{
	assert_int_equal(kvk_cu.cuMemcpyDtoH(h, d, n), CUDA_SUCCESS);
}

struct geo {
	uint32_t layers, kv_heads, head_dim, bt, dt;
};

/*
 * One geometry, one layout, one padding, the engine holding heads [h0, h0
 * + hn) of the page's: gather then scatter, GPU vs CPU; a partial run in
 * one launch, the whole run one launch per layer.
 */
static void compare_heads(const struct geo *g, uint32_t kind, uint64_t pad, uint32_t h0,
			  uint32_t hn)
{
	const uint32_t pages[] = { 9, 2, 5, 0 };
	const int64_t blocks[] = { 6, 0, 3, 7 };
	const uint64_t head = (uint64_t)g->head_dim * g->dt, halves = kind == KVK_LAYOUT_MLA ? 1 : 2;
	const uint64_t page_half = (uint64_t)g->bt * g->kv_heads * head;
	const uint64_t half = (uint64_t)g->bt * hn * head;
	const uint64_t slot = page_half * halves * g->layers + 8, n_pool = 10, nb = 8;
	const uint64_t stride = half + pad, tb = nb * stride * (kind == KVK_LAYOUT_FLASH ? 2 : 1);
	uint8_t *pool_h = malloc(n_pool * slot), *pool_g = malloc(n_pool * slot);
	uint8_t **k_h = calloc(g->layers, sizeof(void *)), **v_h = calloc(g->layers, sizeof(void *));
	void **k_d = calloc(g->layers, sizeof(void *)), **v_d = calloc(g->layers, sizeof(void *));
	uint8_t *back = malloc(tb);
	struct kvk_layout lh, ld;
	CUdeviceptr pool_d;
	uint32_t l;
	int dir;

	assert_non_null(pool_h);
	assert_non_null(pool_g);
	assert_non_null(back);
	for (dir = KVK_GATHER; dir <= KVK_SCATTER; dir++) {
		/* Partial run of 3 blocks first, then all 4 (block 3 last). */
		for (size_t n = 3; n <= 4; n++) {
			fill(pool_h, n_pool * slot, 1 + dir + n);
			for (l = 0; l < g->layers; l++) {
				k_h[l] = malloc(tb);
				fill(k_h[l], tb, 100 + l + n);
				k_d[l] = (void *)(uintptr_t)up(k_h[l], tb);
				if (kind == KVK_LAYOUT_KV) {
					v_h[l] = malloc(tb);
					fill(v_h[l], tb, 200 + l + n);
					v_d[l] = (void *)(uintptr_t)up(v_h[l], tb);
				}
			}
			pool_d = up(pool_h, n_pool * slot);
			lh = (struct kvk_layout){ .kind = kind, .layers = g->layers, .num_blocks = nb,
						  .block_stride = stride, .half = half,
						  .k = (void *const *)k_h,
						  .v = kind == KVK_LAYOUT_KV ? (void *const *)v_h : NULL };
			kvk_layout_whole(&lh);
			lh.page_half = page_half;
			if (hn < g->kv_heads) {	/* a rank's heads: a run per token */
				lh.rows = g->bt;
				lh.row = hn * head;
				lh.page_row = g->kv_heads * head;
				lh.page_off = h0 * head;
			}
			ld = lh;
			ld.k = k_d;
			ld.v = kind == KVK_LAYOUT_KV ? v_d : NULL;
			if (n == 3) {
				assert_int_equal(kvk_copy_launch(&mod, (enum kvk_dir)dir, &ld, pool_d, slot,
								 pages, blocks, n, stream), 0);
			} else {	/* one upload, one launch per layer, last layer first */
				struct kvk_args a;

				assert_int_equal(kvk_args_upload(&mod, &ld, slot, pages, blocks, n, stream, &a), 0);
				for (l = g->layers; l-- > 0;)
					assert_int_equal(kvk_copy_run(&mod, (enum kvk_dir)dir, &ld, pool_d, &a, l, 1,
								      n, stream), 0);
				assert_int_equal(kvk_copy_run(&mod, (enum kvk_dir)dir, &ld, pool_d, &a, 0,
							      g->layers + 1, n, stream), -EINVAL);
				assert_int_equal(kvk_args_free(&a, stream), 0);
			}
			kvk_ref_copy((enum kvk_dir)dir, &lh, pool_h, slot, pages, blocks, n);
			assert_int_equal(kvk_cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
			down(pool_g, pool_d, n_pool * slot);
			assert_memory_equal(pool_g, pool_h, n_pool * slot);
			for (l = 0; l < g->layers; l++) {
				down(back, (CUdeviceptr)(uintptr_t)k_d[l], tb);
				assert_memory_equal(back, k_h[l], tb);
				kvk_cu.cuMemFree((CUdeviceptr)(uintptr_t)k_d[l]);
				free(k_h[l]);
				if (kind == KVK_LAYOUT_KV) {
					down(back, (CUdeviceptr)(uintptr_t)v_d[l], tb);
					assert_memory_equal(back, v_h[l], tb);
					kvk_cu.cuMemFree((CUdeviceptr)(uintptr_t)v_d[l]);
					free(v_h[l]);
				}
			}
			kvk_cu.cuMemFree(pool_d);
		}
	}
	free(pool_h);
	free(pool_g);
	free(back);
	free(k_h);
	free(v_h);
	free(k_d);
	free(v_d);
}

/* Every head, then (K/V pages) each rank's heads of every split of them. */
static void compare(const struct geo *g, uint32_t kind, uint64_t pad)
{
	uint32_t tp, r;

	compare_heads(g, kind, pad, 0, g->kv_heads);
	for (tp = 2; kind != KVK_LAYOUT_MLA && tp <= g->kv_heads; tp++)
		for (r = 0; g->kv_heads % tp == 0 && r < tp; r++)
			compare_heads(g, kind, pad, r * (g->kv_heads / tp), g->kv_heads / tp);
}

static const struct geo geos[] = {
	{ 1, 1, 64, 16, 2 }, { 1, 2, 128, 16, 4 }, { 3, 2, 64, 16, 2 }, { 2, 1, 256, 8, 2 },
	{ 2, 3, 128, 4, 4 }, { 1, 1, 1, 1, 2 }, { 5, 1, 3, 3, 2 }, { 4, 8, 128, 16, 2 },
	/* 12-byte halves: the 4-byte copy path, which no geometry above takes */
	{ 1, 1, 3, 1, 4 },
};
#endif

static void test_copy_matches_reference(void **state)
{
	(void)state;
	SKIP_IF_NO_GPU();
#ifdef KVC_HAVE_CUDA
	for (size_t i = 0; i < sizeof(geos) / sizeof(geos[0]); i++) {
		compare(&geos[i], KVK_LAYOUT_KV, 0);
		compare(&geos[i], KVK_LAYOUT_FLASH, 0);
		compare(&geos[i], KVK_LAYOUT_KV, 24);
		compare(&geos[i], KVK_LAYOUT_FLASH, 5);	/* unaligned blocks */
	}
#endif
}

static void test_mla_copy_matches_reference(void **state)
{
	(void)state;
	SKIP_IF_NO_GPU();
#ifdef KVC_HAVE_CUDA
	for (size_t i = 0; i < sizeof(geos) / sizeof(geos[0]); i++) {
		struct geo g = geos[i];

		g.kv_heads = 1;	/* one latent per token and layer */
		compare(&g, KVK_LAYOUT_MLA, 0);
		compare(&g, KVK_LAYOUT_MLA, 6);
	}
	{
		/* DeepSeek-V3's latent: kv_lora_rank 512 + rope 64, bf16. */
		const struct geo ds = { 2, 1, 576, 16, 2 };

		compare(&ds, KVK_LAYOUT_MLA, 0);
	}
#endif
}

static void test_checksum_matches_reference(void **state)
{
	(void)state;
	SKIP_IF_NO_GPU();
#ifdef KVC_HAVE_CUDA
	{
		static const uint64_t sizes[] = { 8, 13, 4096, 6149, 2u << 20 };
		const uint64_t big = (2u << 20) + 64;
		uint8_t *h = malloc(big);
		CUdeviceptr d, addrs[3];
		uint64_t out[3];

		assert_non_null(h);
		fill(h, big, 42);
		d = up(h, big);
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			uint64_t n = sizes[i];

			/* Aligned, 3 bytes in (unaligned) and 8 bytes in. */
			addrs[0] = d;
			addrs[1] = d + 3;
			addrs[2] = d + 8;
			assert_int_equal(kvk_csum_run(&mod, addrs, 3, n, out, stream), 0);
			assert_true(out[0] == kvk_ref_checksum(h, n));
			assert_true(out[1] == kvk_ref_checksum(h + 3, n));
			assert_true(out[2] == kvk_ref_checksum(h + 8, n));
		}
		kvk_cu.cuMemFree(d);
		free(h);
	}
#endif
}

static int setup(void **state)
{
	(void)state;
	missing = kvt_gpu_missing();
#ifdef KVC_HAVE_CUDA
	if (!missing) {
		const char *why = NULL;

		if (kvt_gpu_enter(0, &stream))
			broken = "cannot enter GPU 0's primary context";
		else if (kvk_module_load(&mod, &why))
			broken = why;
	}
#endif
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copy_matches_reference),
		cmocka_unit_test(test_mla_copy_matches_reference),
		cmocka_unit_test(test_checksum_matches_reference),
	};

	return cmocka_run_group_tests_name("gpu/kernels", tests, setup, NULL);
}
