/* SPDX-License-Identifier: MIT */
/*
 * page_ref.h - moving pages between the pool layout and an engine's paged
 * KV layout, and the page checksum: the definitions every implementation
 * (the CPU reference here, the CUDA kernels in page_copy.cu) must agree on.
 *
 * Pool page (fixed by kvclient.h): [layer][k|v][token][kv_head][head_dim]
 * with every KV head of the model, or [layer][token][head_dim] for an MLA
 * latent. So for one block, layer l and half s (0 = K, 1 = V; always 0
 * for a latent), the pool holds one contiguous run of `page_half` =
 * block_tokens x kv_heads x head_dim x dtype bytes at page + (halves x l
 * + s) x page_half. An engine's block of one layer's K (or V, or latent)
 * tensor, [num_blocks, block_tokens, its kv_heads, head_dim], is a run of
 * `half` bytes at tensor + block x block_stride. An engine that holds
 * every head (one not tensor-parallel, a latent) has half = page_half and
 * copies the run whole (rows 1); a tensor-parallel rank holds some heads,
 * so each of the block's `rows` = block_tokens token rows is a run of
 * `row` bytes at page_off within a page row of page_row bytes (page_off =
 * the rank's first head x head bytes): block_tokens runs per segment. The
 * layouts differ only in where a tensor starts:
 *
 *   KVK_LAYOUT_KV     per layer a K tensor k[l] and a V tensor v[l]
 *   KVK_LAYOUT_FLASH  per layer one tensor k[l] of [2, num_blocks, ...]
 *                     (vLLM's FlashAttention layout): V starts at
 *                     k[l] + num_blocks x block_stride
 *   KVK_LAYOUT_MLA    per layer one latent tensor k[l] (halves 1)
 *
 * so a gather or scatter of a run of blocks is a batch of layers x halves
 * x blocks segments of `rows` runs each. No I/O, no CUDA here.
 */
#ifndef KVK_PAGE_REF_H
#define KVK_PAGE_REF_H

#include <stddef.h>
#include <stdint.h>

enum kvk_layout_kind {
	KVK_LAYOUT_KV = 1,
	KVK_LAYOUT_FLASH = 2,
	KVK_LAYOUT_MLA = 3,
};

enum kvk_dir {
	KVK_GATHER = 0,		/* pool -> engine (hits) */
	KVK_SCATTER = 1,	/* engine -> pool (publish) */
};

/* An engine's cache, in addresses of the process (host or device), and
 * where its heads sit in a page. */
struct kvk_layout {
	uint32_t kind;		/* enum kvk_layout_kind */
	uint32_t layers;
	uint64_t num_blocks;	/* blocks per engine tensor */
	uint64_t block_stride;	/* bytes between blocks, >= half */
	uint64_t half;		/* bytes of one block of one engine tensor */
	uint64_t page_half;	/* bytes of one block of one layer's K or V
				 * (or latent) in a page: every head */
	uint64_t rows;		/* runs per segment: 1 (all heads) or the
				 * block's tokens; rows x row = half */
	uint64_t row;		/* bytes of one run */
	uint64_t page_row;	/* bytes from one run to the next in a page */
	uint64_t page_off;	/* the rank's run within a page row */
	void *const *k;		/* [layers] */
	void *const *v;		/* [layers], KVK_LAYOUT_KV only */
};

/* An engine that holds every head: a segment is one run of `half` bytes,
 * the page's run of a layer's K or V exactly. */
static inline void kvk_layout_whole(struct kvk_layout *l)
{
	l->page_half = l->row = l->page_row = l->half;
	l->rows = 1;
	l->page_off = 0;
}

/* K and V (2), or one latent (1): the tensors of one layer. */
static inline uint32_t kvk_halves(const struct kvk_layout *l)
{
	return l->kind == KVK_LAYOUT_MLA ? 1 : 2;
}

/* Where layer l's K (s = 0) or V (s = 1) tensor starts. */
static inline uint64_t kvk_tensor(const struct kvk_layout *l, uint32_t layer, int s)
{
	uint64_t k = (uint64_t)(uintptr_t)l->k[layer];

	if (l->kind == KVK_LAYOUT_FLASH)
		return k + (uint64_t)s * l->num_blocks * l->block_stride;
	return s ? (uint64_t)(uintptr_t)l->v[layer] : k;
}

/* Offset in a page of layer l's K (s = 0) or V (s = 1) run, the rank's
 * first row of it. */
static inline uint64_t kvk_page_off(const struct kvk_layout *l, uint32_t layer, int s)
{
	return ((uint64_t)kvk_halves(l) * layer + (uint64_t)s) * l->page_half + l->page_off;
}

/*
 * Check a layout: known kind, layers >= 1, num_blocks >= 1, half >= 1,
 * block_stride >= half, num_blocks x block_stride (x 2 for FLASH) without
 * overflow, every tensor pointer non-NULL; rows >= 1 runs of row bytes
 * making half, each within its page row (page_off + row <= page_row) and
 * the rows within a page's half (rows x page_row <= page_half). Returns 0
 * or -EINVAL with *why naming the problem.
 */
int kvk_layout_check(const struct kvk_layout *l, const char **why);

/*
 * CPU reference of the gather/scatter kernel: for j < n, page j of the run
 * is pool + pages[j] x slot_bytes and its engine block is blocks[j]
 * (0 <= blocks[j] < num_blocks, checked by the caller). Copies layers x
 * halves segments of l->rows runs of l->row bytes per block in direction
 * dir (the page's runs l->page_row apart from page_off, the engine's
 * consecutive). Pointers are host pointers.
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
