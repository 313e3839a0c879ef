// SPDX-License-Identifier: MIT
/*
 * api.c - every libkvclient call with bad arguments: NULL, zero, too big,
 * wrong order, a handle whose daemon went away. Each returns its negative
 * errno and changes nothing: the page counts and the index are checked
 * to be exactly as before.
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

static void test_open_arguments(void **state)
{
	struct kvt_daemon *d = *state;
	struct kvc_model m = kvt_model(), bad;
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	char longpath[200];
	kvc_t *c = (kvc_t *)1;

	assert_int_equal(kvc_open(&m, &o, NULL), -EINVAL);
	assert_int_equal(kvc_open(NULL, &o, &c), -EINVAL);
	assert_null(c);
#define BAD_MODEL(field, value) do { \
		bad = m; bad.field = value; \
		assert_int_equal(kvc_open(&bad, &o, &c), -EINVAL); \
		assert_null(c); \
	} while (0)
	BAD_MODEL(size, 8);
	BAD_MODEL(flags, 4);	/* 1 is KVC_MODEL_ENGINE_KEYS, 2 KVC_MODEL_MLA */
	BAD_MODEL(flags, KVC_MODEL_MLA);	/* an MLA model has 1 KV head, not 2 */
	BAD_MODEL(name, NULL);
	BAD_MODEL(name, "");
	BAD_MODEL(name, "a-model-name-that-is-much-longer-than-sixty-three-bytes-allowed-here");
	BAD_MODEL(dtype_bytes, 3);
	BAD_MODEL(layers, 0);
	BAD_MODEL(layers, 5000);
	BAD_MODEL(kv_heads, 0);
	BAD_MODEL(head_dim, 0);
	BAD_MODEL(block_tokens, 0);
	BAD_MODEL(block_tokens, 4096);
	BAD_MODEL(pos_kind, 99);
	BAD_MODEL(resv[2], 1);
	BAD_MODEL(shard.tp_rank, 1);	/* rank 1 of an unsharded model */
	BAD_MODEL(shard.pp_rank, 1);
	{
		struct kvc_model mb = m;

		mb.shard.tp_size = 2;
		mb.shard.tp_rank = 2;
		assert_int_equal(kvc_open(&mb, &o, &c), -EINVAL);
		mb.shard.tp_rank = 1;
		mb.shard.pp_size = 4;
		mb.shard.pp_rank = 4;
		assert_int_equal(kvc_open(&mb, &o, &c), -EINVAL);
	}
	{
		/* Heads a tensor-parallel size does not split: refused before
		 * connecting, with the reason. */
		struct kvc_model mb = m;
		struct kvc_options ob = o;
		char err[200] = "";

		ob.errbuf = err;
		ob.errbuf_len = sizeof(err);
		mb.kv_heads = 4;	/* 4 KV heads at TP 3 */
		mb.shard.tp_size = 3;
		assert_int_equal(kvc_open(&mb, &ob, &c), -EINVAL);
		assert_non_null(strstr(err, "tp_size does not divide"));
		mb.kv_heads = 64;	/* 64 ranks writing one page */
		mb.shard.tp_size = 64;
		assert_int_equal(kvc_open(&mb, &ob, &c), -EINVAL);
		assert_non_null(strstr(err, "more than 32 ranks"));
		mb.kv_heads = 3;	/* 3 heads at TP 4 */
		mb.shard.tp_size = 4;
		assert_int_equal(kvc_open(&mb, &ob, &c), -EINVAL);
		assert_non_null(strstr(err, "do not divide tp_size"));
	}
	{
		struct kvc_options ob = o;

		ob.size = 4;
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		ob.flags = 4;
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		ob.flags = KVC_OPEN_NO_INSERT | KVC_OPEN_ALLOC_AHEAD;
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		ob.max_share = 101;
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		ob.pad2 = 1;
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		ob.salt_len = 4;	/* salt NULL */
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		ob.salt = "x";
		ob.salt_len = KVC_MAX_SALT + 1;
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		ob.resv[0] = 1;
		assert_int_equal(kvc_open(&m, &ob, &c), -EINVAL);
		ob = o;
		memset(longpath, 'x', sizeof(longpath) - 1);
		longpath[sizeof(longpath) - 1] = 0;
		ob.socket_path = longpath;
		assert_int_equal(kvc_open(&m, &ob, &c), -ENAMETOOLONG);
		ob = o;
		ob.socket_path = "/nonexistent/kvcached.sock";
		assert_int_equal(kvc_open(&m, &ob, &c), -ENOENT);
	}
	/* The socket path from the environment when none is given. */
	setenv("KVCACHED_SOCKET", d->sock, 1);
	assert_int_equal(kvc_open(&m, NULL, &c), 0);
	assert_non_null(c);
	kvc_close(c);
	unsetenv("KVCACHED_SOCKET");
	kvc_close(NULL);
	kvc_req_free(NULL);
}

