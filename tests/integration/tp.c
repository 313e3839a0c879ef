// SPDX-License-Identifier: MIT
/*
 * tp.c - tensor-parallel ranks against the real daemon: one namespace and
 * one copy of a block's KV whatever TP size wrote it (issue #33).
 *
 * The model: 2 layers, 4 KV heads of 16, 2-byte dtype, 16-token blocks:
 * 8 KiB pages holding every head. Ranks are kvc_t handles with a shard;
 * each moves its heads between the page and an engine cache of its own
 * ([blocks, 16 tokens, its heads, 16] per layer, K and V) with
 * kvc_scatter / kvc_gather, and every byte is checked against the value
 * the model's KV has there (a function of the block key, layer, K/V,
 * token, model head and dim), so a rank that wrote or read another's
 * heads, or a page missing a slice, fails.
 *
 *   - TP 2 writes a prompt: each rank joins the same page per block; the
 *     page is in flight until the last slice is published, then a hit at
 *     TP 1, 2 and 4, with the pool holding one page per block.
 *   - published at TP 1 and at TP 4, read at every other size.
 *   - replicated heads (TP 4 over 2 KV heads): ranks 0 and 2 write, 1 and
 *     3 only read (kvc_alloc grants them nothing: -EPERM); stored once.
 *   - MLA at TP 4: rank 0 writes, all four read the same pages: the pool
 *     holds a quarter of four copies.
 *   - a rank that releases its slice unwritten, one SIGKILLed after
 *     joining, and a slice nobody asks for within slice-timeout-ms: the
 *     page is given up (slice_dropped), its waiters get a miss, the other
 *     rank's publish of it is a miss (-ESTALE), never an error, and the
 *     page goes back to the free pages.
 *   - a TP 4 rank cannot join a TP 2 engine's page (-EBUSY); a TP 1
 *     engine's publish of the same block takes the page over, and the TP 2
 *     page becomes a duplicate once whole.
 *   - a client of a tensor-parallel rank that names a page it holds no
 *     slice of is refused and disconnected.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/obswait.h"
#include "../../libclient/observe.h"
#include "../../shm/proto.h"
#include "../../shm/segment.h"

#define BT 16
#define LAYERS 2
#define HEADS 4
#define HD 16
#define NB 6			/* blocks of the prompt */
#define LONG_MS 60000		/* a bug fails the test, never hangs it */

static const char *const daemon_args[] = { "--page-size", "8K", "--pool-size", "1M",
					   "--slice-timeout-ms", "300", NULL };

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static struct kvobs obs;
#define STAT(f) KVT_STAT(&obs, f)
#define UNTIL(cond) KVT_UNTIL(cond, LONG_MS)

/* A rank: its handle, the heads it holds, its engine cache. */
struct rank {
	kvc_t *c;
	uint32_t h0, hn;
	bool writes, mla;
	uint16_t *k[LAYERS], *v[LAYERS];	/* [NB][BT][hn][HD] (MLA: [NB][BT][HD]) */
	struct kvc_layout l;
};

static const char *model_name(bool mla, uint32_t heads)
{
	return mla ? "kvt-tp-mla" : heads == HEADS ? "kvt-tp" : "kvt-tp2h";
}

static void rank_open(struct rank *r, const struct kvt_daemon *d, uint32_t heads, bool mla,
		      uint32_t tp, uint32_t rk, const char *name)
{
	struct kvc_model m = {
		.size = sizeof(m), .flags = mla ? KVC_MODEL_MLA : 0, .name = name,
		.dtype_bytes = 2, .layers = LAYERS, .kv_heads = mla ? 1 : heads,
		.head_dim = mla ? 4 * HD : HD, .block_tokens = BT, .pos_kind = KVC_POS_ROPE,
		.shard = { .tp_rank = (uint16_t)rk, .tp_size = (uint16_t)tp },
	};
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	size_t bytes;
	int l, w;

	memset(r, 0, sizeof(*r));
	assert_int_equal(kvc_open(&m, &o, &r->c), 0);
	w = kvc_heads(r->c, &r->h0, &r->hn);
	assert_true(w == 0 || w == 1);
	r->writes = w;
	r->mla = mla;
	bytes = (size_t)NB * BT * (mla ? 4 * HD : r->hn * HD) * 2;
	for (l = 0; l < LAYERS; l++) {
		r->k[l] = calloc(1, bytes);
		r->v[l] = calloc(1, bytes);
		assert_non_null(r->k[l]);
		assert_non_null(r->v[l]);
	}
	r->l = (struct kvc_layout){ .size = sizeof(r->l),
				    .kind = mla ? KVC_LAYOUT_MLA : KVC_LAYOUT_KV,
				    .layers = LAYERS, .num_blocks = NB,
				    .k = (void *const *)r->k, .v = mla ? NULL : (void *const *)r->v };
}

