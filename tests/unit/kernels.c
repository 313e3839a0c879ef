// SPDX-License-Identifier: MIT
/*
 * kernels.c - unit tests for kernels/page_ref.c, the CPU reference of the
 * page kernels (the host pool runs it; the GPU tests hold the CUDA kernels
 * to it).
 *
 * The expected placement of every byte is computed here element by
 * element, (layer, k|v, token, kv_head, head_dim, byte), from the layouts
 * kvclient.h and page_ref.h document, not from the code under test. Each
 * geometry is checked in the three engine layouts (KV, FLASH; MLA, one
 * latent per token and layer), in both directions, for partial runs,
 * non-contiguous and reversed engine block ids, padded block strides
 * (padding must stay untouched), pages the run does not name (must stay
 * untouched), and a tensor-parallel rank's heads: an engine that holds
 * heads [h0, h0 + hn) of the page's (the page's other heads must stay
 * untouched by a scatter). The checksum has known answers computed outside
 * this code base (a few lines of Python over the documented definition).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/page_ref.h"

struct geo {
	uint32_t layers, kv_heads, head_dim, bt, dt;
};

static uint8_t pool_byte(uint32_t page, uint64_t off)
{
	return (uint8_t)(page * 131u + off * 7u + (off >> 8) + 1u);
}

static uint8_t eng_byte(uint32_t layer, int s, uint64_t off)
{
	return (uint8_t)(0xa5u ^ (layer * 29u + (uint32_t)s * 101u + off * 13u + (off >> 9)));
}

/* The heads an engine holds of a page's: [h0, h0 + hn). */
struct part {
	uint32_t h0, hn;
};

static uint32_t halves_of(uint32_t kind)
{
	return kind == KVK_LAYOUT_MLA ? 1 : 2;
}

struct engine {
	uint32_t kind;
	struct part pt;
	uint64_t num_blocks, stride, tensor_bytes;
	uint8_t **k, **v;
	struct kvk_layout l;
};

static void engine_fill(struct engine *e, const struct geo *g)
{
	uint32_t i;
	uint64_t o;

	for (i = 0; i < g->layers; i++)
		for (o = 0; o < e->tensor_bytes; o++) {
			if (e->kind == KVK_LAYOUT_FLASH) {
				e->k[i][o] = eng_byte(i, o >= e->num_blocks * e->stride, o);
			} else {
				e->k[i][o] = eng_byte(i, 0, o);
				if (e->v[i])
					e->v[i][o] = eng_byte(i, 1, o);
			}
		}
}

static void engine_new(struct engine *e, const struct geo *g, uint32_t kind, struct part pt,
		       uint64_t num_blocks, uint64_t pad)
{
	const uint64_t head = (uint64_t)g->head_dim * g->dt;
	uint32_t i;

	memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->pt = pt;
	e->num_blocks = num_blocks;
	e->stride = (uint64_t)g->bt * pt.hn * head + pad;
	e->tensor_bytes = num_blocks * e->stride * (kind == KVK_LAYOUT_FLASH ? 2 : 1);
	e->k = calloc(g->layers, sizeof(*e->k));
	e->v = calloc(g->layers, sizeof(*e->v));
	assert_non_null(e->k);
	assert_non_null(e->v);
	for (i = 0; i < g->layers; i++) {
		e->k[i] = malloc(e->tensor_bytes);
		assert_non_null(e->k[i]);
		if (kind == KVK_LAYOUT_KV) {
			e->v[i] = malloc(e->tensor_bytes);
			assert_non_null(e->v[i]);
		}
	}
	engine_fill(e, g);
	e->l.kind = kind;
	e->l.layers = g->layers;
	e->l.num_blocks = num_blocks;
	e->l.block_stride = e->stride;
	e->l.half = (uint64_t)g->bt * pt.hn * head;
	kvk_layout_whole(&e->l);
	e->l.page_half = (uint64_t)g->bt * g->kv_heads * head;
	if (pt.hn < g->kv_heads) {	/* a rank's heads: a run per token */
		e->l.rows = g->bt;
		e->l.row = pt.hn * head;
		e->l.page_row = g->kv_heads * head;
		e->l.page_off = pt.h0 * head;
	}
	e->l.k = (void *const *)e->k;
	e->l.v = kind == KVK_LAYOUT_KV ? (void *const *)e->v : NULL;
}

