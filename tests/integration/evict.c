// SPDX-License-Identifier: MIT
/*
 * evict.c - the eviction policy on a real daemon: after pressure, a long
 * prompt whose tail had to go keeps its prefix reachable, and no block of
 * it stays cached where no lookup can reach it (a child without its
 * parent). Run for each prefix-aware policy (lru, s3fifo); CLOCK, which
 * knows nothing of prefixes, is the control that shows what the test
 * catches: it takes the prompt's head first and strands the rest.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "../../libclient/observe.h"
#include "../../shm/index.h"
#include "../../shm/ledger.h"
#include "../../shm/page.h"
#include "../lib/harness.h"

#define BT 16
#define LONG 96		/* blocks of the long prompt: 1536 tokens */
#define FILLERS 24	/* one-off prompts of 8 blocks after it */

/* How many of the prompt's blocks sit READY in the pool, reachable or
 * not (read from the segment, as kvstat would). */
static int resident(const struct kvt_daemon *d, const struct kvc_key *k, int n)
{
	struct kvobs o;
	char err[256];
	int i, r = 0;

	assert_int_equal(kvobs_attach(d->sock, &o, err, sizeof(err)), 0);
	for (i = 0; i < n; i++) {
		struct kvshm_key key = { k[i].lo, k[i].hi };
		uint32_t p = kvshm_index_find(o.h, key);

		if (p < o.h->geo.n_pages &&
		    atomic_load(&kvshm_pages(o.h)[p].state) == KVSHM_PAGE_READY)
			r++;
	}
	kvobs_detach(&o);
	return r;
}

/* Publish the long prompt, then one-off prompts until the pool must
 * evict; returns the prompt's hit prefix after, and its resident blocks. */