static void test_request_arguments(void **state)
{
	struct kvt_daemon *d = *state;
	kvc_t *c = kvt_open(d, NULL);
	uint32_t t[4 * BT];
	struct kvc_key k[4];
	struct kvc_req *r = (struct kvc_req *)1;
	struct kvc_stats before, after;

	assert_non_null(c);
	assert_int_equal(kvc_stats(c, &before), 0);
	kvt_tokens(t, 4 * BT, 0, 61);
	assert_int_equal(kvc_req_new(NULL, t, 4 * BT, NULL, 0, &r), -EINVAL);
	assert_null(r);
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, NULL), -EINVAL);
	assert_int_equal(kvc_req_new(c, NULL, 4 * BT, NULL, 0, &r), -EINVAL);
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 3, &r), -EINVAL);
	assert_int_equal(kvc_req_new(c, t, (size_t)KVC_MAX_TOKENS + 1, NULL, 0, &r), -E2BIG);
	assert_int_equal(kvc_req_new(c, t, SIZE_MAX, NULL, 0, &r), -E2BIG);
	assert_int_equal(kvc_req_new(c, t, 4 * BT, "x", KVC_MAX_EXTRA + 1, &r), -E2BIG);
	assert_int_equal(kvc_keys(NULL, t, 4 * BT, NULL, 0, k, 4), -EINVAL);
	assert_int_equal(kvc_keys(c, t, 4 * BT, NULL, 0, NULL, 4), -EINVAL);
	assert_int_equal(kvc_keys(c, t, SIZE_MAX, NULL, 0, k, 4), -E2BIG);
	assert_int_equal(kvc_keys(c, t, 4 * BT, NULL, 0, k, 2), 4);	/* writes 2 */
	assert_int_equal(kvc_lookup(NULL), -EINVAL);
	assert_int_equal(kvc_alloc(NULL), -EINVAL);
	assert_int_equal(kvc_publish(NULL), -EINVAL);
	assert_null(kvc_block(NULL, 0));
	assert_int_equal(kvc_block_page(NULL, 0), -EINVAL);
	assert_int_equal(kvc_stats(NULL, &after), -EINVAL);
	assert_int_equal(kvc_stats(c, NULL), -EINVAL);

	/* An empty prompt and a prompt shorter than a block: zero blocks. */
	assert_int_equal(kvc_req_new(c, NULL, 0, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), 0);
	assert_int_equal(kvc_publish(r), -EINVAL);
	kvc_req_free(r);
	assert_int_equal(kvc_req_new(c, t, BT - 1, NULL, 0, &r), 0);
	assert_int_equal(kvc_req_blocks(r), 0);
	kvc_req_free(r);

	/* Calls out of order. */
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_publish(r), -EINVAL);	/* before alloc */
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_lookup(r), -EINVAL);	/* twice */
	assert_null(kvc_block(r, 0));			/* no page yet */
	assert_int_equal(kvc_block_page(r, 0), -ENOENT);
	assert_int_equal(kvc_alloc(r), 4);
	assert_int_equal(kvc_alloc(r), -EINVAL);	/* twice */
	assert_int_equal(kvc_lookup(r), -EINVAL);	/* after alloc */
	assert_null(kvc_block(r, 4));			/* out of range */
	assert_int_equal(kvc_block_page(r, 4), -EINVAL);
	assert_non_null(kvc_block(r, 3));
	kvc_req_free(r);	/* never published: pages go back */

	assert_int_equal(kvc_stats(c, &after), 0);
	assert_int_equal(after.pages_free, before.pages_free);
	assert_int_equal(after.pages_ready, before.pages_ready);
	assert_int_equal(after.pages_writing, 0);
	assert_int_equal(kvt_get(c, t, 4 * BT), 0);	/* nothing indexed */
	assert_string_equal(kvc_strerror(-EMEDIUMTYPE),
			    "model geometry does not fit the kvcached pool");
	assert_int_equal(kvc_version(), KVC_VERSION_NUMBER);
	kvc_close(c);
}

