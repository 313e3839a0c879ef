// SPDX-License-Identifier: MIT
/*
 * policy.c - unit tests for daemon/policy*.c: which victims each eviction
 * policy picks on small synthetic traces.
 *
 * lru: least recently used first; a request's tail before its head (the
 * publish order publish.c uses); a parent whose children are cached waits
 * for them, then comes back at the cold end; stranded children (their
 * parent gone) before everything else; a kept candidate comes back as
 * just used; ids out of range or not held are ignored. s3fifo: a scan of
 * blocks used once leaves while a hot set stays; a block evicted from the
 * small queue and seen again goes to main; prefix rules as lru. clock:
 * second chance, and no prefix rule (its parents can go first). Each
 * policy also recycles spill slots, with the same calls.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../daemon/policy/policy.h"

#define NONE KVD_POLICY_NONE

static struct kvd_policy P;

static void open_policy(int e, uint32_t n)
{
	assert_int_equal(kvd_policy_open(&P, e, n), 0);
}

static int teardown(void **state)
{
	(void)state;
	kvd_policy_close(&P);
	return 0;
}

/* Insert a request's chain of n blocks starting at id `first`, its root
 * under `parent`, in order (as publish.c inserts a PUBLISH). */
static void publish_chain(uint32_t first, uint32_t n, uint32_t parent)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		kvd_policy_insert(&P, first + i, i ? first + i - 1 : parent, 1000 + first + i);
}

/* A lookup's hit run, deepest first (as lookup.c writes the ring). */
static void hit_chain(uint32_t first, uint32_t n)
{
	uint32_t i;

	for (i = n; i--;)
		kvd_policy_touch(&P, first + i);
}

/* Pick and evict: the victim leaves. */
static uint32_t evict(void)
{
	uint32_t v = kvd_policy_pick(&P);

	if (v != NONE)
		kvd_policy_remove(&P, v);
	return v;
}

static void test_names(void **state)
{
	(void)state;
	assert_int_equal(kvd_eviction_parse("lru"), KVD_EVICTION_LRU);
	assert_int_equal(kvd_eviction_parse("s3fifo"), KVD_EVICTION_S3FIFO);
	assert_int_equal(kvd_eviction_parse("clock"), KVD_EVICTION_CLOCK);
	assert_int_equal(kvd_eviction_parse("arc"), -1);
	assert_string_equal(kvd_eviction_name(KVD_EVICTION_S3FIFO), "s3fifo");
	assert_int_equal(kvd_policy_open(&P, 7, 8), -EINVAL);
}

/* Plain LRU order over independent blocks; a use moves a block last. */
static void test_lru_order(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_LRU, 8);
	kvd_policy_insert(&P, 0, NONE, 1);
	kvd_policy_insert(&P, 1, NONE, 2);
	kvd_policy_insert(&P, 2, NONE, 3);
	kvd_policy_touch(&P, 0);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 0);
	assert_int_equal(evict(), NONE);
	assert_int_equal(P.held, 0);
}

/* A request's blocks go tail first, and a chain hit again outlives one
 * that was not. */
static void test_lru_tail_first(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_LRU, 16);
	publish_chain(0, 4, NONE);	/* request A: 0 <- 1 <- 2 <- 3 */
	publish_chain(4, 4, NONE);	/* request B: 4 <- ... <- 7 */
	hit_chain(0, 2);		/* A's first two blocks hit again */
	/* A's tail (3, 2) is older than B; then B tail first; then A's hit
	 * run, tail first. */
	assert_int_equal(evict(), 3);
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 7);
	assert_int_equal(evict(), 6);
	assert_int_equal(evict(), 5);
	assert_int_equal(evict(), 4);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), 0);
}

/* A new block enters just colder than its parent. */
static void test_lru_behind_parent(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_LRU, 8);
	kvd_policy_insert(&P, 0, NONE, 1);
	kvd_policy_insert(&P, 5, NONE, 2);
	kvd_policy_insert(&P, 1, 0, 3);		/* behind 0, before 5 */
	kvd_policy_insert(&P, 2, 0, 4);		/* behind 0 too */
	kvd_policy_insert(&P, 6, NONE, 5);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 0);
	assert_int_equal(evict(), 5);
	assert_int_equal(evict(), 6);
}

