// SPDX-License-Identifier: MIT
/*
 * pool.c - unit tests for daemon/pool/pool.c on a host pool: the copies and
 * checksums the spill tier uses (kvd_pool_copy_out / copy_in /
 * checksum / pin_host), their range checks, and opening a cuda pool
 * where it cannot be had (no driver here, or a build without CUDA)
 * failing cleanly with -ENOTSUP and nothing left open; the hole scan's
 * slices, on normal and on shmem THP pages (kvd_memfd_fill). On a GPU machine
 * with a driver the cuda case is covered by tests/gpu/pool.c instead.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../daemon/config.h"
#include "../../daemon/pool/pool.h"
#include "../../kernels/cudadrv.h"
#include "../../kernels/page_ref.h"
#include "../../shm/mapping.h"

#define PAGE 8192u
#define PAGES 16u

static void test_host_copy_and_checksum(void **state)
{
	struct kvd_config cfg;
	struct kvd_pool p;
	uint8_t *buf = malloc(3 * PAGE), *back = malloc(3 * PAGE);
	uint32_t pages[3] = { 15, 0, 7 }, i;
	uint64_t sum[3];

	(void)state;
	assert_non_null(buf);
	assert_non_null(back);
	kvd_config_defaults(&cfg);
	cfg.hugepages = KVD_HUGE_OFF;
	assert_int_equal(kvd_pool_open(&p, &cfg, PAGES * PAGE, PAGE), 0);
	assert_int_equal(p.kind, KVSHM_POOL_HOST);
	for (i = 0; i < 3 * PAGE; i++)
		buf[i] = (uint8_t)(i * 37 + 11);
	/* In at pages 5..7, out again, byte for byte; the rest stays zero. */
	assert_int_equal(kvd_pool_copy_in(&p, 5, 3, buf), 0);
	assert_memory_equal((uint8_t *)p.mem.base + 5 * PAGE, buf, 3 * PAGE);
	assert_int_equal(kvd_pool_copy_out(&p, 5, 3, back), 0);
	assert_memory_equal(back, buf, 3 * PAGE);
	assert_int_equal(kvd_pool_copy_out(&p, 4, 1, back), 0);
	for (i = 0; i < PAGE; i++)
		assert_int_equal(back[i], 0);
	/* Checksums of any pages equal the reference over their bytes. */
	assert_int_equal(kvd_pool_checksum(&p, pages, 3, PAGE, sum), 0);
	assert_true(sum[0] == kvk_ref_checksum((uint8_t *)p.mem.base + 15 * PAGE, PAGE));
	assert_true(sum[2] == kvk_ref_checksum(buf + 2 * PAGE, PAGE));
	pages[1] = 6;
	assert_int_equal(kvd_pool_checksum(&p, pages, 3, 100, sum), 0);
	assert_true(sum[1] == kvk_ref_checksum(buf + PAGE, 100));
	/* Out of range, each alone. */
	assert_int_equal(kvd_pool_copy_out(&p, PAGES - 1, 2, back), -EINVAL);
	assert_int_equal(kvd_pool_copy_out(&p, PAGES, 1, back), -EINVAL);
	assert_int_equal(kvd_pool_copy_out(&p, 0, 0, back), -EINVAL);
	assert_int_equal(kvd_pool_copy_out(&p, UINT32_MAX, 2, back), -EINVAL);
	assert_int_equal(kvd_pool_copy_in(&p, 0, 1, NULL), -EINVAL);
	pages[1] = PAGES;
	assert_int_equal(kvd_pool_checksum(&p, pages, 3, PAGE, sum), -EINVAL);
	pages[1] = 1;
	assert_int_equal(kvd_pool_checksum(&p, pages, 3, PAGE + 1, sum), -EINVAL);
	/* Pinning staging memory is only needed for a cuda pool. */
	assert_int_equal(kvd_pool_pin_host(&p, buf, PAGE), 0);
	kvd_pool_unpin_host(&p, buf);
	kvd_pool_close(&p);
	free(buf);
	free(back);
}

/* Pool pages a hole-scan call reported, and how often. */
struct holes_seen {
	uint32_t calls, pages, first;
};

static void saw_holes(uint32_t first, uint32_t n, void *arg)
{
	struct holes_seen *h = arg;

	if (!h->calls++)
		h->first = first;
	h->pages += n;
}

/*
 * The hole scan runs only while the pool lacks a page, and then looks at a
 * slice per call, resuming where it stopped: a page punched deep in the
 * pool is found within pool / slice calls, reported once, backed again,
 * and not reported on the next pass.
 */
