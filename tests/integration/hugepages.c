// SPDX-License-Identifier: MIT
/*
 * hugepages.c - the pool and the segment on 2 MiB pages (issue #40), with
 * the real daemon, checked against what /proc says rather than against
 * the daemon's own word:
 *   - hugepages = auto with no hugetlb pages reserved: shmem transparent
 *     huge pages, at least 90% of the pool, whatever shmem_enabled says
 *     short of `deny` (MADV_COLLAPSE); the daemon's report (stats,
 *     /metrics, its start-up line) agrees with ShmemHugePages in
 *     /proc/meminfo and, as root, with ShmemPmdMapped in its smaps; a
 *     client's mapping of the pool is mapped in 2 MiB pages too;
 *   - hugepages = off: 4 KiB pages, reported as such;
 *   - KVT_SYSFS=1, as root only (it changes a machine-wide setting for
 *     about a second): shmem_enabled = advise gives 2 MiB pages at fault
 *     time, without MADV_COLLAPSE, and shmem_enabled = deny leaves a 1 GiB
 *     pool on 4 KiB pages with a warning that names the cost and the
 *     setting. The setting is restored in every exit path (teardown,
 *     SIGTERM / SIGINT / SIGALRM). Not run by default: other programs on
 *     the machine see the setting while it is changed, and CI may not be
 *     root.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../shm/segment.h"
#include "../lib/harness.h"
#include "../lib/procfs.h"

#define MIB (1ull << 20)
#define THP_FILE "/sys/kernel/mm/transparent_hugepage/shmem_enabled"

/* The daemon's start-up line about the pool (its log), into line. */
static void pool_line(const struct kvt_daemon *d, char *line, size_t len)
{
	FILE *f = fopen(d->log, "r");

	snprintf(line, len, "(no pool line in %s)", d->log);
	if (!f)
		return;
	while (fgets(line, (int)len, f))
		if (strstr(line, "info: pool: ") || strstr(line, "warning: pool: "))
			break;
	fclose(f);
}

/*
 * Whether this kernel makes a 2 MiB shmem page for us, asked without the
 * daemon's code: a memfd mapped at a 2 MiB boundary, one page touched,
 * MADV_COLLAPSE. NULL if it does, else why not (into why).
 */
