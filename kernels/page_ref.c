// SPDX-License-Identifier: MIT
/*
 * page_ref.c - the CPU reference of the page kernels: what the tests hold
 * the CUDA kernels to, and what a host pool runs for kvc_gather and
 * kvc_scatter. Plain memcpy of runs of `row` bytes (a block of one
 * layer's K or V whole, or a rank's heads of one token row); see
 * page_ref.h for the layouts and the checksum's definition.
 */
#include <errno.h>
#include <string.h>

#include "page_ref.h"

static int bad(const char **why, const char *msg)
{
	if (why)
		*why = msg;
	return -EINVAL;
}

int kvk_layout_check(const struct kvk_layout *l, const char **why)
{
	uint64_t span, rows;
	uint32_t i;

	if (!l)
		return bad(why, "layout is NULL");
	if (l->kind != KVK_LAYOUT_KV && l->kind != KVK_LAYOUT_FLASH && l->kind != KVK_LAYOUT_MLA)
		return bad(why, "layout kind is neither KV, FLASH nor MLA");
	if (!l->layers)
		return bad(why, "layout has 0 layers");
	if (!l->num_blocks)
		return bad(why, "layout has 0 blocks");
	if (!l->half)
		return bad(why, "block size is 0");
	if (l->block_stride < l->half)
		return bad(why, "block stride is smaller than one block");
	if (!l->rows || !l->row || __builtin_mul_overflow(l->rows, l->row, &rows) ||
	    rows != l->half)
		return bad(why, "a block's runs do not make one block");
	if (l->page_off > l->page_row || l->row > l->page_row - l->page_off ||
	    __builtin_mul_overflow(l->rows, l->page_row, &rows) || rows > l->page_half)
		return bad(why, "the rank's runs do not lie within a page's rows");
	if (__builtin_mul_overflow(l->num_blocks, l->block_stride, &span) ||
	    (l->kind == KVK_LAYOUT_FLASH && __builtin_mul_overflow(span, 2, &span)) ||
	    span > UINTPTR_MAX)
		return bad(why, "num_blocks x block stride overflows");
	if (!l->k)
		return bad(why, "K (or FLASH, or MLA) tensor array is NULL");
	if (l->kind == KVK_LAYOUT_KV && !l->v)
		return bad(why, "V tensor array is NULL");
	for (i = 0; i < l->layers; i++) {
		if (!l->k[i])
			return bad(why, "a layer's K (or FLASH, or MLA) tensor is NULL");
		if (l->kind == KVK_LAYOUT_KV && !l->v[i])
			return bad(why, "a layer's V tensor is NULL");
	}
	return 0;
}

void kvk_ref_copy(enum kvk_dir dir, const struct kvk_layout *l, uint8_t *pool,
		  uint64_t slot_bytes, const uint32_t *pages, const int64_t *blocks,
		  size_t n)
{
	const int halves = (int)kvk_halves(l);
	size_t j;
	uint64_t t;
	uint32_t layer;
	int s;

	for (j = 0; j < n; j++) {
		uint8_t *page = pool + (uint64_t)pages[j] * slot_bytes;
		uint64_t eoff = (uint64_t)blocks[j] * l->block_stride;

		for (layer = 0; layer < l->layers; layer++)
			for (s = 0; s < halves; s++) {
				uint8_t *p = page + kvk_page_off(l, layer, s);
				uint8_t *e = (uint8_t *)(uintptr_t)(kvk_tensor(l, layer, s) + eoff);

				for (t = 0; t < l->rows; t++) {
					if (dir == KVK_GATHER)
						memcpy(e + t * l->row, p + t * l->page_row, l->row);
					else
						memcpy(p + t * l->page_row, e + t * l->row, l->row);
				}
			}
	}
}

uint64_t kvk_ref_checksum(const void *page, uint64_t bytes)
{
	const uint8_t *b = page;
	uint64_t s = 0, i, words = bytes / 8, w;

	for (i = 0; i < words; i++) {
		memcpy(&w, b + i * 8, 8);	/* little-endian hosts only */
		s += kvk_fmix64(w + (i + 1) * KVK_CSUM_STEP);
	}
	if (bytes % 8) {
		w = 0;
		memcpy(&w, b + words * 8, bytes % 8);
		s += kvk_fmix64(w + (words + 1) * KVK_CSUM_STEP);
	}
	return kvk_fmix64(s ^ bytes);
}
