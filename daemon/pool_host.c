// SPDX-License-Identifier: MIT
/*
 * pool_host.c - the host-memory pool: a memfd in DRAM, the default where
 * no GPU is present and a real DRAM tier where one is.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>

#include "log.h"
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
			kvd_info("pool: no hugetlb pages for %llu bytes (%s); using normal pages with transparent-hugepage advice",
				 (unsigned long long)bytes,
				 bytes % HUGE_2M ? "size not a multiple of 2M" : strerror(-rc));
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
	kvd_info("pool: host, %llu bytes, %s pages", (unsigned long long)bytes,
		 p->mem.huge ? "2 MiB hugetlb" : "4 KiB");
	return 0;
}

int kvd_pool_fd(const struct kvd_pool *p)
{
	return p->mem.fd;
}

void kvd_pool_close(struct kvd_pool *p)
{
	kvd_memfd_close(&p->mem);
}