static void run(const char *policy, int *hits, int *res)
{
	const char *args[] = { "--eviction", policy, NULL };
	static uint32_t t[LONG * BT];
	struct kvc_key k[LONG];
	struct kvt_daemon d;
	kvc_t *c;

	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(t, LONG * BT, 0, 5150);
	assert_int_equal(kvc_keys(c, t, LONG * BT, NULL, 0, k, LONG), LONG);
	assert_int_equal(kvt_put(c, t, LONG * BT, NULL), 0);
	assert_int_equal(resident(&d, k, LONG), LONG);
	/* 96 + 24 x 8 = 288 blocks through a 256-page pool. */
	assert_int_equal(kvt_flood(&d, FILLERS, 7000), 0);
	*res = resident(&d, k, LONG);
	*hits = kvt_get(c, t, LONG * BT);
	assert_true(kvt_log_has(&d, "evicted"));
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

static void prefix_survives(const char *policy)
{
	int hits, res;

	run(policy, &hits, &res);
	fprintf(stderr, "eviction %s: %d of %d blocks resident, hit prefix %d\n", policy, res,
		LONG, hits);
	/* The tail had to go (the pool is smaller than what was published,
	 * and the prompt is the oldest) ... */
	assert_true(res < LONG);
	/* ... and went first: what is left is the prefix, all of it
	 * reachable; nothing stranded. */
	assert_true(hits > 0);
	assert_int_equal(hits, res);
}

static void test_lru_keeps_the_prefix(void **state)
{
	(void)state;
	prefix_survives("lru");
}

static void test_s3fifo_keeps_the_prefix(void **state)
{
	(void)state;
	prefix_survives("s3fifo");
}

/* The control: CLOCK evicts in insertion order, the head first. The
 * blocks it leaves are cached and unreachable. */
static void test_clock_strands_the_tail(void **state)
{
	int hits, res;

	(void)state;
	run("clock", &hits, &res);
	fprintf(stderr, "eviction clock: %d of %d blocks resident, hit prefix %d\n", res, LONG,
		hits);
	assert_int_equal(hits, 0);
	assert_true(res > 0);
}

/*
 * A lookup's hit run reaches the policy whole (layout 17: its deepest
 * page and one run entry in the access ring). Under CLOCK, which gives a
 * used page a second chance in insertion order: prompt A, then prompt B,
 * 16 blocks each; A looked up; then 30 one-off prompts of 8 blocks from
 * the same client (its ring is drained before each ALLOC) through the
 * 256-page pool. Every page of A was used, so eviction passes over A and
 * takes B and the oldest one-offs: A stays whole. Were only the run's
 * first page taken from the ring, A's other 15 pages would go first.
 */
static void test_lookup_runs_reach_the_policy(void **state)
{
	const char *args[] = { "--eviction", "clock", NULL };
	static uint32_t a[16 * BT], b[16 * BT], t[8 * BT];
	struct kvt_daemon d;
	kvc_t *c;
	int i;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(a, 16 * BT, 0, 6160);
	kvt_tokens(b, 16 * BT, 0, 6170);
	assert_int_equal(kvt_put(c, a, 16 * BT, NULL), 0);
	assert_int_equal(kvt_put(c, b, 16 * BT, NULL), 0);
	assert_int_equal(kvt_get(c, a, 16 * BT), 16);
	for (i = 0; i < 30; i++) {
		kvt_tokens(t, 8 * BT, 0, 8000 + (uint32_t)i);
		assert_true(kvt_put(c, t, 8 * BT, NULL) >= 0);
	}
	assert_true(kvt_log_has(&d, "evicted"));
	assert_true(kvt_get(c, b, 16 * BT) < 16);	/* eviction went past A */
	assert_int_equal(kvt_get(c, a, 16 * BT), 16);
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/*
 * A drain takes at most KVSHM_RING_DRAIN (4096) pages from a ring, and
 * they must be the newest: a hit run is written deepest block first, so
 * a lookup of 5,000 blocks ends with its root-most blocks. Under CLOCK:
 * prompt P of 5,000 blocks, then B of 1,000, P looked up whole, then one-
 * off prompts until a few thousand pages went. The drain takes whole
 * entries from the newest back while they fit (3,972 pages here: runs of
 * 257 pages), so P's root-most blocks were used and are passed over; its
 * deepest ones and B go first, and P keeps a prefix of at least the
 * budget less one run. A drain that kept the oldest 4,096 would leave P's
 * first 904 blocks unused and take them: a prefix of 0.
 */
static void test_drain_keeps_the_newest(void **state)
{
	const char *args[] = { "--eviction", "clock", "--pool-size", "32M", "--max-share", "100", NULL };
	enum { P = 5000, B = 1000 };
	static uint32_t p[P * BT], b[B * BT], t[64 * BT];
	struct kvt_daemon d;
	int i, hits;
	kvc_t *c;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);	/* 8,192 pages */
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(p, P * BT, 0, 6180);
	kvt_tokens(b, B * BT, 0, 6190);
	assert_int_equal(kvt_put(c, p, P * BT, NULL), 0);
	assert_int_equal(kvt_put(c, b, B * BT, NULL), 0);
	assert_int_equal(kvt_get(c, p, P * BT), P);
	/* 40 x 64 = 2,560 more blocks: 8,560 through 8,192 pages. */
	for (i = 0; i < 40; i++) {
		kvt_tokens(t, 64 * BT, 0, 9000 + (uint32_t)i);
		assert_true(kvt_put(c, t, 64 * BT, NULL) >= 0);
	}
	assert_true(kvt_log_has(&d, "evicted"));
	hits = kvt_get(c, p, P * BT);
	fprintf(stderr, "drain budget: %d of %d blocks of P still hit\n", hits, P);
	assert_true(hits >= (int)(KVSHM_RING_DRAIN - KVSHM_RING_RUN_MAX - 1));
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lru_keeps_the_prefix),
		cmocka_unit_test(test_s3fifo_keeps_the_prefix),
		cmocka_unit_test(test_clock_strands_the_tail),
		cmocka_unit_test(test_lookup_runs_reach_the_policy),
		cmocka_unit_test(test_drain_keeps_the_newest),
	};

	return cmocka_run_group_tests_name("integration/evict", tests, NULL, NULL);
}