static void test_daemon_gone(void **state)
{
	struct kvt_daemon *d = *state;
	kvc_t *c = kvt_open(d, NULL);
	uint32_t t[4 * BT];
	struct kvc_req *r;

	assert_non_null(c);
	kvt_tokens(t, 4 * BT, 0, 62);
	assert_int_equal(kvt_daemon_stop(d), 0);
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), -ENOTCONN);
	kvc_req_free(r);
	/* The handle is dead now: lookups say so instead of reading a
	 * segment nobody maintains. */
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), -ENOTCONN);
	kvc_req_free(r);
	kvc_close(c);
}

/*
 * Engine-keyed handles (KVC_MODEL_ENGINE_KEYS) take only kvc_req_new_keys,
 * token-keyed ones only kvc_req_new and kvc_keys; bad key arguments are
 * refused; kvc_connected sees the daemon go with no round trip.
 */
static void test_engine_keys(void **state)
{
	struct kvt_daemon own, *d = &own;
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = own.sock };
	static char big[KVC_MAX_ENGINE_KEY + 1];
	uint32_t t[BT], lens[3] = { 2, 3, 1 }, zero[2] = { 1, 0 };
	struct kvc_key k;
	struct kvc_req *r;
	kvc_t *e = NULL, *c;

	(void)state;
	assert_int_equal(kvt_daemon_start(&own, NULL), 0);	/* stopped below */
	c = kvt_open(d, NULL);
	assert_non_null(c);
	m.flags = KVC_MODEL_ENGINE_KEYS;
	assert_int_equal(kvc_open(&m, &o, &e), 0);
	kvt_tokens(t, BT, 0, 5);
	assert_int_equal(kvc_req_new(e, t, BT, NULL, 0, &r), -EINVAL);
	assert_null(r);
	assert_int_equal(kvc_keys(e, t, BT, NULL, 0, &k, 1), -EINVAL);
	assert_int_equal(kvc_req_new_keys(c, "abcdef", lens, 3, &r), -EINVAL);
	assert_int_equal(kvc_req_new_keys(e, NULL, lens, 3, &r), -EINVAL);
	assert_int_equal(kvc_req_new_keys(e, "abcdef", NULL, 3, &r), -EINVAL);
	assert_int_equal(kvc_req_new_keys(e, "a", zero, 2, &r), -EINVAL);
	lens[0] = sizeof(big);
	assert_int_equal(kvc_req_new_keys(e, big, lens, 1, &r), -E2BIG);
	assert_int_equal(kvc_req_new_keys(e, "abcdef", lens, 3, NULL), -EINVAL);
	lens[0] = 2;
	assert_int_equal(kvc_req_new_keys(e, "abcdef", lens, 3, &r), 0);
	assert_int_equal(kvc_req_blocks(r), 3);
	assert_int_equal(kvc_lookup(r), 0);
	assert_int_equal(kvc_alloc(r), 3);
	assert_int_equal(kvc_publish(r), 3);
	kvc_req_free(r);
	/* "cde" and "f" alone, in another order: keyed on their own. */
	lens[0] = 3;
	lens[1] = 1;
	assert_int_equal(kvc_req_new_keys(e, "cdef", lens, 2, &r), 0);
	assert_int_equal(kvc_lookup(r), 2);
	kvc_req_free(r);
	assert_int_equal(kvc_req_new_keys(e, NULL, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);
	kvc_req_free(r);
	assert_int_equal(kvc_connected(NULL), -EINVAL);
	assert_int_equal(kvc_connected(e), 0);
	assert_int_equal(kvt_daemon_stop(d), 0);
	assert_int_equal(kvc_connected(e), -ENOTCONN);
	assert_int_equal(kvc_connected(c), -ENOTCONN);
	kvc_close(e);
	kvc_close(c);
}

