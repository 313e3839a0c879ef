/* SPDX-License-Identifier: MIT */
/*
 * gpucopy.h - the page kernels' gather and scatter against cuMemcpyDtoD of
 * the same bytes on one GPU: the measurement behind kvbench-gpu and
 * kvbench's gpu mode (both print what gpucopy_run returns).
 *
 * What is timed (CUDA events on one stream, after 3 warm-up passes, over
 * iters passes):
 *
 *   gather   kvk_copy_launch(KVK_GATHER): `blocks` pool pages, each to a
 *            random engine block, all layers, K and V, in one launch; the
 *            kernel libkvclient's kvc_gather runs on a cuda pool.
 *   scatter  the same, engine -> pool (kvc_scatter).
 *   dtod     cuMemcpyDtoD of the same number of bytes, one contiguous
 *            range: the best case a plain copy gets.
 */
#ifndef KVBENCH_GPUCOPY_H
#define KVBENCH_GPUCOPY_H

#include <stddef.h>
#include <stdint.h>

struct gpucopy_cfg {
	unsigned long gpu;	/* device ordinal */
	unsigned long blocks, iters;
	unsigned long layers, heads, dim, dtype, bt;	/* page geometry */
	int flash;		/* KVK_LAYOUT_FLASH, else KVK_LAYOUT_KV */
};

/* Llama-3-8B: 32 layers, 8 kv heads, head dim 128, bf16, 16-token blocks
 * (2 MiB pages, 32 KiB pieces); 256 blocks, 20 passes, layout kv. */
#define GPUCOPY_DEFAULTS                                                         \
	{ .gpu = 0, .blocks = 256, .iters = 20, .layers = 32, .heads = 8, .dim = 128, \
	  .dtype = 2, .bt = 16, .flash = 0 }

struct gpucopy_res {
	char gpu_name[128];
	uint64_t half;		/* bytes of one piece (one block of one K or V) */
	uint64_t page_bytes;	/* half x 2 x layers */
	uint64_t bytes;		/* moved per pass: page_bytes x blocks */
	double gather_s, scatter_s, dtod_s;	/* seconds per pass */
};

/*
 * Measure. Returns 0 with *r filled; 1 where it cannot run here (built
 * without CUDA, no driver, no such GPU: why says which, "no CUDA driver:
 * libcuda.so.1: cannot open shared object file ..."); -1 on a CUDA error
 * on a GPU that is there (why says which call). Frees what it took.
 */
int gpucopy_run(const struct gpucopy_cfg *c, struct gpucopy_res *r, char *why, size_t whylen);

#endif
