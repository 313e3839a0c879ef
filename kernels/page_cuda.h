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
	uint64_t pool;		/* pool base (of the first layer copied) */
	uint64_t half;		/* bytes of one block of one engine tensor */
	uint64_t page_half;	/* bytes of one layer's K or V in a page */
	uint64_t rows;		/* runs per segment (page_ref.h) */
	uint64_t row;		/* bytes of one run */
	uint64_t page_row;	/* bytes between runs in a page */
	uint64_t page_off;	/* the rank's run within a page row */
	uint64_t segs;		/* n x layers x halves */
	uint64_t tensors;	/* uint64 [layers x halves]: K and V (or latent)
				 * bases per layer */
	uint64_t offs;		/* uint64 [n x 2]: page offset in the pool, block
				 * offset in the engine tensors */
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
#include <pthread.h>

extern const unsigned char kvk_fatbin[];
extern const size_t kvk_fatbin_len;

struct kvk_module {
	CUmodule mod;
	CUfunction copy;
	CUfunction csum;
	/* The launches' argument buffers, stream-ordered, from a pool of our
	 * own that keeps its memory (the device's default pool gives it back
	 * at every synchronisation, and the next call maps it again); NULL:
	 * the default pool. */
	CUmemoryPool args;
};

/*
 * Load the kernels into the current context and warm them up there: the
 * argument pool created and filled once, one empty launch of each kernel
 * (under CUDA's lazy loading a kernel is otherwise loaded at its first
 * launch), all on a stream of its own that is waited for. So the first
 * copy of a process costs what the others do. 0 or -errno (*why set).
 */
int kvk_module_load(struct kvk_module *m, const char **why);
/* Unload; the caller has waited for every launch of the module. */
void kvk_module_unload(struct kvk_module *m);

/*
 * Can a kernel on GPU `ordinal` touch every tensor of l (layers 0 ..
 * l->layers - 1), at both ends of the span num_blocks and block_stride
 * give it? Each must be memory CUDA knows: device memory of that GPU,
 * managed memory, or mapped pinned host memory. 0, -EFAULT (unknown: a
 * plain host pointer) or -EXDEV (another GPU's memory). A kernel that
 * touches such memory does not fail alone: it poisons the whole context.
 * A few driver lookups per tensor.
 */
int kvk_tensors_check(const struct kvk_layout *l, int ordinal);

/*
 * Gather or scatter on `stream`: n blocks, page j at pool + pages[j] x
 * slot_bytes, engine block blocks[j] of the layout (device addresses;
 * checked by the caller). Returns 0 once queued, or -errno. It is
 * kvk_args_upload, one kvk_copy_run of every layer, kvk_args_free.
 */
int kvk_copy_launch(const struct kvk_module *m, enum kvk_dir dir,
		    const struct kvk_layout *l, CUdeviceptr pool, uint64_t slot_bytes,
		    const uint32_t *pages, const int64_t *blocks, size_t n,
		    CUstream stream);

/* A call's arguments on the device: the layout's tensor bases, every
 * layer, then the blocks' offsets; uploaded once for any number of
 * launches of its layers. */
struct kvk_args {
	CUdeviceptr dev;
	uint32_t layers;
	uint32_t halves;	/* words per layer: 2 (K and V) or 1 (latent) */
	int sync;		/* a plain allocation: wait for the stream, then free */
};

/* Upload on `stream` (stream-ordered; the host arrays may be reused on
 * return). 0 or -errno. */
int kvk_args_upload(const struct kvk_module *m, const struct kvk_layout *l,
		    uint64_t slot_bytes, const uint32_t *pages, const int64_t *blocks,
		    size_t n, CUstream stream, struct kvk_args *a);
/* One launch copying layers first .. first + count - 1 of the n blocks
 * whose arguments a holds; pool is the layout's (layer 0's) pool base. */
int kvk_copy_run(const struct kvk_module *m, enum kvk_dir dir, const struct kvk_layout *l,
		 CUdeviceptr pool, const struct kvk_args *a, uint32_t first, uint32_t count,
		 size_t n, CUstream stream);
/* Release the arguments after the launches queued on `stream`. 0 or -errno. */
int kvk_args_free(struct kvk_args *a, CUstream stream);

/*
 * The slow way, for pages the GPU cannot address (host pool pages not yet
 * registered with CUDA): one cuMemcpyHtoDAsync (gather) or
 * cuMemcpyDtoHAsync (scatter) per layer, K and V of each of the n blocks,
 * between host memory at pool_host + pages[j] x slot_bytes and the
 * layout's device tensors, on `stream`. From pageable memory the driver
 * stages each copy: the calling thread waits for the stream, and for a
 * scatter for the copy itself. 0 once queued, or -errno.
 */
int kvk_copy_pieces(enum kvk_dir dir, const struct kvk_layout *l, uint8_t *pool_host,
		    uint64_t slot_bytes, const uint32_t *pages, const int64_t *blocks,
		    size_t n, CUstream stream);

/*
 * kvk_tensors_check once per layout: a layout checked before (the same
 * tensors, geometry and GPU) is not checked again. A process checks one
 * layout per engine and hands it to every copy, so the driver lookups are
 * paid once, not per call.
 */
struct kvk_check_cache {
	pthread_mutex_t lock;
	uint64_t *words;	/* the layout last found reachable; NULL: none */
	size_t n;
};

int kvk_tensors_check_cached(struct kvk_check_cache *cc, const struct kvk_layout *l,
			     int ordinal);
void kvk_check_cache_free(struct kvk_check_cache *cc);

/*
 * Checksum n pages (device addresses) of `bytes` each into out[] (host),
 * as kvk_ref_checksum defines it; waits for `stream`. 0 or -errno.
 */
int kvk_csum_run(const struct kvk_module *m, const CUdeviceptr *pages, size_t n,
		 uint64_t bytes, uint64_t *out, CUstream stream);
#endif
#endif

#endif
