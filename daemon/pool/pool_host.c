// SPDX-License-Identifier: MIT
/*
 * pool_host.c - the host-memory pool: a memfd in DRAM, the default where
 * no GPU is present and a real DRAM tier where one is; on 2 MiB pages
 * wherever the kernel gives them, faulted in before the daemon serves.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#include "../../shm/mapping.h"
#include "../util/log.h"
#include "pool.h"

#define HUGE_2M KVSHM_HUGE_BYTES

static const char *size_str(char *buf, size_t len, uint64_t b)
{
	if (b >= 1ull << 30)
		snprintf(buf, len, "%.1f GiB", (double)b / (1ull << 30));
	else
		snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
	return buf;
}

/*
 * The start-up line: what the pool is made of, how long faulting it in
 * took, and for a large pool on 4 KiB pages what that costs and which
 * setting would change it. `why`: why not (more) 2 MiB pages; `fix`: the
 * setting, or NULL.
 */
static void say_backing(const struct kvd_pool *p, const struct kvd_memfd_fill *fill,
			const char *thp, const char *why, const char *fix, bool asked_off)
{
	char sz[32], pt[32], what[256], cost[512] = "";
	uint64_t small = p->bytes - p->huge_bytes;
	double secs = (double)fill->ns / 1e9, gib = (double)p->bytes / (1ull << 30);
	double pct = 100.0 * (double)p->huge_bytes / (double)p->bytes;
	bool costly = small >= (1ull << 30) && !asked_off;

	if (p->mem.kind == KVD_MEM_HUGETLB)
		snprintf(what, sizeof(what), "%.0f%% in 2 MiB pages (hugetlb)", pct);
	else if (p->huge_bytes)
		snprintf(what, sizeof(what), "%.0f%% in 2 MiB pages (shmem transparent huge pages, shmem_enabled %s%s)%s%s",
			 pct, thp, strcmp(thp, "never") ? "" : ", made by MADV_COLLAPSE",
			 small ? ", the rest in 4 KiB pages: " : "", small ? why : "");
	else
		snprintf(what, sizeof(what), "in 4 KiB pages (%s)", why);
	if (costly)
		snprintf(cost, sizeof(cost), "; at this size every client that maps all of it builds %s of page tables, and every start faults in %llu pages%s%s",
			 size_str(pt, sizeof(pt), small / 512),
			 (unsigned long long)(small / 4096), fix ? "; for 2 MiB pages: " : "",
			 fix ? fix : "");
	kvd_log(costly ? KVD_LOG_WARN : KVD_LOG_INFO,
		"pool: %s of host memory: %s; faulting it in took %.2f s (%.2f s/GiB, %u thread%s, %.2f s of CPU)%s",
		size_str(sz, sizeof(sz), p->bytes), what, secs, gib > 0 ? secs / gib : 0,
		fill->threads, fill->threads == 1 ? "" : "s", (double)fill->cpu_ns / 1e9, cost);
}

