// SPDX-License-Identifier: MIT
/*
 * share.c - the real daemon and real client processes sharing pages:
 * hits across processes with byte-exact contents, salts and extra keys
 * that keep tenants apart, N forked clients on overlapping prefixes, and
 * two clients racing to publish the same blocks (one page survives, none
 * leaks).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/harness.h"

#define BT 16

static struct kvc_stats stats(kvc_t *c)
{
	struct kvc_stats s;

	assert_int_equal(kvc_stats(c, &s), 0);
	return s;
}

static void test_publish_then_hit_elsewhere(void **state)
{
	struct kvt_daemon *d = *state;
	kvc_t *a = kvt_open(d, NULL);
	uint32_t t[10 * BT + 5];
	int cached = -1;
	pid_t p;

	assert_non_null(a);
	kvt_tokens(t, 10 * BT + 5, 0, 11);
	assert_int_equal(kvt_put(a, t, 10 * BT + 5, &cached), 0);
	assert_int_equal(cached, 10);	/* the partial block is not cached */
	/* Another process sees every block, byte for byte. */
	p = fork();
	if (!p) {
		kvc_t *b = kvt_open(d, NULL);

		_exit(b && kvt_get(b, t, 10 * BT + 5) == 10 && kvt_get(b, t, 4 * BT) == 4 ? 0 : 1);
	}
	assert_int_equal(kvt_wait(p), 0);
	/* A prompt diverging inside block 3 hits blocks 0..2 only. */
	t[3 * BT + 7] ^= 1;
	assert_int_equal(kvt_get(a, t, 10 * BT), 3);
	assert_int_equal(stats(a).lookups, 2);
	assert_int_equal(stats(a).hit_blocks, 3);
	kvc_close(a);
}

