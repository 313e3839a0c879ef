// SPDX-License-Identifier: MIT
/*
 * pool_host.c - the host-memory pool: a memfd in DRAM, the default where
 * no GPU is present and a real DRAM tier where one is.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#include "../util/log.h"
#include "pool.h"

#define HUGE_2M (2ull << 20)

int kvd_pool_host_open(struct kvd_pool *p, uint64_t bytes, enum kvd_hugepages mode)
{
	int rc = -EINVAL;

	memset(p, 0, sizeof(*p));
	p->kind = KVSHM_POOL_HOST;
	p->bytes = bytes;
	p->mem.fd = -1;
	if (mode != KVD_HUGE_OFF) {
		if (bytes % HUGE_2M == 0)
			rc = kvd_memfd_create(&p->mem, "kvcached-pool", bytes, true);
		if (rc) {
			if (mode == KVD_HUGE_ON) {
				kvd_err("pool: hugetlb pages requested but not available for %llu bytes (%s); reserve them in /proc/sys/vm/nr_hugepages or set hugepages = auto",
					(unsigned long long)bytes, strerror(-rc));
				return rc;
			}
			/* Not an error: the normal case on a host that
			 * reserved none. Said as such. */
			kvd_info("pool: hugepages = auto: using normal memory (transparent huge pages advised) because %s; that is fine (reserve hugetlb pages in /proc/sys/vm/nr_hugepages for fewer TLB misses, or set hugepages = off to skip the try)",
				 bytes % HUGE_2M ? "the pool size is not a multiple of 2 MiB" :
				 rc == -ENOSPC || rc == -ENOMEM ? "no hugetlb pages are reserved for it" :
				 strerror(-rc));
		}
	}
	if (rc) {
		rc = kvd_memfd_create(&p->mem, "kvcached-pool", bytes, false);
		if (rc) {
			kvd_err("pool: cannot reserve %llu bytes of host memory: %s",
				(unsigned long long)bytes, strerror(-rc));
			return rc;
		}
		madvise(p->mem.base, bytes, MADV_HUGEPAGE);
	}
	rc = kvd_memfd_seal(&p->mem, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	if (rc) {
		kvd_err("pool: cannot seal the pool memfd: %s", strerror(-rc));
		kvd_memfd_close(&p->mem);
		return rc;
	}
	/* The kernel's memory pages, not the pool's KV pages (page-size). */
	kvd_info("pool: host memory, %llu bytes, backed by %s memory pages", (unsigned long long)bytes,
		 p->mem.huge ? "2 MiB hugetlb" : "4 KiB (or transparent huge)");
	return 0;
}

/* Back [off, off + len) with memory again and report its pool pages. */
static uint32_t refill(struct kvd_pool *p, uint64_t off, uint64_t len,
		       void (*fn)(uint32_t, uint32_t, void *), void *arg)
{
	uint64_t first = off / p->page_bytes, last = (off + len - 1) / p->page_bytes;

	/* Fault them in through our mapping: allocated and up to date, so
	 * the next scan does not see them as holes again. */
	if (madvise((char *)p->mem.base + off, len, MADV_POPULATE_WRITE))
		kvd_warn("pool: cannot back punched-out bytes %llu..%llu again: %s",
			 (unsigned long long)off, (unsigned long long)(off + len),
			 strerror(errno));
	fn((uint32_t)first, (uint32_t)(last - first + 1), arg);
	return (uint32_t)(last - first + 1);
}

/*
 * Whether the memfd lacks any page: its allocated size (st_blocks) counts
 * every page in memory or in swap, and a punched page leaves it (shmem and
 * hugetlbfs alike; checked on both). One fstat, ~0.4 us whatever the pool
 * size, so an idle daemon asks it every tick and scans nothing while the
 * answer is no. A page punched and written again before the next tick is
 * not seen; it reads what was written, as from any client that may write.
 */
static bool pool_short(const struct kvd_pool *p)
{
	struct stat st;

	return fstat(p->mem.fd, &st) || (uint64_t)st.st_blocks * 512 < p->bytes;
}

/*
 * Once pool_short says a page is missing, one slice of the pool per call,
 * from a cursor that wraps, finds where: mincore over the daemon's own
 * mapping says which kernel pages are not there. That costs about 4 ns
 * per 4 KiB page on the development VM, against a SEEK_HOLE walk over the
 * whole memfd, which cost 26 ms per call on a 4 GiB pool. mincore also
 * reports a swapped-out page of a normal pool as missing; SEEK_DATA on the
 * memfd tells the two apart (a swapped page is data, a punched one a
 * hole), once per missing run, so the common case is one mincore and
 * nothing else. Huge pages never swap. The scan stops as soon as the
 * refilled pool is whole again.
 */
