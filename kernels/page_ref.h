/* SPDX-License-Identifier: MIT */
/*
 * page_ref.h - moving pages between the pool layout and an engine's paged
 * KV layout, and the page checksum: the definitions every implementation
 * (the CPU reference here, the CUDA kernels in page_copy.cu) must agree on.
 *
 * Pool page (fixed by kvclient.h): [layer][k|v][token][kv_head][head_dim].
 * So for one block, layer l and half s (0 = K, 1 = V), the pool holds one
 * contiguous run of `half` = block_tokens x kv_heads x head_dim x dtype
 * bytes at page + (2 l + s) x half. An engine's block of one layer's K (or
 * V) tensor, [num_blocks, block_tokens, kv_heads, head_dim], is the same
 * run of `half` bytes at tensor + block x block_stride. Both layouts we
 * support differ only in where that tensor starts:
 *
 *   KVK_LAYOUT_KV     per layer a K tensor k[l] and a V tensor v[l]
 *   KVK_LAYOUT_FLASH  per layer one tensor k[l] of [2, num_blocks, ...]
 *                     (vLLM's FlashAttention layout): V starts at
 *                     k[l] + num_blocks x block_stride
 *
 * so a gather or scatter of a run of blocks is a batch of layers x 2 x
 * blocks copies of `half` bytes each. No I/O, no CUDA here.
 */
#ifndef KVK_PAGE_REF_H
#define KVK_PAGE_REF_H

#include <stddef.h>
#include <stdint.h>

enum kvk_layout_kind {
	KVK_LAYOUT_KV = 1,
	KVK_LAYOUT_FLASH = 2,
};

enum kvk_dir {
	KVK_GATHER = 0,		/* pool -> engine (hits) */
	KVK_SCATTER = 1,	/* engine -> pool (publish) */
};

/* An engine's cache, in addresses of the process (host or device). */
struct kvk_layout {
	uint32_t kind;		/* enum kvk_layout_kind */
	uint32_t layers;
	uint64_t num_blocks;	/* blocks per engine tensor */
	uint64_t block_stride;	/* bytes between blocks, >= half */
	uint64_t half;		/* bytes of one block of one K or V tensor */
	void *const *k;		/* [layers] */
	void *const *v;		/* [layers], KVK_LAYOUT_KV only */
};

/* Where layer l's K (s = 0) or V (s = 1) tensor starts. */
static inline uint64_t kvk_tensor(const struct kvk_layout *l, uint32_t layer, int s)
{
	uint64_t k = (uint64_t)(uintptr_t)l->k[layer];

	if (l->kind == KVK_LAYOUT_FLASH)
		return k + (uint64_t)s * l->num_blocks * l->block_stride;
	return s ? (uint64_t)(uintptr_t)l->v[layer] : k;
}

/*
 * Check a layout: known kind, layers >= 1, num_blocks >= 1, half >= 1,
 * block_stride >= half, num_blocks x block_stride (x 2 for FLASH) without
 * overflow, every tensor pointer non-NULL. Returns 0 or -EINVAL with *why
 * naming the problem.
 */
int kvk_layout_check(const struct kvk_layout *l, const char **why);

/*
 * CPU reference of the gather/scatter kernel: for j < n, page j of the run
 * is pool + pages[j] x slot_bytes and its engine block is blocks[j]
 * (0 <= blocks[j] < num_blocks, checked by the caller). Copies layers x 2
 * runs of l->half bytes per block in direction dir. Pointers are host
 * pointers.
 */
void kvk_ref_copy(enum kvk_dir dir, const struct kvk_layout *l, uint8_t *pool,
		  uint64_t slot_bytes, const uint32_t *pages, const int64_t *blocks,
		  size_t n);

/*
 * The page checksum (the spill tier stores it in each slot's header, the
 * verify mode compares it on hit). Defined so that it parallelises: with
 * w_i the i-th little-endian 64-bit word of the page (the last one padded
 * with zero bytes) and fmix64 MurmurHash3's 64-bit finaliser (a bijection),
 *
 *     S = sum over i of fmix64(w_i + (i + 1) x 0x9e3779b97f4a7c15)  mod 2^64
 *     checksum = fmix64(S ^ bytes)
 *
 * Every term depends on one word and its position only, and the sum is
 * associative and commutative, so any split of the words over threads
 * reduces to the same value. Because fmix64 is a bijection, changing any
 * single word always changes the sum; moving words changes their terms;
 * other changes collide with chance about 2^-64. Not a cryptographic hash
 * (it guards against torn and corrupt pages, not an adversary).
 */
uint64_t kvk_ref_checksum(const void *page, uint64_t bytes);

/* The mixer, shared with the CUDA kernel's definition. */
static inline uint64_t kvk_fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	k ^= k >> 33;
	return k;
}

#define KVK_CSUM_STEP 0x9e3779b97f4a7c15ull

#endif
