// SPDX-License-Identifier: MIT
/*
 * pressure.c - what a dying or greedy client must not cost the others:
 * a client killed with SIGKILL while it holds pins and WRITING pages is
 * cleaned up to the last page, and eviction under pressure never takes a
 * page somebody pins.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../../libclient/client_int.h"	/* pin_fence: how this client pins */
#include "../../shm/ledger.h"

#define BT 16

static struct kvc_stats stats(kvc_t *c)
{
	struct kvc_stats s;

	assert_int_equal(kvc_stats(c, &s), 0);
	return s;
}

/* Wait (bounded) until the daemon's free-page count reaches `want`. */
static uint64_t wait_free(kvc_t *c, uint64_t want)
{
	struct timespec ts = { 0, 10 * 1000 * 1000 };
	int i;

	for (i = 0; i < 500 && stats(c).pages_free != want; i++)
		nanosleep(&ts, NULL);
	return stats(c).pages_free;
}

struct holder {
	const struct kvt_daemon *d;
	int ready[2];
};

/* Pin a cached prefix, take WRITING pages for the rest, then hang. */
static int holder(void *arg)
{
	struct holder *h = arg;
	kvc_t *c = kvt_open(h->d, NULL);
	uint32_t t[12 * BT];
	struct kvc_req *r;
	char b = 'r';

	if (!c)
		return 2;
	kvt_tokens(t, 12 * BT, 4 * BT, 77);
	if (kvc_req_new(c, t, 12 * BT, NULL, 0, &r) || kvc_lookup(r) != 4 || kvc_alloc(r) != 8)
		return 3;
	memset(kvc_block(r, 4), 0xab, kvc_page_bytes(c));	/* half-written */
	if (write(h->ready[1], &b, 1) != 1)
		return 4;
	pause();
	return 0;
}

static void test_sigkill_with_pins_and_writing_pages(void **state)
{
	struct kvt_daemon d;
	struct holder h = { .d = &d };
	uint32_t t[4 * BT];
	struct kvc_stats s0, s1;
	kvc_t *c;
	pid_t p;
	char b;
	int i;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 4 * BT, 4 * BT, 0);
	assert_int_equal(kvt_put(c, t, 4 * BT, NULL), 0);
	s0 = stats(c);
	for (i = 0; i < 3; i++) {	/* three kills in a row */
		assert_int_equal(pipe(h.ready), 0);
		p = kvt_fork(holder, &h);
		assert_int_equal(read(h.ready[0], &b, 1), 1);
		s1 = stats(c);
		assert_int_equal(s1.pages_writing, 8);
		assert_int_equal(s1.pages_free, s0.pages_free - 8);
		kill(p, SIGKILL);
		assert_int_equal(kvt_wait(p), 128 + SIGKILL);
		assert_int_equal(wait_free(c, s0.pages_free), s0.pages_free);
		assert_int_equal(stats(c).pages_writing, 0);
		assert_int_equal(stats(c).pages_ready, s0.pages_ready);
		close(h.ready[0]);
		close(h.ready[1]);
	}
	/* The prefix it pinned is intact, and its pins are gone: the
	 * daemon may evict it now (checked through a full-pool flood). */
	assert_int_equal(kvt_get(c, t, 4 * BT), 4);
	assert_true(kvt_log_has(&d, "8 writing pages reclaimed"));
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/* Under each eviction policy (policy.h): the pinned prompt's pages are
 * candidates (lru and clock reach them: the flood is newer) and back off;
 * s3fifo keeps them in its main queue (they were used) and takes the
 * flood's one-off blocks instead. */