uint32_t kvd_pool_holes(struct kvd_pool *p, uint64_t max_bytes,
			void (*fn)(uint32_t first, uint32_t n, void *arg), void *arg)
{
	const uint64_t base = 4096, kpage = p->mem.huge ? HUGE_2M : base;
	uint64_t off = p->hole_cursor, n, i, run = 0;
	uint32_t found = 0;

	/* Until the pool is faulted in, untouched pages read as holes. */
	if (p->kind != KVSHM_POOL_HOST || p->mem.fd < 0 || !p->page_bytes ||
	    !atomic_load(&p->prefault_done) || max_bytes < kpage || !pool_short(p))
		return 0;
	max_bytes -= max_bytes % kpage;
	if (!p->hole_vec) {
		p->hole_vec = malloc(max_bytes / base + 1);
		if (!p->hole_vec)
			return 0;
		p->hole_vec_bytes = max_bytes;
	}
	if (max_bytes > p->hole_vec_bytes)	/* the vector is sized by the first call */
		max_bytes = p->hole_vec_bytes;
	if (off >= p->bytes)
		off = 0;
	n = p->bytes - off < max_bytes ? p->bytes - off : max_bytes;
	p->hole_cursor = off + n >= p->bytes ? 0 : off + n;
	if (mincore((char *)p->mem.base + off, n, p->hole_vec))
		return 0;
	for (i = 0; i <= n / kpage; i++) {
		/* Eight resident 4 KiB pages at a time: the common case. */
		if (!run && kpage == base && i + 8 <= n / kpage) {
			uint64_t v;

			memcpy(&v, p->hole_vec + i, sizeof(v));
			if ((v & 0x0101010101010101ull) == 0x0101010101010101ull) {
				i += 7;
				continue;
			}
		}
		if (i < n / kpage && !(p->hole_vec[i * (kpage / base)] & 1)) {
			run++;
			continue;
		}
		while (run) {
			uint64_t h = off + (i - run) * kpage, e = off + i * kpage;
			off_t data = p->mem.huge ? (off_t)e : lseek(p->mem.fd, (off_t)h, SEEK_DATA);

			if (data < 0 || (uint64_t)data > e)	/* ENXIO: a hole to the end */
				data = (off_t)e;
			if ((uint64_t)data == h) {
				/* Swapped out, not punched: skip one page. */
				run--;
				continue;
			}
			found += refill(p, h, (uint64_t)data - h, fn, arg);
			run = (e - (uint64_t)data) / kpage;
		}
	}
	return found;
}

/*
 * fallocate reserves the memory but leaves every page to be zeroed on its
 * first touch: measured here, a fresh pool takes its first writes at
 * ~0.4 GB/s against ~10 GB/s after. A background thread faults it all in
 * (MADV_POPULATE_WRITE never changes contents, so clients may already be
 * writing), 64 MiB at a time so that shutdown can stop it promptly.
 * Best effort: kernels before 5.14 lack MADV_POPULATE_WRITE.
 */
static void *prefault(void *arg)
{
	struct kvd_pool *p = arg;
	uint64_t off, chunk = 64ull << 20;

	for (off = 0; off < p->bytes && !atomic_load(&p->stop_prefault); off += chunk) {
		uint64_t n = p->bytes - off < chunk ? p->bytes - off : chunk;

		if (madvise((char *)p->mem.base + off, n, MADV_POPULATE_WRITE)) {
			kvd_debug("pool: MADV_POPULATE_WRITE: %s (pages fault in on first use)",
				  strerror(errno));
			return NULL;
		}
	}
	if (off >= p->bytes) {
		kvd_debug("pool: all %llu bytes faulted in", (unsigned long long)p->bytes);
		atomic_store(&p->prefault_done, true);
	}
	return NULL;
}

void kvd_pool_prefault(struct kvd_pool *p)
{
	/* hugetlb fallocate already allocated every page, but our mapping
	 * is populated too, so that mincore shows a punched-out one. */
	if (p->kind != KVSHM_POOL_HOST)
		return;
	p->prefaulting = !pthread_create(&p->prefault_thread, NULL, prefault, p);
}

int kvd_pool_fd(const struct kvd_pool *p)
{
	return p->mem.fd;
}

void kvd_pool_close(struct kvd_pool *p)
{
	if (p->prefaulting) {
		atomic_store(&p->stop_prefault, true);
		pthread_join(p->prefault_thread, NULL);
		p->prefaulting = false;
	}
	kvd_memfd_close(&p->mem);
	free(p->hole_vec);
	p->hole_vec = NULL;
	kvd_pool_cuda_close(p);
}
