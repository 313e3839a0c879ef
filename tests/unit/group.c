// SPDX-License-Identifier: MIT
/*
 * group.c - unit tests for libclient/group.c, kvc_group: groups by first
 * full block, leaders first, the trie order inside a group, what counts
 * (full blocks only), and every documented error. The expected orders are
 * worked out by hand from the documented rules.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../libclient/kvclient.h"

#define BT 4

/* A prompt of blocks named by letters: "AAB" = blocks A, A, B, each BT
 * tokens of that letter; a trailing digit d adds d loose tokens. */
static uint32_t *mk(const char *spec, size_t *len)
{
	uint32_t *t = malloc(64 * BT * sizeof(uint32_t));
	size_t n = 0;

	for (; *spec; spec++) {
		if (*spec >= '0' && *spec <= '9') {
			for (int k = 0; k < *spec - '0'; k++)
				t[n++] = 7;
			continue;
		}
		for (int k = 0; k < BT; k++)
			t[n++] = (uint32_t)*spec;
	}
	*len = n;
	return t;
}

static int run(const char *const *spec, size_t n, size_t *order, size_t *group_of)
{
	uint32_t *p[16];
	size_t len[16];
	int rc;

	for (size_t i = 0; i < n; i++)
		p[i] = mk(spec[i], &len[i]);
	rc = kvc_group((const uint32_t *const *)p, len, n, BT, order, group_of);
	for (size_t i = 0; i < n; i++)
		free(p[i]);
	return rc;
}

/* Sorted order differs from arrival order: groups are still numbered by
 * their earliest prompt (E arrived first), which the cases above never
 * needed (found by review). */
static void test_groups_numbered_by_arrival(void **state)
{
	const char *spec[] = { "EEa", "DDa", "DDb" };
	size_t order[3], g[3];

	(void)state;
	assert_int_equal(run(spec, 3, order, g), 2);
	assert_int_equal(g[0], 0);
	assert_int_equal(g[1], 1);
	assert_int_equal(g[2], 1);
	/* Leaders first, by group: E's, then D's earliest; then the rest. */
	assert_int_equal(order[0], 0);
	assert_int_equal(order[1], 1);
	assert_int_equal(order[2], 2);
}

static void test_groups_leaders_first(void **state)
{
	/* Arrival: two documents D and E interleaved with questions. */
	const char *spec[] = { "DDDa", "EEb", "DDDb", "EEa", "DDDc", "X" };
	size_t order[6], g[6];

	(void)state;
	assert_int_equal(run(spec, 6, order, g), 3);
	/* Groups numbered by earliest prompt: D=0 (prompt 0), E=1, X=2. */
	assert_int_equal(g[0], 0);
	assert_int_equal(g[2], 0);
	assert_int_equal(g[4], 0);
	assert_int_equal(g[1], 1);
	assert_int_equal(g[3], 1);
	assert_int_equal(g[5], 2);
	/* Leaders: one per group, earliest on ties (all D prompts share 3). */
	assert_int_equal(order[0], 0);
	assert_int_equal(order[1], 1);
	assert_int_equal(order[2], 5);
	/* Then D's others, then E's, in trie order ("DDDb" < "DDDc"). */
	assert_int_equal(order[3], 2);
	assert_int_equal(order[4], 4);
	assert_int_equal(order[5], 3);
}

static void test_leader_shares_most(void **state)
{
	/* Prompt 0 shares one block with the rest; 1 and 2 share three. */
	const char *spec[] = { "AZ", "ABCD", "ABCE", "AB" };
	size_t order[4];

	(void)state;
	assert_int_equal(run(spec, 4, order, NULL), 1);
	assert_int_equal(order[0], 1);	/* shares ABC with prompt 2 */
	/* The rest in trie order: AB, ABCE, AZ. */
	assert_int_equal(order[1], 3);
	assert_int_equal(order[2], 2);
	assert_int_equal(order[3], 0);
}

static void test_only_full_blocks_count(void **state)
{
	/* Equal loose tokens do not group; no full block: own group. */
	const char *spec[] = { "3", "3", "A3", "B3", "A1" };
	size_t order[5], g[5];

	(void)state;
	assert_int_equal(run(spec, 5, order, g), 4);
	assert_int_equal(g[0], 0);
	assert_int_equal(g[1], 1);
	assert_int_equal(g[2], 2);
	assert_int_equal(g[4], 2);
	assert_int_equal(g[3], 3);
	/* A permutation. */
	for (size_t i = 0, seen = 0; i < 5; i++) {
		assert_true(order[i] < 5);
		assert_false(seen & (1u << order[i]));
		seen |= 1u << order[i];
	}
}

static void test_errors(void **state)
{
	uint32_t t[8] = { 0 };
	const uint32_t *p[2] = { t, NULL };
	size_t len[2] = { 8, 4 }, order[2];

	(void)state;
	assert_int_equal(kvc_group(NULL, NULL, 0, 0, NULL, NULL), 0);
	assert_int_equal(kvc_group(NULL, len, 1, BT, order, NULL), -EINVAL);
	assert_int_equal(kvc_group(p, NULL, 1, BT, order, NULL), -EINVAL);
	assert_int_equal(kvc_group(p, len, 1, BT, NULL, NULL), -EINVAL);
	assert_int_equal(kvc_group(p, len, 1, 0, order, NULL), -EINVAL);
	assert_int_equal(kvc_group(p, len, 2, BT, order, NULL), -EINVAL);	/* NULL with tokens */
	len[1] = 0;
	assert_int_equal(kvc_group(p, len, 2, BT, order, NULL), 2);
	len[0] = (size_t)KVC_MAX_TOKENS + 1;
	assert_int_equal(kvc_group(p, len, 1, BT, order, NULL), -E2BIG);
	assert_int_equal(kvc_group(p, len, (size_t)1 << 25, BT, order, NULL), -E2BIG);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_groups_leaders_first),
		cmocka_unit_test(test_groups_numbered_by_arrival),
		cmocka_unit_test(test_leader_shares_most),
		cmocka_unit_test(test_only_full_blocks_count),
		cmocka_unit_test(test_errors),
	};

	return cmocka_run_group_tests_name("group", tests, NULL, NULL);
}