static void engine_free(struct engine *e, const struct geo *g)
{
	uint32_t i;

	for (i = 0; i < g->layers; i++) {
		free(e->k[i]);
		free(e->v[i]);
	}
	free(e->k);
	free(e->v);
}

/* Address of element byte (layer, s, token, head, dim, byte) of engine
 * block b, from the documented engine layouts. */
static uint8_t *eng_at(const struct engine *e, const struct geo *g, uint32_t layer, int s,
		       int64_t b, uint32_t t, uint32_t h, uint32_t d, uint32_t x)
{
	uint64_t in = (((uint64_t)t * e->pt.hn + h) * g->head_dim + d) * g->dt + x;

	if (e->kind == KVK_LAYOUT_FLASH)
		return e->k[layer] + (uint64_t)s * e->num_blocks * e->stride +
		       (uint64_t)b * e->stride + in;
	return (s ? e->v[layer] : e->k[layer]) + (uint64_t)b * e->stride + in;
}

/* Offset of the same element (h: the page's head) in a pool page:
 * [layer][k|v][token][head][dim], or [layer][token][dim] for MLA. */
static uint64_t pool_off(const struct geo *g, uint32_t kind, uint32_t layer, int s, uint32_t t,
			 uint32_t h, uint32_t d, uint32_t x)
{
	return ((((((uint64_t)layer * halves_of(kind) + (uint64_t)s) * g->bt + t) * g->kv_heads +
		   h) * g->head_dim + d) * g->dt) + x;
}

static uint64_t page_bytes(const struct geo *g, uint32_t kind)
{
	return (uint64_t)g->bt * g->layers * halves_of(kind) * g->kv_heads * g->head_dim * g->dt;
}

/* Is page byte o one of the engine's heads' (a scatter writes it)? */
static bool rank_byte(const struct geo *g, struct part pt, uint64_t o)
{
	uint64_t head = (uint64_t)g->head_dim * g->dt, h = o / head % g->kv_heads;

	return h >= pt.h0 && h < pt.h0 + pt.hn;
}

/* Is engine block b named in blocks[0..n)? Its index, else -1. */
static long named(const int64_t *blocks, size_t n, int64_t b)
{
	size_t j;

	for (j = 0; j < n; j++)
		if (blocks[j] == b)
			return (long)j;
	return -1;
}

/*
 * Gather the run into the engine and check every engine byte, then scatter
 * it back into zeroed pages and check every pool byte.
 */