static const char *kernel_refuses_thp(char *why, size_t len)
{
	int fd = memfd_create("kvt-probe", MFD_CLOEXEC);
	char *room, *at;
	int rc = -1;

	snprintf(why, len, "no memfd");
	if (fd < 0 || ftruncate(fd, 2 * MIB))
		goto out;
	room = mmap(NULL, 4 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (room == MAP_FAILED)
		goto out;
	at = (char *)(((uintptr_t)room + 2 * MIB - 1) & ~(uintptr_t)(2 * MIB - 1));
	if (mmap(at, 2 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != at) {
		munmap(room, 4 * MIB);
		goto out;
	}
	at[0] = 1;
	rc = madvise(at, 2 * MIB, 25 /* MADV_COLLAPSE */);
	snprintf(why, len, "the kernel collapses no shmem 2 MiB page (MADV_COLLAPSE: %s)",
		 strerror(errno));
	munmap(room, 4 * MIB);
out:
	if (fd >= 0)
		close(fd);
	return rc ? why : NULL;
}

static uint64_t shmem_huge_bytes(void)
{
	return kvt_proc_kb("/proc/meminfo", "ShmemHugePages:") * 1024;
}

/* kvstat --prometheus has `metric value` on a line of its own. */
static bool metrics_say(const struct kvt_daemon *d, const char *metric, uint64_t value)
{
	const char *args[] = { "--socket", d->sock, "--prometheus", NULL };
	static char out[1 << 16];
	char want[128];

	snprintf(want, sizeof(want), "\n%s %llu\n", metric, (unsigned long long)value);
	return kvt_run(kvt_bin("kvstat"), args, out, sizeof(out)) == 0 && strstr(out, want);
}

static void test_auto_is_huge_as_proc_says(void **state)
{
	const char *args[] = { "--page-size", "64K", "--pool-size", "64M", "--hugepages", "auto",
			       NULL };
	const uint64_t pool = 64 * MIB;
	uint64_t before = shmem_huge_bytes(), after;
	struct kvshm_stats st;
	struct kvt_daemon d;
	char line[1024], why[160];
	uint32_t t[4 * 16];
	int64_t kb;
	kvc_t *c;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	kvt_stats(d.sock, &st);
	pool_line(&d, line, sizeof(line));
	print_message("%s", line);
	if (kernel_refuses_thp(why, sizeof(why))) {
		/* Nothing to check but that the daemon says so. */
		assert_true(st.pool_backing == KVSHM_BACKING_SMALL ||
			    st.pool_backing == KVSHM_BACKING_HUGETLB);
		assert_int_equal(kvt_daemon_stop(&d), 0);
		print_message("[  SKIP    ] %s\n", why);
		skip();
	}
	assert_int_equal(st.pool_memory_page_bytes, 2 * MIB);
	assert_true(st.pool_huge_bytes >= pool / 10 * 9);
	assert_true(st.pool_huge_bytes <= pool);
	assert_true(strstr(line, "% in 2 MiB pages (") != NULL);
	assert_true(metrics_say(&d, "kvcached_pool_huge_bytes", st.pool_huge_bytes));
	assert_true(metrics_say(&d, "kvcached_pool_backing", st.pool_backing));
	if (st.pool_backing == KVSHM_BACKING_HUGETLB) {
		assert_int_equal(st.pool_huge_bytes, pool);
		print_message("(hugetlb pages are reserved here: the THP checks do not apply)\n");
		assert_int_equal(kvt_daemon_stop(&d), 0);
		return;
	}
	assert_int_equal(st.pool_backing, KVSHM_BACKING_THP);
	/* The kernel's count of shmem 2 MiB pages holds the daemon's. */
	after = shmem_huge_bytes();
	print_message("ShmemHugePages %llu -> %llu kB; the daemon reports %llu kB pool, %llu kB segment\n",
		      (unsigned long long)before >> 10, (unsigned long long)after >> 10,
		      (unsigned long long)st.pool_huge_bytes >> 10,
		      (unsigned long long)st.segment_huge_bytes >> 10);
	assert_true(after >= st.pool_huge_bytes + st.segment_huge_bytes);
	assert_true(after - before >= (st.pool_huge_bytes + st.segment_huge_bytes) / 10 * 9);
	/* Its mapping, exactly, where we may read it. */
	kb = kvt_smaps_kb(d.pid, "memfd:kvcached-pool", 0, "ShmemPmdMapped:");
	if (kb < 0)
		print_message("(the daemon's smaps is closed to us, not root: ShmemHugePages only)\n");
	else
		assert_int_equal((uint64_t)kb << 10, st.pool_huge_bytes);
	/* A client maps the pool at a 2 MiB boundary: the pages it touches
	 * are mapped whole in its own page tables. */
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 4 * 16, 0, 4040);
	assert_true(kvt_put(c, t, 4 * 16, NULL) >= 0);
	assert_int_equal(kvt_get(c, t, 4 * 16), 4);
	kb = kvt_smaps_kb(0, "memfd:kvcached-pool", 0, "ShmemPmdMapped:");
	assert_true(kb >= 2048);
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

static void test_off_is_small_and_says_so(void **state)
{
	const char *args[] = { "--page-size", "64K", "--pool-size", "16M", "--hugepages", "off",
			       NULL };
	struct kvshm_stats st;
	struct kvt_daemon d;
	char line[1024];

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	kvt_stats(d.sock, &st);
	assert_int_equal(st.pool_backing, KVSHM_BACKING_SMALL);
	assert_int_equal(st.pool_memory_page_bytes, 4096);
	assert_int_equal(st.pool_huge_bytes, 0);
	assert_int_equal(st.segment_huge_bytes, 0);
	pool_line(&d, line, sizeof(line));
	assert_true(strstr(line, "in 4 KiB pages (hugepages = off)") != NULL);
	assert_true(metrics_say(&d, "kvcached_pool_memory_page_bytes", 4096));
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* ------------------------------------------------ KVT_SYSFS=1, root only */

static char saved_mode[32];

static void restore_mode(void)
{
	int fd;

	if (!saved_mode[0])
		return;
	fd = open(THP_FILE, O_WRONLY);
	if (fd >= 0) {
		if (write(fd, saved_mode, strlen(saved_mode)) < 0)
			(void)0;
		close(fd);
	}
}

static void on_signal(int sig)
{
	restore_mode();		/* open, write, close: async-signal-safe */
	signal(sig, SIG_DFL);
	raise(sig);
}

static int set_mode(const char *mode)
{
	FILE *f = fopen(THP_FILE, "w");

	if (!f)
		return -1;
	if (fprintf(f, "%s\n", mode) < 0) {
		fclose(f);
		return -1;
	}
	return fclose(f) ? -1 : 0;
}

static int sysfs_setup(void **state)
{
	char text[128], *a, *b;
	FILE *f;

	(void)state;
	saved_mode[0] = '\0';
	if (!getenv("KVT_SYSFS") || geteuid())
		return 0;
	f = fopen(THP_FILE, "r");
	if (!f)
		return 0;
	if (fgets(text, sizeof(text), f) && (a = strchr(text, '[')) && (b = strchr(a, ']'))) {
		*b = '\0';
		snprintf(saved_mode, sizeof(saved_mode), "%s", a + 1);
	}
	fclose(f);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGALRM, on_signal);
	return 0;
}

static int sysfs_teardown(void **state)
{
	(void)state;
	restore_mode();
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGALRM, SIG_DFL);
	return 0;
}

static bool sysfs_allowed(void)
{
	if (!getenv("KVT_SYSFS")) {
		print_message("[  SKIP    ] set KVT_SYSFS=1 (as root) to let this test change " THP_FILE " for about a second\n");
		return false;
	}
	if (geteuid() || !saved_mode[0]) {
		print_message("[  SKIP    ] KVT_SYSFS=1 needs root and " THP_FILE "\n");
		return false;
	}
	return true;
}

/* A daemon started while shmem_enabled is `mode`, which is restored as
 * soon as the daemon serves (its pool is faulted in by then). */
static void start_under(struct kvt_daemon *d, const char *mode, const char *const *args)
{
	assert_int_equal(set_mode(mode), 0);
	if (kvt_daemon_start(d, args)) {
		restore_mode();
		fail_msg("kvcached did not start with shmem_enabled %s", mode);
	}
	restore_mode();
}

static void test_sysfs_advise_and_deny(void **state)
{
	const char *small[] = { "--page-size", "64K", "--pool-size", "64M", "--hugepages", "auto",
				NULL };
	const char *big[] = { "--page-size", "2M", "--pool-size", "1G", "--hugepages", "auto",
			      NULL };
	struct kvshm_stats st;
	struct kvt_daemon d;
	char line[1024];

	(void)state;
	if (!sysfs_allowed())
		skip();
	/* advise: our mapping is advised, so the first fault of each frame
	 * takes a 2 MiB page and nothing is collapsed. */
	start_under(&d, "advise", small);
	kvt_stats(d.sock, &st);
	pool_line(&d, line, sizeof(line));
	print_message("%s", line);
	if (st.pool_backing == KVSHM_BACKING_HUGETLB) {
		assert_int_equal(kvt_daemon_stop(&d), 0);
		print_message("[  SKIP    ] hugetlb pages are reserved here\n");
		skip();
	}
	assert_int_equal(st.pool_backing, KVSHM_BACKING_THP);
	assert_true(st.pool_huge_bytes >= 64 * MIB / 10 * 9);
	assert_true(strstr(line, "shmem_enabled advise)") != NULL);
	assert_null(strstr(line, "MADV_COLLAPSE"));
	assert_int_equal(kvt_daemon_stop(&d), 0);
	/* deny: 4 KiB pages, and a 1 GiB pool says what they cost. */
	start_under(&d, "deny", big);
	kvt_stats(d.sock, &st);
	pool_line(&d, line, sizeof(line));
	print_message("%s", line);
	assert_int_equal(st.pool_backing, KVSHM_BACKING_SMALL);
	assert_int_equal(st.segment_huge_bytes, 0);
	assert_true(strstr(line, "warning: pool: 1.0 GiB of host memory: in 4 KiB pages (no hugetlb pages reserved, and shmem_enabled is deny)") != NULL);
	assert_true(strstr(line, "builds 2.0 MiB of page tables") != NULL);
	assert_true(strstr(line, "every start faults in 262144 pages") != NULL);
	assert_true(strstr(line, "set shmem_enabled to advise") != NULL);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_auto_is_huge_as_proc_says),
		cmocka_unit_test(test_off_is_small_and_says_so),
		cmocka_unit_test_setup_teardown(test_sysfs_advise_and_deny, sysfs_setup,
						sysfs_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
