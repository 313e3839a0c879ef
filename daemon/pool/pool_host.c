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

uint32_t kvd_pool_holes(struct kvd_pool *p, uint64_t max_bytes,
			void (*fn)(uint32_t first, uint32_t n, void *arg), void *arg)
{
	const uint64_t base = 4096, huge = HUGE_2M;
	uint32_t found = 0;

	/* Until the pool is faulted in, untouched pages read as holes. */
	if (p->kind != KVSHM_POOL_HOST || p->mem.fd < 0 || !p->page_bytes ||
	    !atomic_load(&p->prefault_done))
		return 0;
	if (!p->mem.huge) {
		off_t pos = 0;

		/* One lseek when there is no hole: the common case. */
		while ((uint64_t)pos < p->bytes) {
			off_t h = lseek(p->mem.fd, pos, SEEK_HOLE), e;

			if (h < 0 || (uint64_t)h >= p->bytes)
				break;
			e = lseek(p->mem.fd, h, SEEK_DATA);
			if (e < 0 || (uint64_t)e > p->bytes)
				e = (off_t)p->bytes;
			found += refill(p, (uint64_t)h, (uint64_t)(e - h), fn, arg);
			pos = e;
		}
		return found;
	}
	if (!p->hole_vec) {
		p->hole_vec = malloc(max_bytes / base + 1);
		if (!p->hole_vec)
			return 0;
	}
	{
		uint64_t off = p->hole_cursor, n = p->bytes - off, i, run = 0;

		if (n > max_bytes)
			n = max_bytes;
		if (mincore((char *)p->mem.base + off, n, p->hole_vec))
			return 0;
		for (i = 0; i <= n / huge; i++) {
			bool hole = i < n / huge && !(p->hole_vec[i * (huge / base)] & 1);

			if (hole) {
				run++;
				continue;
			}
			if (run)
				found += refill(p, off + (i - run) * huge, run * huge, fn, arg);
			run = 0;
		}
		p->hole_cursor = off + n >= p->bytes ? 0 : off + n;
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