static void rank_close(struct rank *r)
{
	int l;

	kvc_close(r->c);
	for (l = 0; l < LAYERS; l++) {
		free(r->k[l]);
		free(r->v[l]);
	}
}

/* The model's KV at (block key, layer, K/V, token, model head, dim). */
static uint16_t kv_at(struct kvc_key key, int layer, int s, int t, uint32_t h, int d)
{
	uint64_t x = key.lo ^ ((uint64_t)layer << 40 | (uint64_t)s << 36 | (uint64_t)t << 24 |
			       (uint64_t)h << 12 | (uint64_t)d);

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 29;
	return (uint16_t)(x | 1);	/* never 0: an unwritten head reads 0 */
}

/* Engine element of block b (engine block b holds request block b). */
static uint16_t *eng(struct rank *r, int layer, int s, int b, int t, uint32_t h, int d)
{
	uint16_t *base = s ? r->v[layer] : r->k[layer];
	uint32_t w = r->mla ? 4 * HD : r->hn * HD;

	return base + ((size_t)b * BT + t) * w + (r->mla ? 0 : h * HD) + d;
}

static void each(struct rank *r, struct kvc_req *q, size_t n, bool fill)
{
	struct kvc_key keys[NB];
	size_t b;
	int layer, s, t, d;
	uint32_t h;

	assert_int_equal(kvc_req_keys(q, keys, NB), NB);
	for (b = 0; b < n; b++)
		for (layer = 0; layer < LAYERS; layer++)
			for (s = 0; s < (r->mla ? 1 : 2); s++)
				for (t = 0; t < BT; t++)
					for (h = 0; h < (r->mla ? 1 : r->hn); h++)
						for (d = 0; d < (r->mla ? 4 * HD : HD); d++) {
							uint16_t want = kv_at(keys[b], layer, s, t, r->h0 + h, d);
							uint16_t *e = eng(r, layer, s, (int)b, t, h, d);

							if (fill)
								*e = want;
							else if (*e != want)
								fail_msg("block %zu layer %d %s token %d head %u dim %d: %#x, want %#x",
									 b, layer, s ? "V" : "K", t, r->h0 + h, d, *e, want);
						}
}

static const int64_t ids[NB] = { 0, 1, 2, 3, 4, 5 };

static void prompt_tokens(uint32_t *t, uint32_t seed)
{
	kvt_tokens(t, NB * BT, 0, seed);
}

static struct kvc_req *req_of(struct rank *r, uint32_t seed)
{
	uint32_t t[NB * BT];
	struct kvc_req *q = NULL;

	prompt_tokens(t, seed);
	assert_int_equal(kvc_req_new(r->c, t, NB * BT, NULL, 0, &q), 0);
	return q;
}

/* Look up, gather the hits and check every byte of this rank's heads;
 * returns the hits. */
static int read_back(struct rank *r, uint32_t seed)
{
	struct kvc_req *q = req_of(r, seed);
	int hits = kvc_lookup(q), l;

	assert_true(hits >= 0);
	for (l = 0; l < LAYERS; l++) {
		memset(r->k[l], 0, (size_t)NB * BT * (r->mla ? 4 * HD : r->hn * HD) * 2);
		memset(r->v[l], 0, (size_t)NB * BT * (r->mla ? 4 * HD : r->hn * HD) * 2);
	}
	if (hits) {
		assert_int_equal(kvc_gather(q, 0, (size_t)hits, &r->l, ids, NULL), 0);
		each(r, q, (size_t)hits, false);
	}
	kvc_req_free(q);
	return hits;
}

/* Look up (nothing cached), allocate and scatter this rank's heads;
 * returns the request, granted and unpublished. */
static struct kvc_req *begin(struct rank *r, uint32_t seed, int want_granted)
{
	struct kvc_req *q = req_of(r, seed);

	assert_int_equal(kvc_lookup(q), 0);
	assert_int_equal(kvc_alloc(q), want_granted);
	if (want_granted) {
		each(r, q, (size_t)want_granted, true);
		assert_int_equal(kvc_scatter(q, 0, (size_t)want_granted, &r->l, ids, NULL), 0);
	}
	return q;
}