/*
 * Regression (review finding): after fork() the child shared the parent's
 * ledger and socket but had its own copy of the slot stack, so its pins
 * overwrote the parent's. The child now gets -ECHILD and its cleanup
 * leaves the parent's pins and session alone.
 */
static void test_fork_does_not_share_a_handle(void **state)
{
	struct kvt_daemon d;
	uint32_t t[4 * BT], u[4 * BT];
	struct kvc_key k[4];
	struct kvc_req *r, *r2;
	kvc_t *c;
	pid_t p;
	size_t i;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, NULL), 0);
	c = kvt_open(&d, NULL);
	assert_non_null(c);
	kvt_tokens(t, 4 * BT, 0, 8001);
	kvt_tokens(u, 4 * BT, 0, 8002);
	assert_int_equal(kvt_put(c, t, 4 * BT, NULL), 0);
	assert_int_equal(kvt_put(c, u, 4 * BT, NULL), 0);
	assert_int_equal(kvc_keys(c, t, 4 * BT, NULL, 0, k, 4), 4);
	assert_int_equal(kvc_req_new(c, t, 4 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 4);	/* the parent's pins */
	p = fork();
	if (!p) {
		int rc = 0;

		if (kvc_req_new(c, u, 4 * BT, NULL, 0, &r2) || kvc_lookup(r2) != -ECHILD)
			rc = 1;
		kvc_req_free(r2);
		kvc_req_free(r);	/* must not clear the parent's slots */
		kvc_close(c);		/* must not say BYE for the parent */
		_exit(rc);
	}
	assert_int_equal(kvt_wait(p), 0);
	assert_int_equal(kvt_flood(&d, 80, 8100), 0);	/* 640 pages through 256 */
	for (i = 0; i < 4; i++)
		assert_true(kvt_check(kvc_block(r, i), kvc_page_bytes(c), k[i]));
	kvc_req_free(r);
	/* The parent's session is intact. */
	assert_int_equal(kvc_req_new(c, u, 4 * BT, NULL, 0, &r), 0);
	assert_true(kvc_lookup(r) >= 0);
	assert_true(kvc_alloc(r) >= 0);
	kvc_req_free(r);
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/*
 * Regression (review finding): near KVC_MAX_TOKENS with large blocks the
 * library built a PUBLISH frame over KVPROTO_MAX_LEN; the daemon dropped
 * the client for it. Allocation is now capped to what one frame carries.
 */
static void test_largest_publish_fits_one_frame(void **state)
{
	const char *args[] = { "--block-tokens", "1024", "--pool-size", "24M",
			       "--max-share", "100", NULL };
	struct kvc_model m = kvt_model();
	struct kvt_daemon d;
	struct kvc_options o = { .size = sizeof(o) };
	struct kvc_req *r;
	uint32_t *t = malloc((size_t)KVC_MAX_TOKENS * 4);
	kvc_t *c;
	int got;

	(void)state;
	assert_non_null(t);
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	o.socket_path = d.sock;
	m.block_tokens = 1024;
	m.kv_heads = 1;
	m.head_dim = 1;	/* 4 KiB pages */
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	kvt_tokens(t, KVC_MAX_TOKENS, 0, 8003);
	assert_int_equal(kvc_req_new(c, t, KVC_MAX_TOKENS, NULL, 0, &r), 0);
	assert_int_equal(kvc_req_blocks(r), 4096);
	assert_int_equal(kvc_lookup(r), 0);
	got = kvc_alloc(r);
	assert_true(got > 4000 && got < 4096);	/* capped, not refused */
	assert_int_equal(kvc_publish(r), got);
	kvc_req_free(r);
	/* Still connected. */
	assert_int_equal(kvc_req_new(c, t, 4 * 1024, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 4);
	kvc_req_free(r);
	kvc_close(c);
	free(t);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

/*
 * Limits (issue #8): one process cannot take every client slot, and a
 * client that holds all its pins gets misses and no pages, while other
 * clients hit the very same blocks.
 */
static void test_limits_bound_only_the_greedy_client(void **state)
{
	const char *args[] = { "--max-per-process", "3", NULL };
	struct kvc_model m = kvt_model();
	char err[256];
	struct kvc_options o = { .size = sizeof(o), .errbuf = err, .errbuf_len = sizeof(err) };
	struct kvt_daemon d;
	kvc_t *h[3], *extra = NULL, *greedy, *other;
	struct kvc_req *held, *r;
	uint32_t t[8 * BT];
	pid_t p;
	int i;

	(void)state;
	assert_int_equal(kvt_daemon_start(&d, args), 0);
	o.socket_path = d.sock;
	for (i = 0; i < 3; i++)
		assert_int_equal(kvc_open(&m, &o, &h[i]), 0);
	assert_int_equal(kvc_open(&m, &o, &extra), -EUSERS);
	assert_non_null(strstr(err, "max-per-process"));
	p = fork();	/* another process is not affected */
	if (!p) {
		kvc_t *c = kvt_open(&d, NULL);

		_exit(c ? 0 : 1);
	}
	assert_int_equal(kvt_wait(p), 0);
	for (i = 0; i < 3; i++)
		kvc_close(h[i]);

	/* Pin quota: 8 slots, all held by one request. */
	o.max_pins = 8;
	assert_int_equal(kvc_open(&m, &o, &greedy), 0);
	other = kvt_open(&d, NULL);
	assert_non_null(other);
	kvt_tokens(t, 8 * BT, 0, 8004);
	assert_int_equal(kvt_put(other, t, 8 * BT, NULL), 0);
	assert_int_equal(kvc_req_new(greedy, t, 8 * BT, NULL, 0, &held), 0);
	assert_int_equal(kvc_lookup(held), 8);
	assert_int_equal(kvc_req_new(greedy, t, 8 * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_lookup(r), 0);	/* quota: a miss, not an error */
	assert_int_equal(kvc_alloc(r), 0);	/* and no pages to write */
	kvc_req_free(r);
	assert_int_equal(kvt_get(other, t, 8 * BT), 8);	/* others unaffected */
	kvc_req_free(held);
	assert_int_equal(kvt_get(greedy, t, 8 * BT), 8);	/* released: hits again */
	kvc_close(greedy);
	kvc_close(other);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}


/* The daemon's pool-wide WRITING count, once it holds still at `want`
 * (an alloc-ahead is answered after the publish returns). */
static uint64_t writing_settles_at(kvc_t *c, uint64_t want)
{
	struct kvc_stats s;
	int i;

	for (i = 0; i < 500; i++) {
		assert_int_equal(kvc_stats(c, &s), 0);
		if (s.pages_writing == want)
			return want;
		usleep(10000);
	}
	return s.pages_writing;
}

/*
 * KVC_OPEN_ALLOC_AHEAD: after a publish the handle holds as many pages
 * again, granted while it went on; the next request uses them (and asks
 * the daemon only for what they do not cover), publishes exactly what a
 * plain handle would, and closing gives them back.
 */
static void test_alloc_ahead(void **state)
{
	struct kvt_daemon own, *d = &own;
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = own.sock,
				 .flags = KVC_OPEN_ALLOC_AHEAD };
	uint32_t t[12 * BT];
	kvc_t *c, *plain;
	int cached, i;

	(void)state;
	assert_int_equal(kvt_daemon_start(&own, NULL), 0);	/* a pool of its own */
	plain = kvt_open(d, NULL);
	assert_non_null(plain);
	assert_int_equal(writing_settles_at(plain, 0), 0);
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	kvt_tokens(t, 8 * BT, 0, 4101);
	assert_true(kvt_put(c, t, 8 * BT, &cached) >= 0);
	assert_int_equal(cached, 8);
	/* 8 pages asked for ahead, held by c (256-page pool: at most 16). */
	assert_int_equal(writing_settles_at(plain, 8), 8);
	for (i = 0; i < 3; i++) {
		/* The next 8-block prompts take those and ask again. */
		kvt_tokens(t, 8 * BT, 0, 4102 + (uint32_t)i);
		assert_true(kvt_put(c, t, 8 * BT, &cached) >= 0);
		assert_int_equal(cached, 8);
		assert_int_equal(writing_settles_at(plain, 8), 8);
		/* Another process's view: every block there, every byte right. */
		assert_int_equal(kvt_get(plain, t, 8 * BT), 8);
	}
	/* A longer prompt: 8 from ahead, 4 more in a round trip. */
	kvt_tokens(t, 12 * BT, 0, 4200);
	assert_true(kvt_put(c, t, 12 * BT, &cached) >= 0);
	assert_int_equal(cached, 12);
	assert_int_equal(kvt_get(plain, t, 12 * BT), 12);
	/* 12 asked ahead, capped at 1/16 of the pool. */
	assert_int_equal(writing_settles_at(plain, 12), 12);
	/* A lookup-only request on the handle reads the pending reply first
	 * and stays in step. */
	assert_int_equal(kvt_get(c, t, 12 * BT), 12);
	kvc_close(c);
	assert_int_equal(writing_settles_at(plain, 0), 0);
	kvc_close(plain);
	assert_int_equal(kvt_daemon_stop(&own), 0);
}

/*
 * A grant of fewer pages than asked says which limit cut it (issue #24:
 * kvdemo published 64 of 109 blocks and said nothing): the process's
 * max-share, the handle's pin slots, the pool's free pages.
 */
static int short_grant(kvc_t *c, uint32_t seed, size_t blocks, int *why)
{
	uint32_t *t = malloc(blocks * BT * sizeof(uint32_t));
	struct kvc_req *r;
	int got;

	assert_non_null(t);
	kvt_tokens(t, blocks * BT, 0, seed);
	assert_int_equal(kvc_req_new(c, t, blocks * BT, NULL, 0, &r), 0);
	assert_int_equal(kvc_req_short_reason(r), 0);	/* nothing asked yet */
	assert_int_equal(kvc_lookup(r), 0);
	got = kvc_alloc(r);
	*why = kvc_req_short_reason(r);
	kvc_req_free(r);
	free(t);
	return got;
}

static void test_short_grant_says_why(void **state)
{
	const char *half[] = { "--pool-size", "256K", NULL };	/* 64 pages, share 32 */
	const char *whole[] = { "--pool-size", "256K", "--max-share", "100", NULL };
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .max_pins = 256 };
	struct kvt_daemon d;
	kvc_t *c;
	int why;

	(void)state;
	assert_int_equal(kvc_req_short_reason(NULL), -EINVAL);
	assert_int_equal(kvt_daemon_start(&d, half), 0);
	o.socket_path = d.sock;
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(short_grant(c, 9100, 4, &why), 4);
	assert_int_equal(why, 0);			/* every block granted */
	assert_int_equal(short_grant(c, 9101, 40, &why), 32);
	assert_int_equal(why, -EDQUOT);			/* the share cut it */
	kvc_close(c);
	o.max_pins = 6;
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(short_grant(c, 9102, 10, &why), 6);
	assert_int_equal(why, -ENOSPC);			/* the pin slots */
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);

	assert_int_equal(kvt_daemon_start(&d, whole), 0);
	o.socket_path = d.sock;
	o.max_pins = 256;
	assert_int_equal(kvc_open(&m, &o, &c), 0);
	assert_int_equal(short_grant(c, 9103, 80, &why), 64);
	assert_int_equal(why, -ENOSPC);			/* the pool's pages */
	kvc_close(c);
	assert_int_equal(kvt_daemon_stop(&d), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_arguments),
		cmocka_unit_test(test_request_arguments),
		cmocka_unit_test(test_daemon_gone),
		cmocka_unit_test(test_engine_keys),
		cmocka_unit_test(test_fork_does_not_share_a_handle),
		cmocka_unit_test(test_largest_publish_fits_one_frame),
		cmocka_unit_test(test_limits_bound_only_the_greedy_client),
		cmocka_unit_test(test_alloc_ahead),
		cmocka_unit_test(test_short_grant_says_why),
	};

	return cmocka_run_group_tests_name("integration/api", tests, kvt_setup, kvt_teardown);
}