static void test_hole_scan_in_slices(void **state)
{
	const uint64_t pool = 64ull << 20, slice = 8ull << 20, pb = 64u << 10;
	const uint32_t victim = 900;	/* at 56.25 MiB: the 8th slice */
	struct kvd_config cfg;
	struct holes_seen h = { 0 };
	struct kvd_pool p;
	uint32_t call, found_at = 0;

	(void)state;
	kvd_config_defaults(&cfg);
	cfg.hugepages = KVD_HUGE_OFF;
	assert_int_equal(kvd_pool_open(&p, &cfg, pool, pb), 0);
	/* Faulted in whole when it opened: every page counts. */
	assert_int_equal(p.huge_bytes, 0);
	assert_int_equal(kvd_pool_backing(&p), KVSHM_BACKING_SMALL);
	{
		struct stat st;

		assert_int_equal(fstat(p.mem.fd, &st), 0);
		assert_true((uint64_t)st.st_blocks * 512 == pool);
	}
	/* Nothing punched: a whole pass reports nothing, and scans nothing
	 * either (the memfd's allocated size says it is whole; the cursor
	 * stays put), so an idle daemon's tick costs one fstat. */
	for (call = 0; call < pool / slice; call++) {
		assert_int_equal(kvd_pool_holes(&p, slice, saw_holes, &h), 0);
		assert_int_equal(p.hole_cursor, 0);
	}
	assert_int_equal(h.calls, 0);
	/* A client punches one 4 KiB page of pool page 900. */
	assert_int_equal(fallocate(p.mem.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				   (off_t)(victim * pb + 8192), 4096), 0);
	for (call = 1; call <= pool / slice && !h.calls; call++)
		if (kvd_pool_holes(&p, slice, saw_holes, &h))
			found_at = call;
	assert_int_equal(h.calls, 1);
	assert_int_equal(h.first, victim);
	assert_int_equal(h.pages, 1);
	assert_true(found_at >= 1 && found_at <= pool / slice);
	/* Backed again: a full pass later, nothing more, and the scan has
	 * stopped where it found the hole. */
	{
		uint64_t at = p.hole_cursor;

		for (call = 0; call < pool / slice; call++) {
			assert_int_equal(kvd_pool_holes(&p, slice, saw_holes, &h), 0);
			assert_int_equal(p.hole_cursor, at);
		}
		assert_int_equal(h.calls, 1);
	}
	kvd_pool_close(&p);
}

/* Why this kernel makes no shmem THP (a printed skip), or NULL. */
static const char *no_thp(void)
{
	char mode[32];

	kvd_thp_shmem_mode(mode, sizeof(mode));
	if (!mode[0])
		return "this kernel has no transparent huge pages";
	if (!strcmp(mode, "deny"))
		return "shmem_enabled is deny: no shmem huge pages";
	return NULL;
}

/*
 * A THP memfd comes out of kvd_memfd_fill in 2 MiB pages whatever
 * shmem_enabled says short of deny (MADV_COLLAPSE), allocated whole,
 * zero, and the kernel's smaps count agrees with the frames collapsed.
 */
static void test_thp_fill(void **state)
{
	const uint64_t bytes = 16ull << 20;
	struct kvd_memfd_fill fill;
	struct kvd_memfd m;
	uint64_t huge = 0, i;
	struct stat st;
	const char *why = no_thp();

	(void)state;
	if (why) {
		print_message("[  SKIP    ] %s\n", why);
		skip();
	}
	assert_int_equal(kvd_memfd_create(&m, "test-thp", bytes, KVD_MEM_THP), 0);
	assert_int_equal((uintptr_t)m.base % KVSHM_HUGE_BYTES, 0);
	assert_int_equal(kvd_memfd_fill(&m, 2, &fill), 0);
	assert_true(fill.threads >= 1);
	assert_int_equal(fstat(m.fd, &st), 0);
	assert_true((uint64_t)st.st_blocks * 512 == bytes);
	for (i = 0; i < bytes; i += 4096)
		assert_int_equal(((const char *)m.base)[i], 0);
	assert_int_equal(kvd_memfd_huge_bytes(&m, &huge), 0);
	if (!fill.collapsed) {
		kvd_memfd_close(&m);
		print_message("[  SKIP    ] the kernel made no 2 MiB page (MADV_COLLAPSE: %s)\n",
			      strerror(fill.collapse_err));
		skip();
	}
	assert_true(huge == fill.collapsed * KVSHM_HUGE_BYTES);
	assert_true(huge >= bytes / 10 * 9);
	kvd_memfd_close(&m);
}