/* Every writing rank of an engine of `tp` ranks writes the prompt. */
static void write_at(const struct kvt_daemon *d, uint32_t heads, bool mla, uint32_t tp,
		     uint32_t seed)
{
	struct rank r[8];
	struct kvc_req *q[8];
	uint32_t i;

	for (i = 0; i < tp; i++)
		rank_open(&r[i], d, heads, mla, tp, i, model_name(mla, heads));
	for (i = 0; i < tp; i++)
		q[i] = begin(&r[i], seed, r[i].writes ? NB : 0);
	for (i = 0; i < tp; i++) {
		if (r[i].writes)
			assert_int_equal(kvc_publish(q[i]), NB);
		kvc_req_free(q[i]);
	}
	for (i = 0; i < tp; i++)
		rank_close(&r[i]);
}

/* Every rank of an engine of `tp` ranks finds the whole prompt and reads
 * its heads right. */
static void read_at(const struct kvt_daemon *d, uint32_t heads, bool mla, uint32_t tp,
		    uint32_t seed)
{
	struct rank r;
	uint32_t i;

	for (i = 0; i < tp; i++) {
		rank_open(&r, d, heads, mla, tp, i, model_name(mla, heads));
		assert_int_equal(read_back(&r, seed), NB);
		rank_close(&r);
	}
}

static int setup(void **state)
{
	char err[256];
	int rc = kvt_setup_args(state, daemon_args);

	if (!rc && kvobs_attach(((struct kvt_daemon *)*state)->sock, &obs, err, sizeof(err)))
		rc = -1;
	return rc;
}

static int teardown(void **state)
{
	kvobs_detach(&obs);
	return kvt_teardown(state);
}

/* Pages the pool holds for the blocks of namespace rows, as the daemon
 * counts them: READY pages (every test drops what it made). */
static uint64_t ready(void)
{
	return STAT(pages_ready);
}

static void drop_all(const struct kvt_daemon *d, uint32_t heads, bool mla)
{
	struct rank r;

	rank_open(&r, d, heads, mla, 1, 0, model_name(mla, heads));
	while (kvc_drop_namespace(r.c) == -EAGAIN)
		sleep_ms(5);
	rank_close(&r);
	UNTIL(ready() == 0);
}

static void test_tp2_writes_one_page_per_block(void **state)
{
	const struct kvt_daemon *d = *state;
	struct rank r0, r1, one;
	struct kvc_req *q0, *q1, *w;
	uint64_t joins = STAT(slice_joins);
	size_t i;

	rank_open(&r0, d, HEADS, false, 2, 0, "kvt-tp");
	rank_open(&r1, d, HEADS, false, 2, 1, "kvt-tp");
	rank_open(&one, d, HEADS, false, 1, 0, "kvt-tp");
	assert_true(r0.writes && r1.writes && r0.h0 == 0 && r1.h0 == 2 && r1.hn == 2);
	q0 = begin(&r0, 1, NB);
	/* Rank 1 does not wait for the pages rank 0 began: they are its to
	 * join. A client of another layout sees them in flight. */
	q1 = req_of(&r1, 1);
	assert_int_equal(kvc_lookup(q1), 0);
	assert_int_equal(kvc_req_inflight(q1), 0);
	w = req_of(&one, 1);
	assert_int_equal(kvc_lookup(w), 0);
	assert_int_equal(kvc_req_inflight(w), NB);
	kvc_req_free(w);
	assert_int_equal(kvc_alloc(q1), NB);
	for (i = 0; i < NB; i++)
		assert_int_equal(kvc_block_page(q1, i), kvc_block_page(q0, i));
	assert_int_equal(STAT(slice_joins) - joins, NB);
	each(&r1, q1, NB, true);
	assert_int_equal(kvc_scatter(q1, 0, NB, &r1.l, ids, NULL), 0);
	/* One slice in: still in flight, no hit for anyone. */
	assert_int_equal(kvc_publish(q0), NB);
	assert_int_equal(read_back(&one, 1), 0);
	assert_int_equal(STAT(pages_ready), 0);
	assert_int_equal(kvc_publish(q1), NB);
	kvc_req_free(q0);
	kvc_req_free(q1);
	/* Whole: one page per block, a hit at TP 1, 2 and 4. */
	assert_int_equal(ready(), NB);
	assert_int_equal(read_back(&one, 1), NB);
	assert_int_equal(read_back(&r0, 1), NB);
	assert_int_equal(read_back(&r1, 1), NB);
	read_at(d, HEADS, false, 4, 1);
	assert_int_equal(ready(), NB);
	rank_close(&r0);
	rank_close(&r1);
	rank_close(&one);
	drop_all(d, HEADS, false);
}