/* The evictor takes a batch of candidates before it removes any: a
 * candidate's parent is next in line, not held back by it; one that is
 * kept (pinned) goes back under its parent. */
static void test_lru_batch(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_LRU, 16);
	publish_chain(0, 4, NONE);	/* 0 <- 1 <- 2 <- 3, oldest */
	publish_chain(4, 2, NONE);	/* 4 <- 5 */
	assert_int_equal(kvd_policy_pick(&P), 3);
	assert_int_equal(kvd_policy_pick(&P), 2);
	assert_int_equal(kvd_policy_pick(&P), 1);
	/* 3 goes; 2 and 1 were pinned: back, under their parents. */
	kvd_policy_remove(&P, 3);
	kvd_policy_keep(&P, 1);
	kvd_policy_keep(&P, 2);
	/* Now newest: 2 (kept last), then 1; 1's parent 0 is the coldest
	 * but has a child again, so 5 and 4 go first. */
	assert_int_equal(evict(), 5);
	assert_int_equal(evict(), 4);
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), 0);
}

/* A parent older than its children (they were used without it: a lost
 * ring entry) waits for them, then is the coldest. */
static void test_lru_children_first(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_LRU, 8);
	kvd_policy_insert(&P, 0, NONE, 1);	/* parent */
	kvd_policy_insert(&P, 1, 0, 3);		/* children of 0 */
	kvd_policy_insert(&P, 2, 0, 4);
	kvd_policy_insert(&P, 5, NONE, 2);	/* unrelated */
	kvd_policy_touch(&P, 1);
	kvd_policy_touch(&P, 2);
	kvd_policy_insert(&P, 6, NONE, 5);	/* unrelated, newest */
	/* 0 is the LRU but has children: 5 goes, then 1. */
	assert_int_equal(evict(), 5);
	assert_int_equal(evict(), 1);
	/* 2 is 0's last child: after it, 0 is a leaf at the cold end. */
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 0);
	assert_int_equal(evict(), 6);
}

/* Children whose parent left the pool go before anything else. */
static void test_lru_stranded(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_LRU, 16);
	publish_chain(0, 3, NONE);	/* 0 <- 1 <- 2, the oldest */
	publish_chain(3, 3, NONE);	/* 3 <- 4 <- 5 */
	kvd_policy_insert(&P, 6, 4, 9);	/* a second child of 4 */
	hit_chain(3, 2);		/* 3, 4 hit: the newest */
	/* 4 leaves the pool some other way (dropped, punched out): 5 and 6
	 * cannot be reached. They go first, before the older 2, 1, 0. */
	kvd_policy_remove(&P, 4);
	uint32_t a = evict(), b = evict();

	assert_true((a == 5 && b == 6) || (a == 6 && b == 5));
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), 0);
	assert_int_equal(evict(), 3);
	assert_int_equal(evict(), NONE);
}

/* A candidate that cannot go (pinned) comes back as just used; a parent
 * whose child was kept stays parked until touched. */
static void test_lru_keep(void **state)
{
	uint32_t v;

	(void)state;
	open_policy(KVD_EVICTION_LRU, 8);
	kvd_policy_insert(&P, 0, NONE, 1);
	kvd_policy_insert(&P, 1, NONE, 2);
	kvd_policy_insert(&P, 2, NONE, 3);
	v = kvd_policy_pick(&P);
	assert_int_equal(v, 0);
	/* While picked, a touch changes nothing and a second pick skips it. */
	kvd_policy_touch(&P, 0);
	assert_int_equal(kvd_policy_pick(&P), 1);
	kvd_policy_keep(&P, 1);
	kvd_policy_keep(&P, 0);
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), 0);
}

/* Touches come from client memory: anything out of range or not held is
 * ignored, and a block reused for another id starts afresh. */