/*
 * The hole scan on a THP pool: a punched 2 MiB page is found, reported
 * and backed again like normal pages are; a punch of 4 KiB inside a
 * 2 MiB page either leaves a hole the scan finds (the kernel split the
 * page) or none, the kernel having zeroed those bytes in place (the
 * bound ARCHITECTURE.md, Trust, states: no scan can see it).
 */
static void test_thp_hole_scan(void **state)
{
	const uint64_t pool = 32ull << 20, pb = 64u << 10;
	const uint32_t frame_pages = (uint32_t)(KVSHM_HUGE_BYTES / pb);
	struct kvd_config cfg;
	struct holes_seen h = { 0 };
	struct kvd_pool p;
	uint32_t call;
	struct stat st;
	char *victim;
	const char *why = no_thp();

	(void)state;
	if (why) {
		print_message("[  SKIP    ] %s\n", why);
		skip();
	}
	kvd_config_defaults(&cfg);
	assert_int_equal(kvd_pool_open(&p, &cfg, pool, pb), 0);
	if (kvd_pool_backing(&p) != KVSHM_BACKING_THP) {
		kvd_pool_close(&p);
		print_message("[  SKIP    ] the pool got %s, not shmem THP\n",
			      p.mem.kind == KVD_MEM_HUGETLB ? "hugetlb pages (reserved here)" :
							      "4 KiB pages");
		skip();
	}
	assert_true(p.huge_bytes >= pool / 10 * 9);
	assert_int_equal(kvd_pool_hole_slice(&p), 2048ull << 20);
	/* Frame 5, whole: pool pages 5 * 32 .. 5 * 32 + 31. */
	assert_int_equal(fallocate(p.mem.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				   (off_t)(5 * KVSHM_HUGE_BYTES), (off_t)KVSHM_HUGE_BYTES), 0);
	for (call = 0; call < 4 && !h.calls; call++)
		kvd_pool_holes(&p, kvd_pool_hole_slice(&p), saw_holes, &h);
	assert_int_equal(h.calls, 1);
	assert_int_equal(h.first, 5 * frame_pages);
	assert_int_equal(h.pages, frame_pages);
	assert_int_equal(fstat(p.mem.fd, &st), 0);
	assert_true((uint64_t)st.st_blocks * 512 == pool);
	/* 4 KiB of frame 9, written first. */
	victim = (char *)p.mem.base + 9 * KVSHM_HUGE_BYTES + 3 * pb;
	memset(victim, 0x5a, 4096);
	memset(&h, 0, sizeof(h));
	assert_int_equal(fallocate(p.mem.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				   (off_t)(victim - (char *)p.mem.base), 4096), 0);
	assert_int_equal(victim[0], 0);
	assert_int_equal(fstat(p.mem.fd, &st), 0);
	for (call = 0; call < 4 && !h.calls; call++)
		kvd_pool_holes(&p, kvd_pool_hole_slice(&p), saw_holes, &h);
	if ((uint64_t)st.st_blocks * 512 < pool) {
		assert_int_equal(h.calls, 1);
		assert_int_equal(h.first, 9 * frame_pages + 3);
		assert_int_equal(h.pages, 1);
	} else {
		assert_int_equal(h.calls, 0);
		print_message("(this kernel zeroed the 4 KiB inside its 2 MiB page: no hole)\n");
	}
	kvd_pool_close(&p);
}

static void test_cuda_pool_unavailable(void **state)
{
	struct kvd_config cfg;
	struct kvd_pool p;
	const char *why = NULL;

	(void)state;
	if (!kvk_cuda_load(&why)) {
		print_message("[  SKIP    ] a CUDA driver is present: tests/gpu/pool.c covers the cuda pool\n");
		skip();
	}
	kvd_config_defaults(&cfg);
	strcpy(cfg.pool, "cuda");
	assert_int_equal(kvd_pool_open(&p, &cfg, PAGES * PAGE, PAGE), -ENOTSUP);
	assert_null(p.cuda);
	assert_int_equal(kvd_pool_fd(&p), -1);
	kvd_pool_close(&p);	/* harmless after a failed open */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_host_copy_and_checksum),
		cmocka_unit_test(test_hole_scan_in_slices),
		cmocka_unit_test(test_thp_fill),
		cmocka_unit_test(test_thp_hole_scan),
		cmocka_unit_test(test_cuda_pool_unavailable),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