static void test_salt_and_extra_keys_isolate(void **state)
{
	struct kvt_daemon *d = *state;
	kvc_t *plain = kvt_open(d, NULL), *ta = kvt_open(d, "tenant-a"),
	      *ta2 = kvt_open(d, "tenant-a"), *tb = kvt_open(d, "tenant-b");
	uint32_t t[4 * BT];
	struct kvc_req *r;
	int cached;

	assert_non_null(plain);
	assert_non_null(ta);
	assert_non_null(ta2);
	assert_non_null(tb);
	kvt_tokens(t, 4 * BT, 0, 12);
	assert_int_equal(kvt_put(ta, t, 4 * BT, &cached), 0);
	assert_int_equal(cached, 4);
	assert_int_equal(kvt_get(ta2, t, 4 * BT), 4);	/* same salt: hit */
	assert_int_equal(kvt_get(tb, t, 4 * BT), 0);	/* other salt: miss */
	assert_int_equal(kvt_get(plain, t, 4 * BT), 0);	/* no salt: miss */

	/* Extra keys (a LoRA id, say) split the same tokens apart. */
	assert_int_equal(kvc_req_new(ta2, t, 4 * BT, "lora-7", 6, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	kvc_req_free(r);
	kvc_close(plain);
	kvc_close(ta);
	kvc_close(ta2);
	kvc_close(tb);
}

struct worker {
	const struct kvt_daemon *d;
	int id;
	int rounds;
};

/* Prompts: 6 shared blocks, then 4 blocks that depend on (id, round % 3),
 * so workers overlap on the prefix and repeat their own suffixes. */
static int worker(void *arg)
{
	struct worker *w = arg;
	kvc_t *c = kvt_open(w->d, NULL);
	uint32_t t[10 * BT];
	int i, hits;

	if (!c)
		return 2;
	for (i = 0; i < w->rounds; i++) {
		kvt_tokens(t, 10 * BT, 6 * BT, (uint32_t)(100 + w->id * 10 + i % 3));
		hits = kvt_put(c, t, 10 * BT, NULL);
		if (hits < 0)
			return hits == -1000 ? 3 : 4;	/* 3: wrong bytes */
		if (i >= 3 && hits != 10)
			return 5;	/* own prompt seen before: must fully hit */
	}
	kvc_close(c);
	return 0;
}

static void test_forked_clients_overlapping_prefixes(void **state)
{
	struct kvt_daemon *d = *state;
	struct worker w[4];
	pid_t pid[4];
	kvc_t *c;
	uint32_t t[6 * BT];
	int i;

	for (i = 0; i < 4; i++) {
		w[i] = (struct worker){ d, i, 12 };
		pid[i] = kvt_fork(worker, &w[i]);
	}
	for (i = 0; i < 4; i++)
		assert_int_equal(kvt_wait(pid[i]), 0);
	c = kvt_open(d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 6 * BT, 6 * BT, 0);
	assert_int_equal(kvt_get(c, t, 6 * BT), 6);
	/* Every page is free or ready: nothing left WRITING by the workers. */
	assert_int_equal(stats(c).pages_writing, 0);
	assert_int_equal(stats(c).pages_free + stats(c).pages_ready, stats(c).pages_total);
	kvc_close(c);
}

struct racer {
	const struct kvt_daemon *d;
	int go[2];
	int ready[2];
	int prompt;
};

/* Look up and allocate, wait for the start signal, fill and publish. */
static int racer(void *arg)
{
	struct racer *rc = arg;
	kvc_t *c = kvt_open(rc->d, NULL);
	uint32_t t[5 * BT];
	struct kvc_key k[5];
	struct kvc_req *r;
	char b = 0;
	int i, n;

	if (!c)
		return 2;
	kvt_tokens(t, 5 * BT, 0, (uint32_t)(500 + rc->prompt));
	kvc_keys(c, t, 5 * BT, NULL, 0, k, 5);
	if (kvc_req_new(c, t, 5 * BT, NULL, 0, &r) || kvc_lookup(r) != 0 || kvc_alloc(r) != 5)
		return 3;
	for (i = 0; i < 5; i++)
		kvt_fill(kvc_block(r, (size_t)i), kvc_page_bytes(c), k[i]);
	if (write(rc->ready[1], &b, 1) != 1 || read(rc->go[0], &b, 1) != 1)
		return 4;
	n = kvc_publish(r);
	if (n != 5)
		return 5;
	for (i = 0; i < 5; i++)	/* ours or the winner's: same bytes */
		if (!kvt_check(kvc_block(r, (size_t)i), kvc_page_bytes(c), k[i]))
			return 6;
	kvc_req_free(r);
	kvc_close(c);
	return 0;
}

static void test_same_block_race_one_page_no_leak(void **state)
{
	struct kvt_daemon *d = *state;
	kvc_t *c = kvt_open(d, NULL);
	struct kvc_stats before, after;
	int round;

	assert_non_null(c);
	before = stats(c);
	for (round = 0; round < 10; round++) {
		struct racer rc = { .d = d, .prompt = round };
		uint32_t t[5 * BT];
		pid_t a, b;
		char x[2];

		assert_int_equal(pipe(rc.go), 0);
		assert_int_equal(pipe(rc.ready), 0);
		a = kvt_fork(racer, &rc);
		b = kvt_fork(racer, &rc);
		assert_int_equal(read(rc.ready[0], x, 1), 1);
		assert_int_equal(read(rc.ready[0], x + 1, 1), 1);
		assert_int_equal(write(rc.go[1], "gg", 2), 2);	/* both at once */
		assert_int_equal(kvt_wait(a), 0);
		assert_int_equal(kvt_wait(b), 0);
		close(rc.go[0]);
		close(rc.go[1]);
		close(rc.ready[0]);
		close(rc.ready[1]);
		kvt_tokens(t, 5 * BT, 0, (uint32_t)(500 + round));
		assert_int_equal(kvt_get(c, t, 5 * BT), 5);
	}
	after = stats(c);
	/* 10 prompts x 5 blocks indexed once each; every losing page is free. */
	assert_int_equal(after.pages_ready - before.pages_ready, 50);
	assert_int_equal(before.pages_free - after.pages_free, 50);
	assert_int_equal(after.pages_writing, 0);
	kvc_close(c);
}


/*
 * Tensor-parallel ranks share the namespace and its pages (issue #33):
 * rank 0 and rank 1 (another process) of one model write a prompt
 * together, each its slice of every page; then the unsharded model of the
 * same name and geometry, and a third process of rank 1, hit it all.
 * kvstat shows one namespace for the model, not one per rank.
 */
static kvc_t *open_rank(const struct kvt_daemon *d, uint16_t tp_rank)
{
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	kvc_t *c = NULL;

	m.shard.tp_rank = tp_rank;
	m.shard.tp_size = 2;
	return kvc_open(&m, &o, &c) ? NULL : c;
}

static int rank_child(void *arg)
{
	const struct kvt_daemon *d = arg;
	uint32_t t[6 * BT];
	kvc_t *r1 = open_rank(d, 1);
	int cached = -1;

	if (!r1)
		return 10;
	kvt_tokens(t, 6 * BT, 0, 31);
	/* Rank 0's pages wait for this rank's slice: joined, not hits. */
	if (kvt_put(r1, t, 6 * BT, &cached) != 0 || cached != 6)
		return 12;
	kvc_close(r1);
	return 0;
}

static int same_rank_child(void *arg)
{
	const struct kvt_daemon *d = arg;
	uint32_t t[6 * BT];
	kvc_t *r1 = open_rank(d, 1);
	int hits;

	if (!r1)
		return 10;
	kvt_tokens(t, 6 * BT, 0, 31);
	hits = kvt_get(r1, t, 6 * BT);
	kvc_close(r1);
	return hits == 6 ? 0 : 20 + (hits < 0 ? 9 : hits);
}

static void test_parallel_ranks_share_pages(void **state)
{
	struct kvt_daemon *d = *state;
	kvc_t *r0 = open_rank(d, 0), *plain = kvt_open(d, NULL);
	uint32_t t[6 * BT];
	char out[8192];
	const char *args[] = { "--socket", d->sock, "--json", NULL };
	int cached = -1;

	assert_non_null(r0);
	assert_non_null(plain);
	kvt_tokens(t, 6 * BT, 0, 31);
	assert_int_equal(kvt_put(r0, t, 6 * BT, &cached), 0);
	assert_int_equal(cached, 6);	/* its slices are in */
	assert_int_equal(kvt_get(plain, t, 6 * BT), 0);	/* not whole yet */
	/* Another process, rank 1, writes the other slice of each page. */
	assert_int_equal(kvt_wait(kvt_fork(rank_child, d)), 0);
	/* Whole now: a third process of rank 1, rank 0 and the unsharded
	 * model (same name and geometry) all hit it. */
	assert_int_equal(kvt_wait(kvt_fork(same_rank_child, d)), 0);
	assert_int_equal(kvt_get(r0, t, 6 * BT), 6);
	assert_int_equal(kvt_get(plain, t, 6 * BT), 6);
	/* One namespace for the model, named without a rank. */
	assert_int_equal(kvt_run(kvt_bin("kvstat"), args, out, sizeof(out)), 0);
	assert_null(strstr(out, " tp0/2\""));
	assert_null(strstr(out, " tp1/2\""));
	assert_non_null(strstr(out, "\"name\":\"kvt-tiny\""));
	kvc_close(r0);
	kvc_close(plain);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_publish_then_hit_elsewhere),
		cmocka_unit_test(test_salt_and_extra_keys_isolate),
		cmocka_unit_test(test_forked_clients_overlapping_prefixes),
		cmocka_unit_test(test_same_block_race_one_page_no_leak),
		cmocka_unit_test(test_parallel_ranks_share_pages),
	};

	return cmocka_run_group_tests_name("integration/share", tests, kvt_setup, kvt_teardown);
}