static void test_untrusted_touch(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_LRU, 4);
	kvd_policy_touch(&P, 3);
	kvd_policy_touch(&P, 4);
	kvd_policy_touch(&P, UINT32_MAX);
	kvd_policy_touch(&P, NONE - 1);
	assert_int_equal(kvd_policy_pick(&P), NONE);
	kvd_policy_insert(&P, 1, 77, 1);	/* parent out of range: a root */
	kvd_policy_insert(&P, 2, 2, 2);		/* itself: a root */
	kvd_policy_insert(&P, 3, 0, 3);		/* not held: a root */
	kvd_policy_insert(&P, 1, NONE, 4);	/* again: replaces, not doubled */
	assert_int_equal(P.held, 3);
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 3);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), NONE);
	kvd_policy_remove(&P, 1);	/* twice: nothing */
	kvd_policy_remove(&P, 9);
	assert_int_equal(P.held, 0);
}

/* S3-FIFO: a hot set used again and again survives a long scan of
 * blocks used once; the scan's blocks are the victims. */
static void test_s3fifo_scan(void **state)
{
	uint32_t i, v;

	(void)state;
	open_policy(KVD_EVICTION_S3FIFO, 128);
	/* Hot set: 8 blocks, each used twice after it came in. */
	for (i = 0; i < 8; i++)
		kvd_policy_insert(&P, i, NONE, i);
	for (i = 0; i < 8; i++) {
		kvd_policy_touch(&P, i);
		kvd_policy_touch(&P, i);
	}
	/* A scan: 100 one-off blocks, keeping the cache at 20 blocks. */
	for (i = 0; i < 100; i++) {
		kvd_policy_insert(&P, 8 + i, NONE, 1000 + i);
		while (P.held > 20) {
			v = evict();
			assert_true(v >= 8);	/* never the hot set */
		}
	}
	for (i = 0; i < 8; i++)
		assert_true(kvd_policy_held(&P, i));
}

/* ...which plain LRU cannot do: the same trace flushes the hot set. */
static void test_lru_scan_flushes(void **state)
{
	uint32_t i, hot_gone = 0;

	(void)state;
	open_policy(KVD_EVICTION_LRU, 128);
	for (i = 0; i < 8; i++)
		kvd_policy_insert(&P, i, NONE, i);
	for (i = 0; i < 8; i++)
		kvd_policy_touch(&P, i);
	for (i = 0; i < 100; i++) {
		kvd_policy_insert(&P, 8 + i, NONE, 1000 + i);
		while (P.held > 20)
			hot_gone += evict() < 8;
	}
	assert_int_equal(hot_gone, 8);
}

/* A block evicted from the small queue that comes back goes to main: it
 * outlives blocks new to the small queue. */
static void test_s3fifo_ghost(void **state)
{
	uint32_t i;

	(void)state;
	open_policy(KVD_EVICTION_S3FIFO, 64);
	for (i = 0; i < 10; i++)
		kvd_policy_insert(&P, i, NONE, 500 + i);
	assert_int_equal(evict(), 0);	/* small's oldest, remembered */
	kvd_policy_insert(&P, 0, NONE, 500);	/* seen again: main */
	for (i = 10; i < 20; i++)
		kvd_policy_insert(&P, i, NONE, 500 + i);
	/* Small (1..9, 10..19) empties before main's block 0 is looked at. */
	for (i = 0; i < 19; i++)
		assert_int_not_equal(evict(), 0);
	assert_int_equal(evict(), 0);
}

/* The ghost is exact and remembers the last 2n evictions from small:
 * blocks never seen go to small, whatever came before; a block evicted
 * within the last 2n goes to main; one evicted before that, to small. */
static void test_s3fifo_ghost_exact(void **state)
{
	uint32_t i, fp = 0;

	(void)state;
	open_policy(KVD_EVICTION_S3FIFO, 64);
	/* 1000 one-off blocks through a cache of 16: ghost wraps ~8 times. */
	for (i = 0; i < 1000; i++) {
		kvd_policy_insert(&P, i % 64, NONE, 10000 + fp++);
		while (P.held > 16)
			evict();
	}
	while (P.held)
		evict();
	/* Fresh fingerprints: all to small (list 1). */
	for (i = 0; i < 32; i++) {
		kvd_policy_insert(&P, i, NONE, 500000 + i);
		assert_int_equal(P.node[i].list, 1);
	}
	while (P.held)
		evict();
	/* 32 evicted just now (within 2n = 128): to main (list 2). */
	kvd_policy_insert(&P, 0, NONE, 500000 + 5);
	assert_int_equal(P.node[0].list, 2);
	/* Evicted 1000 - 5 evictions ago, forgotten: to small. */
	kvd_policy_insert(&P, 1, NONE, 10000 + 5);
	assert_int_equal(P.node[1].list, 1);
	/* The last of the long run, within 2n: to main. */
	kvd_policy_insert(&P, 2, NONE, 10000 + 999);
	assert_int_equal(P.node[2].list, 2);
}

