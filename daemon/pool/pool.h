/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the page pool backends. A pool is `n_pages` slots of
 * `page_bytes`, exported to clients as file descriptors; page i lives at
 * base + i * page_bytes in every process that maps it.
 */
#ifndef KVD_POOL_H
#define KVD_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "../../shm/proto.h"
#include "../../shm/segment.h"
#include "../util/settings.h"
#include "memfd.h"

struct kvd_pool_cuda;

struct kvd_pool {
	enum kvshm_pool_kind kind;
	struct kvd_memfd mem;	/* host pool */
	uint64_t bytes;
	uint64_t page_bytes;	/* slot bytes (kvd_pool_open sets it) */
	/* Host pool, as kvd_pool_host_open found it once faulted in (the
	 * segment's stats show them, with kvd_pool_backing). */
	uint64_t huge_bytes;		/* of bytes, in 2 MiB pages */
	uint64_t prefault_ns;		/* faulting it in took this long */
	struct kvd_pool_cuda *cuda;	/* cuda pool (pool_cuda.c), else NULL */
	uint64_t hole_cursor;		/* kvd_pool_holes: next offset */
	unsigned char *hole_vec;	/* kvd_pool_holes: mincore vector */
	uint64_t hole_vec_bytes;	/* ... covering this many pool bytes */
};

/*
 * Open the pool the settings ask for (pool = host or cuda): `bytes` in
 * slots of `page_bytes`. Returns 0 or -errno, having logged the reason.
 */
int kvd_pool_open(struct kvd_pool *p, const struct kvd_config *cfg, uint64_t bytes,
		  uint64_t page_bytes);

/*
 * Host pool: a memfd of `bytes` in 2 MiB pages wherever the kernel gives
 * them (mode auto): hugetlb pages when enough are reserved (or may be
 * overcommitted), else shmem transparent huge pages, else normal 4 KiB
 * pages; mode on: hugetlb or fail; off: 4 KiB pages. Faulted in whole
 * before it returns, on one thread per CPU (kvd_memfd_fill), and the
 * share of 2 MiB pages is read back from the kernel (/proc/self/smaps);
 * one log line says what was obtained, how long faulting in took and,
 * for a large pool left on 4 KiB pages, what that costs and which
 * setting would change it. Sealed against growing and shrinking so a
 * client cannot make the daemon's mapping fault. Returns 0 or -errno,
 * having logged the reason.
 */
int kvd_pool_host_open(struct kvd_pool *p, uint64_t bytes, enum kvd_hugepages mode);

/* What the pool is made of, for the segment's stats. */
enum kvshm_pool_backing kvd_pool_backing(const struct kvd_pool *p);

/* Bytes of the pool kvd_pool_holes looks at per call (its slice): 2 GiB
 * of 2 MiB pages, whose page-table entries mincore reads 512 at a time,
 * or 256 MiB of 4 KiB pages. */
uint64_t kvd_pool_hole_slice(const struct kvd_pool *p);

/*
 * Find pages of a host pool that were punched out (fallocate PUNCH_HOLE or
 * MADV_REMOVE by a client: no seal can forbid that to a process that may
 * map the pool writable), back them with memory again, and call
 * fn(first, n, arg) for each run of pool pages that lost its contents.
 * At most max_bytes of the pool per call, from a cursor that wraps, so
 * the cost of a call does not grow with the pool and every page is looked
 * at once per pool_bytes / max_bytes calls: mincore on the daemon's
 * mapping, and for normal pages SEEK_DATA on each missing run, since a
 * swapped-out page is not a hole. Returns the pages reported; 0 for a
 * cuda pool.
 */
uint32_t kvd_pool_holes(struct kvd_pool *p, uint64_t max_bytes,
			void (*fn)(uint32_t first, uint32_t n, void *arg), void *arg);

/*
 * Cuda pool: GPU memory from the CUDA driver's VMM API on device `gpu`,
 * cuMemCreate'd in chunks (a multiple of the allocation granularity, at
 * most KVPROTO_MAX_CHUNKS of them) that are exported as POSIX fds, mapped
 * contiguously into the daemon too, and zeroed. Fails with a message that
 * names what is missing: a build without CUDA, no driver, no such GPU, no
 * VMM or fd export on it, not enough GPU memory. Returns 0 or -errno.
 */
int kvd_pool_cuda_open(struct kvd_pool *p, uint64_t bytes, uint32_t gpu);

/*
 * The memfd handed to clients with HELLO_R: a host pool's; -1 for a cuda
 * pool, whose chunks go with POOL_R instead (kvd_pool_cuda_share).
 */
int kvd_pool_fd(const struct kvd_pool *p);

/* A cuda pool's POOL_R description and its chunk fds (*fds, r->n_chunks
 * of them, still owned by the pool). -ENOTSUP for a host pool. */
int kvd_pool_cuda_share(const struct kvd_pool *p, struct kvproto_pool_r *r,
			const int **fds);

/*
 * For the spill tier: copy pages [page, page + n) out of the pool into a
 * host buffer of n x page_bytes (copy_out), or from one into the pool
 * (copy_in). Host pool: memcpy. Cuda pool: cuMemcpyDtoH / HtoD in the
 * pool's context, from any thread; synchronous (the copy has landed when
 * it returns). Staging buffers should be pinned (kvd_pool_pin_host) for
 * full PCIe speed on a cuda pool. 0, -EINVAL (range) or -EIO.
 */
int kvd_pool_copy_out(struct kvd_pool *p, uint32_t page, uint32_t n, void *dst);
int kvd_pool_copy_in(struct kvd_pool *p, uint32_t page, uint32_t n, const void *src);

/*
 * The checksum (kernels/page_ref.h) of the first `bytes` of each of the
 * n pages pages[] into out[]. Host pool: the CPU reference; cuda pool: the
 * device kernel (one launch for all n, 8 bytes per page cross PCIe), equal
 * by definition. 0, -EINVAL or -EIO.
 */
int kvd_pool_checksum(struct kvd_pool *p, const uint32_t *pages, uint32_t n,
		      uint64_t bytes, uint64_t *out);

/*
 * Page-lock a host buffer (the spill tier's staging ring or its registered
 * io_uring buffers) for DMA with a cuda pool: cuMemHostRegister. A no-op
 * returning 0 on a host pool. 0 or -errno (RLIMIT_MEMLOCK: -ENOMEM).
 */
int kvd_pool_pin_host(struct kvd_pool *p, void *buf, uint64_t len);
void kvd_pool_unpin_host(struct kvd_pool *p, void *buf);

/* Releases either kind (a cuda pool: unmap, release the chunks, close
 * their fds; clients' own mappings stay valid until they unmap them). */
void kvd_pool_close(struct kvd_pool *p);
void kvd_pool_cuda_close(struct kvd_pool *p);

#endif