int kvd_pool_host_open(struct kvd_pool *p, uint64_t bytes, enum kvd_hugepages mode)
{
	static const char reserve[] = "reserve hugetlb pages (vm.nr_hugepages; docs/INSTALL.md, big hosts)";
	char thp[32], why[160] = "", fix[256] = "";
	struct kvd_memfd_fill fill;
	int rc = -EINVAL;

	memset(p, 0, sizeof(*p));
	p->kind = KVSHM_POOL_HOST;
	p->bytes = bytes;
	p->mem.fd = -1;
	kvd_thp_shmem_mode(thp, sizeof(thp));
	if (mode != KVD_HUGE_OFF && bytes % HUGE_2M == 0)
		rc = kvd_memfd_create(&p->mem, "kvcached-pool", bytes, KVD_MEM_HUGETLB);
	if (rc && mode == KVD_HUGE_ON) {
		kvd_err("pool: hugetlb pages requested but not available for %llu bytes (%s); reserve them in /proc/sys/vm/nr_hugepages or set hugepages = auto",
			(unsigned long long)bytes,
			bytes % HUGE_2M ? "the pool size is not a multiple of 2 MiB" : strerror(-rc));
		return rc;
	}
	/* No hugetlb pages: shmem transparent huge pages, which need no
	 * reservation (kvd_memfd_fill). */
	if (rc && mode == KVD_HUGE_AUTO && bytes >= HUGE_2M && thp[0] && strcmp(thp, "deny"))
		rc = kvd_memfd_create(&p->mem, "kvcached-pool", bytes, KVD_MEM_THP);
	if (rc) {
		rc = kvd_memfd_create(&p->mem, "kvcached-pool", bytes, KVD_MEM_SMALL);
		if (rc) {
			kvd_err("pool: cannot reserve %llu bytes of host memory: %s",
				(unsigned long long)bytes, strerror(-rc));
			return rc;
		}
		if (mode == KVD_HUGE_OFF) {
			snprintf(why, sizeof(why), "hugepages = off");
			snprintf(fix, sizeof(fix), "hugepages = auto");
		} else if (bytes < HUGE_2M) {
			snprintf(why, sizeof(why), "the pool is smaller than 2 MiB");
		} else if (!thp[0]) {
			snprintf(why, sizeof(why), "no hugetlb pages reserved, and this kernel has no transparent huge pages");
			snprintf(fix, sizeof(fix), "%s", reserve);
		} else {
			snprintf(why, sizeof(why), "no hugetlb pages reserved, and shmem_enabled is %s", thp);
			snprintf(fix, sizeof(fix), "%s, or set shmem_enabled to advise", reserve);
		}
	}
	rc = kvd_memfd_fill(&p->mem, 0, &fill);
	if (rc) {
		kvd_err("pool: cannot fault in %llu bytes of host memory: %s",
			(unsigned long long)bytes, strerror(-rc));
		kvd_memfd_close(&p->mem);
		return rc;
	}
	p->prefault_ns = fill.ns;
	/* The kernel's word on what it gave, not ours. */
	if (kvd_memfd_huge_bytes(&p->mem, &p->huge_bytes)) {
		p->huge_bytes = p->mem.kind == KVD_MEM_HUGETLB ? bytes : fill.collapsed * HUGE_2M;
		kvd_debug("pool: cannot read /proc/self/smaps; counting the 2 MiB pages made");
	}
	if (p->huge_bytes > bytes)
		p->huge_bytes = bytes;
	if (p->mem.kind == KVD_MEM_THP && p->huge_bytes < bytes) {
		int e = fill.collapse_err;

		if (e)
			snprintf(why, sizeof(why), "MADV_COLLAPSE: %s", strerror(e));
		else
			snprintf(why, sizeof(why), "the pool's size is not a multiple of 2 MiB");
		if (e == EINVAL && !strcmp(thp, "never"))
			snprintf(fix, sizeof(fix), "set shmem_enabled to advise (this kernel cannot collapse shmem: before Linux 6.1), or %s",
				 reserve);
		else if (e)
			snprintf(fix, sizeof(fix), "%s at boot (memory is too fragmented for 2 MiB pages now)",
				 reserve);
	}
	rc = kvd_memfd_seal(&p->mem, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	if (rc) {
		kvd_err("pool: cannot seal the pool memfd: %s", strerror(-rc));
		kvd_memfd_close(&p->mem);
		return rc;
	}
	say_backing(p, &fill, thp, why, fix[0] ? fix : NULL, mode == KVD_HUGE_OFF);
	return 0;
}

enum kvshm_pool_backing kvd_pool_backing(const struct kvd_pool *p)
{
	if (p->kind != KVSHM_POOL_HOST)
		return KVSHM_BACKING_NONE;
	if (p->mem.kind == KVD_MEM_HUGETLB)
		return KVSHM_BACKING_HUGETLB;
	return p->huge_bytes ? KVSHM_BACKING_THP : KVSHM_BACKING_SMALL;
}

uint64_t kvd_pool_hole_slice(const struct kvd_pool *p)
{
	return p->mem.kind == KVD_MEM_SMALL ? 256ull << 20 : 2048ull << 20;
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
	/* A THP pool's 2 MiB page can lose 4 KiB of itself (where the
	 * kernel splits it on a punch), so it is looked at in 4 KiB pages
	 * as a normal one. */
	const uint64_t base = 4096, kpage = p->mem.kind == KVD_MEM_HUGETLB ? HUGE_2M : base;
	uint64_t off = p->hole_cursor, n, i, run = 0;
	uint32_t found = 0;

	/* The pool was faulted in whole when it opened: a missing page is
	 * a hole. */
	if (p->kind != KVSHM_POOL_HOST || p->mem.fd < 0 || !p->page_bytes ||
	    max_bytes < kpage || !pool_short(p))
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
			off_t data = p->mem.kind == KVD_MEM_HUGETLB ? (off_t)e :
				     lseek(p->mem.fd, (off_t)h, SEEK_DATA);

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

int kvd_pool_fd(const struct kvd_pool *p)
{
	return p->mem.fd;
}

void kvd_pool_close(struct kvd_pool *p)
{
	kvd_memfd_close(&p->mem);
	free(p->hole_vec);
	p->hole_vec = NULL;
	kvd_pool_cuda_close(p);
}