/* S3-FIFO keeps the prefix rules: children before an older parent, and
 * stranded children first. */
static void test_s3fifo_prefix(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_S3FIFO, 16);
	kvd_policy_insert(&P, 0, NONE, 1);
	kvd_policy_insert(&P, 1, 0, 2);
	kvd_policy_insert(&P, 2, 1, 3);
	kvd_policy_insert(&P, 3, NONE, 4);
	assert_int_equal(evict(), 2);
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), 0);
	/* stranded */
	kvd_policy_insert(&P, 4, 3, 5);
	kvd_policy_insert(&P, 5, NONE, 6);
	kvd_policy_remove(&P, 3);
	assert_int_equal(evict(), 4);
	assert_int_equal(evict(), 5);
}

/* CLOCK: a used block gets a second chance; parents are not protected
 * and stranded children are not preferred (the baseline). */
static void test_clock(void **state)
{
	(void)state;
	open_policy(KVD_EVICTION_CLOCK, 8);
	kvd_policy_insert(&P, 0, NONE, 1);
	kvd_policy_insert(&P, 1, 0, 2);
	kvd_policy_insert(&P, 2, NONE, 3);
	kvd_policy_touch(&P, 1);
	assert_int_equal(evict(), 0);	/* the parent goes first */
	assert_int_equal(evict(), 2);	/* 1 had its second chance */
	assert_int_equal(evict(), 1);
	assert_int_equal(evict(), NONE);
}

/* One pick does bounded work: parked parents cost one step each, paid
 * by the inserts of their children, and the budget caps a pick. */
static void test_pick_bounded(void **state)
{
	uint32_t i, n = 3 * KVD_POLICY_STEPS;

	(void)state;
	open_policy(KVD_EVICTION_LRU, 2 * n);
	/* n parents, each older than its one child (used since): every
	 * parent reaches the cold end with a child. */
	for (i = 0; i < n; i++)
		kvd_policy_insert(&P, i, NONE, i);
	for (i = 0; i < n; i++)
		kvd_policy_insert(&P, n + i, i, n + i);
	for (i = 0; i < n; i++)
		kvd_policy_touch(&P, n + i);
	/* The first pick parks at most the budget and gives up: none. */
	assert_int_equal(kvd_policy_pick(&P), NONE);
	assert_int_equal(kvd_policy_pick(&P), NONE);
	/* The third reaches the children (all parents parked by then). */
	assert_int_equal(kvd_policy_pick(&P), n);
	kvd_policy_remove(&P, n);
	/* Its parent is a leaf now, at the cold end. */
	assert_int_equal(evict(), 0);
	assert_int_equal(evict(), n + 1);
	assert_int_equal(evict(), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_names, teardown),
		cmocka_unit_test_teardown(test_lru_order, teardown),
		cmocka_unit_test_teardown(test_lru_tail_first, teardown),
		cmocka_unit_test_teardown(test_lru_behind_parent, teardown),
		cmocka_unit_test_teardown(test_lru_children_first, teardown),
		cmocka_unit_test_teardown(test_lru_batch, teardown),
		cmocka_unit_test_teardown(test_lru_stranded, teardown),
		cmocka_unit_test_teardown(test_lru_keep, teardown),
		cmocka_unit_test_teardown(test_untrusted_touch, teardown),
		cmocka_unit_test_teardown(test_s3fifo_scan, teardown),
		cmocka_unit_test_teardown(test_lru_scan_flushes, teardown),
		cmocka_unit_test_teardown(test_s3fifo_ghost, teardown),
		cmocka_unit_test_teardown(test_s3fifo_ghost_exact, teardown),
		cmocka_unit_test_teardown(test_s3fifo_prefix, teardown),
		cmocka_unit_test_teardown(test_clock, teardown),
		cmocka_unit_test_teardown(test_pick_bounded, teardown),
	};

	return cmocka_run_group_tests_name("policy", tests, NULL, NULL);
}