static void test_any_size_reads_any_size(void **state)
{
	const struct kvt_daemon *d = *state;
	static const uint32_t sizes[] = { 1, 2, 4 };
	size_t w, r;

	for (w = 0; w < 3; w++) {
		write_at(d, HEADS, false, sizes[w], 10 + (uint32_t)w);
		assert_int_equal(ready(), NB);	/* one copy, whoever wrote it */
		for (r = 0; r < 3; r++)
			read_at(d, HEADS, false, sizes[r], 10 + (uint32_t)w);
		drop_all(d, HEADS, false);
	}
}

static void test_replicated_heads_stored_once(void **state)
{
	const struct kvt_daemon *d = *state;
	struct rank r1;
	struct kvc_req *q;

	/* 2 KV heads at TP 4: ranks 0, 1 hold head 0, ranks 2, 3 head 1. */
	rank_open(&r1, d, 2, false, 4, 1, "kvt-tp2h");
	assert_false(r1.writes);
	assert_true(r1.h0 == 0 && r1.hn == 1);
	q = req_of(&r1, 20);
	assert_int_equal(kvc_lookup(q), 0);
	assert_int_equal(kvc_alloc(q), 0);
	assert_int_equal(kvc_req_short_reason(q), -EPERM);
	kvc_req_free(q);
	rank_close(&r1);
	write_at(d, 2, false, 4, 20);
	assert_int_equal(ready(), NB);
	read_at(d, 2, false, 4, 20);
	read_at(d, 2, false, 2, 20);
	read_at(d, 2, false, 1, 20);
	drop_all(d, 2, false);
}

static void test_mla_one_copy_for_every_rank(void **state)
{
	const struct kvt_daemon *d = *state;
	struct rank r2;
	struct kvc_req *q;

	rank_open(&r2, d, 1, true, 4, 2, "kvt-tp-mla");
	assert_false(r2.writes);
	q = req_of(&r2, 30);
	assert_int_equal(kvc_lookup(q), 0);
	assert_int_equal(kvc_alloc(q), 0);
	assert_int_equal(kvc_req_short_reason(q), -EPERM);
	kvc_req_free(q);
	write_at(d, 1, true, 4, 30);
	/* Four ranks, one copy: a quarter of a copy per rank. */
	assert_int_equal(ready(), NB);
	read_at(d, 1, true, 4, 30);
	read_at(d, 1, true, 1, 30);
	assert_int_equal(ready(), NB);
	/* A K/V layout is refused for a latent page. */
	q = req_of(&r2, 30);
	assert_int_equal(kvc_lookup(q), NB);
	r2.l.kind = KVC_LAYOUT_KV;
	assert_int_equal(kvc_gather(q, 0, 1, &r2.l, ids, NULL), -EINVAL);
	kvc_req_free(q);
	rank_close(&r2);
	drop_all(d, 1, true);
}

/* Rank 0 began the pages, rank 1 joined them; then `end` ends rank 1's
 * slices unwritten. Rank 0's publish is a miss for every block, the pages
 * go back, nothing is cached. */
static void slice_lost(const struct kvt_daemon *d, uint32_t seed, void (*end)(struct rank *,
									       struct kvc_req *))
{
	struct rank r0, r1;
	struct kvc_req *q0, *q1;
	uint64_t dropped = STAT(slice_dropped), free0;

	rank_open(&r0, d, HEADS, false, 2, 0, "kvt-tp");
	rank_open(&r1, d, HEADS, false, 2, 1, "kvt-tp");
	free0 = STAT(pages_free);
	q0 = begin(&r0, seed, NB);
	q1 = begin(&r1, seed, NB);
	end(&r1, q1);
	/* The pages are given up at once: nothing in flight any more (a
	 * waiter would wake to a miss), freed once rank 0's slices end. */
	UNTIL(STAT(pages_in_flight) == 0);
	assert_int_equal(read_back(&r0, seed), 0);
	assert_int_equal(STAT(slice_dropped), dropped);	/* rank 0's slices are open */
	assert_int_equal(kvc_publish(q0), 0);		/* -ESTALE for each: a miss */
	kvc_req_free(q0);
	UNTIL(STAT(slice_dropped) - dropped == NB);
	UNTIL(STAT(pages_free) == free0 && STAT(pages_writing) == 0);
	assert_int_equal(ready(), 0);
	assert_int_equal(kvc_connected(r0.c), 0);	/* a miss, never an error */
	rank_close(&r0);
	rank_close(&r1);
}