static void pinned_survives(const char *policy, bool must_back_off)
{
	const char *args[] = { "--eviction", policy, NULL };
	struct kvt_daemon d;
	uint32_t t[8 * BT], old[8 * BT];
	struct kvc_key k[8];
	struct kvc_req *r;
	kvc_t *c;
	size_t i;

	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	/* A prompt published and then held pinned by this process. */
	kvt_tokens(t, 8 * BT, 0, 4242);
	assert_int_equal(kvt_put(c, t, 8 * BT, NULL), 0);
	assert_int_equal(kvc_keys(c, t, 8 * BT, NULL, 0, k, 8), 8);
	assert_int_equal(kvc_req_new(c, t, 8 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 8);
	/* And one published but not pinned, which pressure may evict. */
	kvt_tokens(old, 8 * BT, 0, 4343);
	assert_int_equal(kvt_put(c, old, 8 * BT, NULL), 0);

	/* 96 prompts x 8 blocks = 768 pages through a 256-page pool. */
	assert_int_equal(kvt_flood(&d, 96, 9000), 0);

	for (i = 0; i < 8; i++)
		assert_true(kvt_check(kvc_block(r, i), kvc_page_bytes(c), k[i]));
	kvc_req_free(r);
	assert_int_equal(kvt_get(c, t, 8 * BT), 8);	/* still indexed */
	/* Pressure did evict: the unpinned prompt lost blocks. */
	assert_true(kvt_get(c, old, 8 * BT) < 8);
	assert_true(kvt_log_has(&d, "evicted"));
	if (must_back_off)
		assert_true(kvt_log_has(&d, "pinned candidates backed off"));
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

static void test_eviction_never_takes_a_pinned_page(void **state)
{
	(void)state;
	pinned_survives("lru", true);
	pinned_survives("clock", true);
	pinned_survives("s3fifo", false);
}

/*
 * The pin handshake's two kinds (shm/ledger.h, `pin-barrier`). auto: the
 * daemon says it orders pins with membarrier(2), a client pins with no
 * fence, and eviction scans make membarrier calls (pin_barriers); fence,
 * or a kernel without membarrier: the client fences and no call is made.
 * Either way every page a lookup pinned holds its block's bytes while a
 * flooder pushes prompts through the 256-page pool and 4,000 lookups
 * go round 48 prompts of 8 blocks (384 pages: each is partly evicted by
 * the time it comes round again, and published again), so that pins race
 * the evictor's batches on the very pages they name.
 */
static void pins_hold(const char *mode, bool barrier)
{
	const char *args[] = { "--pin-barrier", mode, NULL };
	struct kvshm_stats st;
	struct kvt_daemon d;
	uint32_t t[48][8 * BT];
	struct kvc_key k[48][8];
	struct kvc_req *r;
	_Atomic int *stop = mmap(NULL, sizeof(*stop), PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int i, j, hits, st_flood;
	uint64_t checked = 0;
	pid_t flooder;
	kvc_t *c;

	assert_int_equal(kvt_daemon_start(&d, args), 0);
	assert_true(kvt_log_has(&d, barrier ? "pins: ordered by membarrier(2)"
					    : "pins: lookups fence each run of pins"));
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	assert_int_equal(c->pin_fence, !barrier);
	for (i = 0; i < 48; i++) {
		kvt_tokens(t[i], 8 * BT, 0, 5151 + (uint32_t)i);
		assert_int_equal(kvc_keys(c, t[i], 8 * BT, NULL, 0, k[i], 8), 8);
	}

	assert_true(stop != MAP_FAILED);
	*stop = 0;
	flooder = fork();
	assert_true(flooder >= 0);
	if (!flooder) {
		kvc_t *fc = kvt_open(&d, NULL);
		uint32_t ft[8 * BT], s;

		for (s = 0; fc && !*stop; s++) {
			kvt_tokens(ft, 8 * BT, 0, 20000 + s);
			if (kvt_put(fc, ft, 8 * BT, NULL) < 0)
				_exit(3);	/* wrong bytes, or an error */
		}
		_exit(fc ? 0 : 2);
	}
	for (i = 0; i < 4000; i++) {
		const int p = i % 48;

		assert_int_equal(kvc_req_new(c, t[p], 8 * BT, NULL, 0, &r), 0);
		hits = kvc_lookup(r);
		assert_true(hits >= 0);
		for (j = 0; j < hits; j++, checked++)
			assert_true(kvt_check(kvc_block(r, (size_t)j), kvc_page_bytes(c), k[p][j]));
		kvc_req_free(r);
		if (hits < 8)
			assert_true(kvt_put(c, t[p], 8 * BT, NULL) >= 0);
	}
	*stop = 1;
	assert_int_equal(waitpid(flooder, &st_flood, 0), flooder);
	assert_true(WIFEXITED(st_flood) && WEXITSTATUS(st_flood) == 0);
	munmap((void *)stop, sizeof(*stop));
	assert_true(checked > 0);
	kvt_stats(d.sock, &st);
	assert_true(atomic_load(&st.evictions) > 0);
	if (barrier)
		assert_true(atomic_load(&st.pin_barriers) > 0);
	else
		assert_int_equal(atomic_load(&st.pin_barriers), 0);
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

static void test_pin_barrier_kinds(void **state)
{
	bool have = kvshm_barrier_query() == 0;

	(void)state;
	if (!have)
		print_message("membarrier(2) global expedited is not in this kernel: "
			      "pin-barrier auto runs as fence here\n");
	pins_hold("auto", have);
	pins_hold("fence", false);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sigkill_with_pins_and_writing_pages),
		cmocka_unit_test(test_eviction_never_takes_a_pinned_page),
		cmocka_unit_test(test_pin_barrier_kinds),
	};

	return cmocka_run_group_tests_name("integration/pressure", tests, NULL, NULL);
}