static void roundtrip(const struct geo *g, uint32_t kind, struct part pt, uint64_t num_blocks,
		      uint64_t pad, uint32_t n_pool, const uint32_t *pages, const int64_t *blocks,
		      size_t n)
{
	const uint64_t slot = page_bytes(g, kind) + 64;	/* slots may be larger */
	uint8_t *pool = malloc(n_pool * slot);
	struct engine e;
	uint32_t layer, t, h, d, x, p;
	uint64_t o;
	int64_t b;
	int s;

	assert_non_null(pool);
	for (p = 0; p < n_pool; p++)
		for (o = 0; o < slot; o++)
			pool[p * slot + o] = pool_byte(p, o);
	engine_new(&e, g, kind, pt, num_blocks, pad);
	assert_int_equal(kvk_layout_check(&e.l, NULL), 0);

	kvk_ref_copy(KVK_GATHER, &e.l, pool, slot, pages, blocks, n);
	for (layer = 0; layer < g->layers; layer++)
		for (s = 0; s < (int)halves_of(kind); s++)
			for (b = 0; b < (int64_t)num_blocks; b++) {
				long j = named(blocks, n, b);

				for (t = 0; t < g->bt; t++)
					for (h = 0; h < pt.hn; h++)
						for (d = 0; d < g->head_dim; d++)
							for (x = 0; x < g->dt; x++) {
								uint8_t *a = eng_at(&e, g, layer, s, b, t, h, d, x);
								uint8_t want = j < 0 ?
									eng_byte(layer, s, (uint64_t)(a - (s && kind == KVK_LAYOUT_KV ? e.v[layer] : e.k[layer]))) :
									pool_byte(pages[j], pool_off(g, kind, layer, s, t, pt.h0 + h, d, x));

								if (*a != want)
									fail_msg("gather: layer %u %s block %lld token %u head %u dim %u byte %u: %#x, want %#x",
										 layer, s ? "V" : "K", (long long)b, t, h, d, x, *a, want);
							}
				/* The padding after each block is never written. */
				for (o = e.stride - pad; o < e.stride; o++) {
					uint8_t *base = kind == KVK_LAYOUT_FLASH ? e.k[layer] + (uint64_t)s * num_blocks * e.stride :
							(s ? e.v[layer] : e.k[layer]);
					uint64_t off = (uint64_t)(base - (s && kind == KVK_LAYOUT_KV ? e.v[layer] : e.k[layer])) +
						       (uint64_t)b * e.stride + o;

					assert_int_equal(base[(uint64_t)b * e.stride + o], eng_byte(layer, s, off));
				}
			}

	/* Scatter back into zeroed pages: the named pages get exactly what
	 * they held before in the engine's heads, byte for byte (the other
	 * heads and the slot tail stay zero); the others stay zero. */
	memset(pool, 0, n_pool * slot);
	kvk_ref_copy(KVK_SCATTER, &e.l, pool, slot, pages, blocks, n);
	for (p = 0; p < n_pool; p++) {
		long j = -1;
		size_t q;

		for (q = 0; q < n; q++)
			if (pages[q] == p)
				j = (long)q;
		for (o = 0; o < slot; o++) {
			uint8_t want = j >= 0 && o < page_bytes(g, kind) && rank_byte(g, pt, o) ?
				       pool_byte(p, o) : 0;

			if (pool[p * slot + o] != want)
				fail_msg("scatter: page %u byte %llu: %#x, want %#x", p,
					 (unsigned long long)o, pool[p * slot + o], want);
		}
	}
	engine_free(&e, g);
	free(pool);
}

static const struct geo geos[] = {
	{ 1, 1, 64, 16, 2 },	/* 1 layer */
	{ 1, 2, 128, 16, 4 },
	{ 3, 2, 64, 16, 2 },
	{ 2, 1, 256, 8, 2 },
	{ 2, 3, 128, 4, 4 },
	{ 1, 1, 1, 1, 2 },	/* the smallest: 4-byte pages */
	{ 5, 1, 3, 3, 2 },	/* nothing aligned */
};

/* Every head, and (for K/V pages of several heads) each rank's of every
 * tensor-parallel split of them. */
static void run_geo(const struct geo *g, uint32_t kind, uint64_t pad, const uint32_t *pages,
		    const int64_t *blocks, size_t n)
{
	const struct part all = { 0, g->kv_heads };
	uint32_t tp, r;

	roundtrip(g, kind, all, 8, pad, 10, pages, blocks, n);
	for (tp = 2; kind != KVK_LAYOUT_MLA && tp <= g->kv_heads; tp++)
		for (r = 0; r < tp && g->kv_heads % tp == 0; r++) {
			struct part pt = { r * (g->kv_heads / tp), g->kv_heads / tp };

			roundtrip(g, kind, pt, 8, pad, 10, pages, blocks, n);
		}
}