static void end_free(struct rank *r, struct kvc_req *q)
{
	(void)r;
	kvc_req_free(q);	/* unpublished: FREE */
}

static void test_slice_released_gives_page_up(void **state)
{
	slice_lost(*state, 40, end_free);
}

/* Rank 1 is a process of its own, SIGKILLed after joining. */
static void test_rank_killed_gives_page_up(void **state)
{
	const struct kvt_daemon *d = *state;
	struct rank r0;
	struct kvc_req *q0;
	uint64_t dropped = STAT(slice_dropped), free0;
	int go[2], done[2], st;
	pid_t pid;
	char b;

	rank_open(&r0, d, HEADS, false, 2, 0, "kvt-tp");
	free0 = STAT(pages_free);
	q0 = begin(&r0, 50, NB);
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(done), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		struct rank r1;

		rank_open(&r1, d, HEADS, false, 2, 1, "kvt-tp");
		begin(&r1, 50, NB);
		if (write(done[1], "j", 1) != 1)
			_exit(2);
		if (read(go[0], &b, 1) != 1)
			_exit(3);
		_exit(4);	/* SIGKILLed before */
	}
	assert_int_equal(read(done[0], &b, 1), 1);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	UNTIL(STAT(pages_in_flight) == 0);	/* given up when its exit is seen */
	assert_int_equal(kvc_publish(q0), 0);
	kvc_req_free(q0);
	UNTIL(STAT(slice_dropped) - dropped == NB);
	UNTIL(STAT(pages_free) == free0 && STAT(pages_writing) == 0);
	assert_int_equal(ready(), 0);
	close(go[0]);
	close(go[1]);
	close(done[0]);
	close(done[1]);
	rank_close(&r0);
}

static void test_missing_slice_times_out(void **state)
{
	const struct kvt_daemon *d = *state;
	struct rank r0;
	struct kvc_req *q0;
	uint64_t dropped = STAT(slice_dropped), free0;

	rank_open(&r0, d, HEADS, false, 2, 0, "kvt-tp");
	free0 = STAT(pages_free);
	q0 = begin(&r0, 60, NB);
	/* Its slice in, rank 1 never comes: given up after 300 ms. */
	assert_int_equal(kvc_publish(q0), NB);
	UNTIL(STAT(slice_dropped) - dropped == NB);
	UNTIL(STAT(pages_free) == free0);
	assert_int_equal(ready(), 0);
	kvc_req_free(q0);
	assert_int_equal(read_back(&r0, 60), 0);
	rank_close(&r0);
}

static void test_other_sizes_do_not_join(void **state)
{
	const struct kvt_daemon *d = *state;
	struct rank r0, r1, f0, one;
	struct kvc_req *q0, *q1, *q4, *w;
	uint64_t dups = STAT(publish_dups);

	rank_open(&r0, d, HEADS, false, 2, 0, "kvt-tp");
	rank_open(&r1, d, HEADS, false, 2, 1, "kvt-tp");
	rank_open(&f0, d, HEADS, false, 4, 0, "kvt-tp");
	rank_open(&one, d, HEADS, false, 1, 0, "kvt-tp");
	q0 = begin(&r0, 70, NB);
	q1 = begin(&r1, 70, NB);
	/* A TP 4 rank sees the TP 2 engine's pages in flight (it may wait
	 * for them) and cannot write into them. */
	q4 = req_of(&f0, 70);
	assert_int_equal(kvc_lookup(q4), 0);
	assert_int_equal(kvc_req_inflight(q4), NB);
	assert_int_equal(kvc_alloc(q4), 0);
	assert_int_equal(kvc_req_short_reason(q4), -EBUSY);
	kvc_req_free(q4);
	/* A TP 1 engine writes the block whole and takes it over. */
	w = begin(&one, 70, NB);
	assert_int_equal(kvc_publish(w), NB);
	kvc_req_free(w);
	assert_int_equal(ready(), NB);
	read_at(d, HEADS, false, 4, 70);
	/* The TP 2 engine's pages, once whole, are duplicates: freed, and
	 * its ranks pin the winner's. */
	assert_int_equal(kvc_publish(q0), NB);
	assert_int_equal(kvc_publish(q1), NB);
	assert_int_equal(STAT(publish_dups) - dups, NB);
	assert_int_equal(ready(), NB);
	assert_int_equal(kvc_block_page(q1, 0), kvc_block_page(q0, 0) == kvc_block_page(q1, 0) ?
			 kvc_block_page(q0, 0) : kvc_block_page(q1, 0));
	kvc_req_free(q0);
	kvc_req_free(q1);
	UNTIL(STAT(pages_writing) == 0);
	assert_int_equal(read_back(&r1, 70), NB);
	rank_close(&r0);
	rank_close(&r1);
	rank_close(&f0);
	rank_close(&one);
	drop_all(d, HEADS, false);
}

