// SPDX-License-Identifier: MIT
/*
 * page_ref.c - the CPU reference of the page kernels: what the tests hold
 * the CUDA kernels to, and what a host pool runs for kvc_gather and
 * kvc_scatter. Plain memcpy of runs of `half` bytes; see page_ref.h for
 * the layouts and the checksum's definition.
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
	uint64_t span;
	uint32_t i;

	if (!l)
		return bad(why, "layout is NULL");
	if (l->kind != KVK_LAYOUT_KV && l->kind != KVK_LAYOUT_FLASH)
		return bad(why, "layout kind is neither KV nor FLASH");
	if (!l->layers)
		return bad(why, "layout has 0 layers");
	if (!l->num_blocks)
		return bad(why, "layout has 0 blocks");
	if (!l->half)
		return bad(why, "block size is 0");
	if (l->block_stride < l->half)
		return bad(why, "block stride is smaller than one block");
	if (__builtin_mul_overflow(l->num_blocks, l->block_stride, &span) ||
	    (l->kind == KVK_LAYOUT_FLASH && __builtin_mul_overflow(span, 2, &span)) ||
	    span > UINTPTR_MAX)
		return bad(why, "num_blocks x block stride overflows");
	if (!l->k)
		return bad(why, "K (or FLASH) tensor array is NULL");
	if (l->kind == KVK_LAYOUT_KV && !l->v)
		return bad(why, "V tensor array is NULL");
	for (i = 0; i < l->layers; i++) {
		if (!l->k[i])
			return bad(why, "a layer's K (or FLASH) tensor is NULL");
		if (l->kind == KVK_LAYOUT_KV && !l->v[i])
			return bad(why, "a layer's V tensor is NULL");
	}
	return 0;
}

void kvk_ref_copy(enum kvk_dir dir, const struct kvk_layout *l, uint8_t *pool,
		  uint64_t slot_bytes, const uint32_t *pages, const int64_t *blocks,
		  size_t n)
{
	size_t j;
	uint32_t layer;
	int s;

	for (j = 0; j < n; j++) {
		uint8_t *page = pool + (uint64_t)pages[j] * slot_bytes;
		uint64_t eoff = (uint64_t)blocks[j] * l->block_stride;

		for (layer = 0; layer < l->layers; layer++)
			for (s = 0; s < 2; s++) {
				uint8_t *p = page + (2ull * layer + (uint64_t)s) * l->half;
				uint8_t *e = (uint8_t *)(uintptr_t)(kvk_tensor(l, layer, s) + eoff);

				if (dir == KVK_GATHER)
					memcpy(e, p, l->half);
				else
					memcpy(p, e, l->half);
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