static void run_all(uint32_t kind, uint64_t pad)
{
	/* Pool pages 9, 2, 5 (not in order) go to engine blocks 6, 0, 3:
	 * non-contiguous, not monotonic; 7 pool pages, 8 engine blocks. */
	const uint32_t pages[] = { 9, 2, 5 };
	const int64_t blocks[] = { 6, 0, 3 };
	const uint32_t one_page[] = { 4 };
	const int64_t last_block[] = { 7 };
	const uint32_t rev_pages[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	const int64_t rev_blocks[] = { 7, 6, 5, 4, 3, 2, 1, 0 };
	size_t i;

	for (i = 0; i < sizeof(geos) / sizeof(geos[0]); i++) {
		struct geo g = geos[i];

		if (kind == KVK_LAYOUT_MLA)	/* one latent: kv_heads 1 */
			g.kv_heads = 1;
		run_geo(&g, kind, pad, pages, blocks, 3);
		run_geo(&g, kind, pad, one_page, last_block, 1);	/* partial run */
		run_geo(&g, kind, pad, rev_pages, rev_blocks, 8);	/* whole cache */
		run_geo(&g, kind, pad, pages, blocks, 0);		/* empty run */
	}
}

static void test_kv_layout_roundtrip(void **state)
{
	(void)state;
	run_all(KVK_LAYOUT_KV, 0);
}

static void test_flash_layout_roundtrip(void **state)
{
	(void)state;
	run_all(KVK_LAYOUT_FLASH, 0);
}

static void test_padded_stride_roundtrip(void **state)
{
	(void)state;
	run_all(KVK_LAYOUT_KV, 24);
	run_all(KVK_LAYOUT_FLASH, 3);
	run_all(KVK_LAYOUT_MLA, 5);
}

static void test_mla_layout_roundtrip(void **state)
{
	(void)state;
	run_all(KVK_LAYOUT_MLA, 0);
}

/* A rank's heads of a page at TP 2 and 4 (the geometries above have at
 * most 3 heads): 8 heads, every split. */
static void test_rank_heads_roundtrip(void **state)
{
	const struct geo g = { 2, 8, 16, 16, 2 };
	const uint32_t pages[] = { 9, 2, 5 };
	const int64_t blocks[] = { 6, 0, 3 };
	uint32_t tp, r;

	(void)state;
	for (tp = 1; tp <= 8; tp *= 2)
		for (r = 0; r < tp; r++) {
			struct part pt = { r * (8 / tp), 8 / tp };

			roundtrip(&g, KVK_LAYOUT_KV, pt, 8, 0, 10, pages, blocks, 3);
			roundtrip(&g, KVK_LAYOUT_FLASH, pt, 8, 32, 10, pages, blocks, 3);
		}
}

static void test_layout_check(void **state)
{
	uint8_t a[64], b[64];
	void *k[2] = { a, b }, *v[2] = { b, a }, *hole[2] = { a, NULL };
	struct kvk_layout l = { .kind = KVK_LAYOUT_KV, .layers = 2, .num_blocks = 2,
				.block_stride = 32, .half = 32, .k = k, .v = v };
	const char *why = NULL;

	(void)state;
	kvk_layout_whole(&l);
	assert_int_equal(kvk_layout_check(&l, &why), 0);
	assert_int_equal(kvk_layout_check(NULL, &why), -EINVAL);
	l.kind = 4;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	assert_string_equal(why, "layout kind is neither KV, FLASH nor MLA");
	l.kind = KVK_LAYOUT_MLA;	/* one tensor a layer: no V */
	assert_int_equal(kvk_layout_check(&l, &why), 0);
	/* A rank's runs: 4 of 8 bytes, in page rows of 16 at 8. */
	l.rows = 4;
	l.row = 8;
	l.page_row = 16;
	l.page_off = 8;
	l.page_half = 64;
	assert_int_equal(kvk_layout_check(&l, &why), 0);
	l.page_off = 9;	/* past its row */
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	assert_string_equal(why, "the rank's runs do not lie within a page's rows");
	l.page_off = 8;
	l.page_half = 63;	/* rows past the page's half */
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	l.page_half = 64;
	l.row = 7;	/* runs that do not make a block */
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	assert_string_equal(why, "a block's runs do not make one block");
	l.rows = UINT64_MAX / 4;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	kvk_layout_whole(&l);
	l.kind = KVK_LAYOUT_KV;
	l.block_stride = 31;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	assert_string_equal(why, "block stride is smaller than one block");
	l.block_stride = 32;
	l.v = hole;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	assert_string_equal(why, "a layer's V tensor is NULL");
	l.v = NULL;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	l.kind = KVK_LAYOUT_FLASH;	/* FLASH needs no V */
	assert_int_equal(kvk_layout_check(&l, &why), 0);
	l.num_blocks = UINT64_MAX / 40;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	assert_string_equal(why, "num_blocks x block stride overflows");
	l.num_blocks = 0;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	l.num_blocks = 2;
	l.layers = 0;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
	l.layers = 2;
	l.k = hole;
	assert_int_equal(kvk_layout_check(&l, &why), -EINVAL);
}

static void test_checksum_known_answers(void **state)
{
	uint8_t b[4096] = { 0 };
	size_t i;

	(void)state;
	/* Computed outside this code base from the definition in page_ref.h. */
	assert_true(kvk_ref_checksum(b, 0) == 0);
	memset(b, 0, 8);
	assert_true(kvk_ref_checksum(b, 8) == 0x9dfc015645578971ull);
	assert_true(kvk_ref_checksum("abc", 3) == 0xfcf492274d27a84aull);
	assert_true(kvk_ref_checksum("kvcached page", 13) == 0x2458bb377330c1dcull);
	for (i = 0; i < 256; i++)
		b[i] = (uint8_t)i;
	assert_true(kvk_ref_checksum(b, 256) == 0x5c86857194bfa4efull);
	for (i = 0; i < 4096; i++)
		b[i] = (uint8_t)(i * 7 + 3);
	assert_true(kvk_ref_checksum(b, 4096) == 0xa0863c3f20476216ull);
}

static void test_checksum_properties(void **state)
{
	uint8_t b[4096], c[4096];
	uint64_t base, w0, w1, s = 0;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(b); i++)
		b[i] = (uint8_t)(i * 31 + 5);
	base = kvk_ref_checksum(b, sizeof(b));
	/* Any single bit flip anywhere changes it (fmix64 is a bijection). */
	for (i = 0; i < sizeof(b) * 8; i += 13) {
		memcpy(c, b, sizeof(b));
		c[i / 8] ^= (uint8_t)(1u << (i % 8));
		assert_true(kvk_ref_checksum(c, sizeof(c)) != base);
	}
	/* Swapping two words changes it (terms depend on the position). */
	memcpy(c, b, sizeof(b));
	memcpy(&w0, c + 64, 8);
	memcpy(&w1, c + 1024, 8);
	memcpy(c + 64, &w1, 8);
	memcpy(c + 1024, &w0, 8);
	assert_true(kvk_ref_checksum(c, sizeof(c)) != base);
	/* The length is mixed in: trailing zero bytes are not invisible. */
	memset(c, 0, 16);
	assert_true(kvk_ref_checksum(c, 12) != kvk_ref_checksum(c, 16));
	/* Any split of the words reduces to the same value, as the GPU does
	 * it: per-thread strided partial sums, then their sum. */
	for (i = 0; i < 4096 / 8; i++) {
		uint64_t w;

		memcpy(&w, b + i * 8, 8);
		s += kvk_fmix64(w + (i + 1) * KVK_CSUM_STEP);
	}
	{
		uint64_t part[7] = { 0 }, t = 0;

		for (i = 0; i < 4096 / 8; i++) {
			uint64_t w;

			memcpy(&w, b + i * 8, 8);
			part[i % 7] += kvk_fmix64(w + (i + 1) * KVK_CSUM_STEP);
		}
		for (i = 0; i < 7; i++)
			t += part[i];
		assert_true(t == s);
	}
	assert_true(kvk_fmix64(s ^ 4096) == base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kv_layout_roundtrip),
		cmocka_unit_test(test_flash_layout_roundtrip),
		cmocka_unit_test(test_padded_stride_roundtrip),
		cmocka_unit_test(test_mla_layout_roundtrip),
		cmocka_unit_test(test_rank_heads_roundtrip),
		cmocka_unit_test(test_layout_check),
		cmocka_unit_test(test_checksum_known_answers),
		cmocka_unit_test(test_checksum_properties),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