/* A raw client of tensor-parallel rank 1 of 2 names rank 0's page. */
static void test_lying_rank_refused(void **state)
{
	const struct kvt_daemon *d = *state;
	struct kvproto_hello hi = { 0 };
	struct kvproto_hdr h;
	struct rank r0;
	struct kvc_req *q0;
	uint8_t buf[4096], msg[sizeof(struct kvproto_count) + sizeof(struct kvproto_pub) + 4 * BT];
	struct kvproto_count cnt = { 1, 0 };
	struct kvproto_pub pub;
	struct kvc_key keys[NB];
	uint32_t t[NB * BT];
	int fd, n, got = 0;

	rank_open(&r0, d, HEADS, false, 2, 0, "kvt-tp");
	q0 = begin(&r0, 80, NB);
	fd = kvt_raw_connect(d->sock);
	assert_true(fd >= 0);
	hi.version = KVPROTO_VERSION;
	hi.dtype_bytes = 2;
	hi.layers = LAYERS;
	hi.kv_heads = HEADS;
	hi.head_dim = HD;
	hi.block_tokens = BT;
	hi.pos_kind = KVC_POS_ROPE;
	hi.shard.tp_rank = 1;
	hi.shard.tp_size = 2;
	strcpy(hi.model, "kvt-tp");
	assert_int_equal(kvt_send_frame(fd, KVPROTO_HELLO, &hi, sizeof(hi)), 0);
	/* The HELLO reply (its descriptors are dropped with the socket). */
	n = (int)read(fd, buf, sizeof(buf));
	assert_true(n >= (int)sizeof(h));
	memcpy(&h, buf, sizeof(h));
	assert_int_equal(h.type, KVPROTO_HELLO_R);
	prompt_tokens(t, 80);
	assert_int_equal(kvc_req_keys(q0, keys, NB), NB);
	memset(&pub, 0, sizeof(pub));
	pub.page = (uint32_t)kvc_block_page(q0, 0);
	pub.gen = 0;
	memcpy(&pub.key, &keys[0], sizeof(pub.key));
	memcpy(msg, &cnt, sizeof(cnt));
	memcpy(msg + sizeof(cnt), &pub, sizeof(pub));
	memcpy(msg + sizeof(cnt) + sizeof(pub), t, 4 * BT);
	/* Every generation the page could be at: none is this client's. */
	for (pub.gen = 0; pub.gen < 4; pub.gen++) {
		memcpy(msg + sizeof(cnt), &pub, sizeof(pub));
		if (kvt_send_frame(fd, KVPROTO_PUBLISH, msg, sizeof(msg)))
			break;
		n = (int)read(fd, buf, sizeof(buf));
		if (n <= 0)
			break;
		memcpy(&h, buf, sizeof(h));
		if (h.type == KVPROTO_ERROR) {
			got = 1;
			break;
		}
	}
	assert_int_equal(got, 1);
	close(fd);
	assert_int_equal(kvc_publish(q0), NB);	/* rank 0 goes on */
	kvc_req_free(q0);
	rank_close(&r0);
	UNTIL(STAT(pages_writing) == 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tp2_writes_one_page_per_block),
		cmocka_unit_test(test_any_size_reads_any_size),
		cmocka_unit_test(test_replicated_heads_stored_once),
		cmocka_unit_test(test_mla_one_copy_for_every_rank),
		cmocka_unit_test(test_slice_released_gives_page_up),
		cmocka_unit_test(test_rank_killed_gives_page_up),
		cmocka_unit_test(test_missing_slice_times_out),
		cmocka_unit_test(test_other_sizes_do_not_join),
		cmocka_unit_test(test_lying_rank_refused),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
