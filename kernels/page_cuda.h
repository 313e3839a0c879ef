/* SPDX-License-Identifier: MIT */
/*
 * page_cuda.h - launching the page kernels (page_copy.cu) through the CUDA
 * driver API, and the parameter blocks the kernels take. Shared by nvcc
 * (the kernels) and the C side (libkvclient, the daemon's cuda pool).
 *
 * The kernels are not linked into anything: the Makefile compiles
 * page_copy.cu to a fatbin and embeds it as kvk_fatbin[]; kvk_module_load
 * hands it to cuModuleLoadData in the current context. Every launch goes
 * on the caller's stream (a cudaStream_t is a CUstream), never waits, and
 * reads its per-call arguments from a device buffer taken and released in
 * stream order (cuMemAllocAsync / cuMemFreeAsync), so the caller may reuse
 * its own arrays as soon as the call returns and concurrent calls on other
 * streams never share a buffer.
 */
#ifndef KVK_PAGE_CUDA_H
#define KVK_PAGE_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* Kernel parameters (passed by value; pointers are device addresses). */
struct kvk_copy_params {
	uint64_t pool;		/* pool base */
	uint64_t half;		/* bytes of one block of one engine tensor */
	uint64_t page_half;	/* bytes of one layer's K or V in a page */
	uint64_t rows;		/* runs per segment (page_ref.h) */
	uint64_t row;		/* bytes of one run */
	uint64_t page_row;	/* bytes between runs in a page */
	uint64_t page_off;	/* the rank's run within a page row */
	uint64_t segs;		/* n x layers x halves */
	uint64_t args;		/* uint64 [layers x halves] tensor bases,
				 * then uint64 [n x 2] (page offset in the
				 * pool, block offset in the engine tensors) */
	uint32_t layers;
	uint32_t halves;	/* 2 (K and V) or 1 (MLA latent) */
	uint32_t dir;		/* enum kvk_dir */
	uint32_t pad;
};

struct kvk_csum_params {
	uint64_t addrs;		/* uint64 [n] page addresses */
	uint64_t out;		/* uint64 [n] checksums */
	uint64_t bytes;		/* bytes per page */
	uint64_t n;
};

#define KVK_THREADS 256

#ifndef __CUDACC__
#include "page_ref.h"

#ifdef KVC_HAVE_CUDA
#include <cuda.h>

extern const unsigned char kvk_fatbin[];
extern const size_t kvk_fatbin_len;

struct kvk_module {
	CUmodule mod;
	CUfunction copy;
	CUfunction csum;
};

/* Load the kernels into the current context. 0 or -errno (*why set). */
int kvk_module_load(struct kvk_module *m, const char **why);
void kvk_module_unload(struct kvk_module *m);

/*
 * Gather or scatter on `stream`: n blocks, page j at pool + pages[j] x
 * slot_bytes, engine block blocks[j] of the layout (device addresses;
 * checked by the caller). Returns 0 once queued, or -errno.
 */
int kvk_copy_launch(const struct kvk_module *m, enum kvk_dir dir,
		    const struct kvk_layout *l, CUdeviceptr pool, uint64_t slot_bytes,
		    const uint32_t *pages, const int64_t *blocks, size_t n,
		    CUstream stream);

/*
 * Checksum n pages (device addresses) of `bytes` each into out[] (host),
 * as kvk_ref_checksum defines it; waits for `stream`. 0 or -errno.
 */
int kvk_csum_run(const struct kvk_module *m, const CUdeviceptr *pages, size_t n,
		 uint64_t bytes, uint64_t *out, CUstream stream);
#endif
#endif

#endif
