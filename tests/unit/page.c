// SPDX-License-Identifier: MIT
/*
 * page.c - unit tests for shm/page.c: page life and exact verification.
 *
 * FREE -> WRITING -> READY -> EVICTING -> FREE with the state, generation,
 * free stack and stats counters checked at every step; allocation until the
 * pool is empty; transitions refused (and nothing written) for a wrong
 * owner, generation, page number or state; duplicate publishes resolved to
 * the first page with no leak; and the "never wrong KV" rule: one key for
 * two different blocks is refused, and verification of the indexed page
 * against the other block, parent or namespace fails.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/index.h"
#include "../../shm/key.h"
#include "../../shm/page.h"
#include "../../shm/segment.h"

#define BT 16
#define NPAGES 64

struct seg {
	struct kvshm_header *h;
	void *base;
	uint64_t bytes;
};

static void seg_new(struct seg *s, uint32_t n_pages, uint32_t n_buckets)
{
	struct kvshm_geometry geo = {
		.page_bytes = 4096,
		.n_pages = n_pages,
		.block_tokens = BT,
		.n_buckets = n_buckets ? n_buckets : kvshm_buckets_for(n_pages),
		.max_clients = 4,
		.max_ns = 4,
		.ledger_slots = 64,
	};
	struct kvshm_header h;

	assert_int_equal(kvshm_layout(&h, &geo), 0);
	s->bytes = h.segment_bytes;
	s->base = aligned_alloc(4096, s->bytes);
	assert_non_null(s->base);
	memset(s->base, 0, s->bytes);
	kvshm_init(s->base, &h);
	s->h = s->base;
}

static void seg_free(struct seg *s)
{
	free(s->base);
}

static void *snapshot(const struct seg *s)
{
	void *p = malloc(s->bytes);

	assert_non_null(p);
	memcpy(p, s->base, s->bytes);
	return p;
}

static void assert_unchanged(const struct seg *s, void *snap)
{
	assert_memory_equal(s->base, snap, s->bytes);
	free(snap);
}

#define STAT(s, f) atomic_load(&kvshm_stats((s)->h)->f)

static uint32_t state_of(const struct seg *s, uint32_t page)
{
	return atomic_load(&kvshm_pages(s->h)[page].state);
}

static uint32_t gen_of(const struct seg *s, uint32_t page)
{
	return atomic_load(&kvshm_pages(s->h)[page].gen);
}

static void block(uint32_t *t, uint32_t seed)
{
	uint32_t i;

	for (i = 0; i < BT; i++)
		t[i] = seed * 1000 + i;
}

static const struct kvshm_key root = { 0x1234, 0x5678 };
static const struct kvshm_key no_extra = { 0, 0 };

static struct kvshm_key key_of(struct kvshm_key parent, const uint32_t *t)
{
	return kvshm_key_block(root, parent, t, BT, no_extra);
}

static void assert_counts(const struct seg *s, uint64_t fr, uint64_t wr, uint64_t rd)
{
	assert_int_equal(STAT(s, pages_free), fr);
	assert_int_equal(STAT(s, pages_writing), wr);
	assert_int_equal(STAT(s, pages_ready), rd);
	/* The stack agrees with the counter. */
	assert_int_equal(kvshm_free(s->h)->count, fr);
}

static void test_init(void **state)
{
	struct seg s;
	uint32_t i;

	(void)state;
	seg_new(&s, NPAGES, 0);
	assert_counts(&s, NPAGES, 0, 0);
	for (i = 0; i < NPAGES; i++) {
		assert_int_equal(state_of(&s, i), KVSHM_PAGE_FREE);
		assert_int_equal(gen_of(&s, i), 0);
	}
	assert_int_equal(STAT(&s, index_entries), 0);
	seg_free(&s);
}

/* The whole life of one page, every field checked after every step. */
static void test_life(void **state)
{
	struct seg s;
	uint32_t page, gen, w = 0, wg = 0, g, tok[BT];
	struct kvshm_page *p;
	struct kvshm_key k;

	(void)state;
	seg_new(&s, NPAGES, 0);
	block(tok, 1);
	k = key_of(root, tok);

	/* FREE -> WRITING: gen bumps, owner and ns recorded. */
	assert_int_equal(kvshm_page_alloc(s.h, 7, 2, &page, &gen), 0);
	assert_int_equal(page, 0);	/* low page numbers first */
	p = &kvshm_pages(s.h)[page];
	assert_int_equal(state_of(&s, page), KVSHM_PAGE_WRITING);
	assert_int_equal(gen, 1);
	assert_int_equal(gen_of(&s, page), 1);
	assert_int_equal(p->owner, 7);
	assert_int_equal(p->ns_id, 2);
	assert_counts(&s, NPAGES - 1, 1, 0);
	assert_int_equal(STAT(&s, allocs), 1);
	/* Invisible while WRITING. */
	assert_false(kvshm_page_verify(s.h, page, 2, k, root, tok, &g));
	assert_int_equal(kvshm_index_find(s.h, k), UINT32_MAX);

	/* WRITING -> READY: identity stored, indexed, gen unchanged. */
	assert_int_equal(kvshm_page_publish(s.h, page, gen, 7, k, root, tok, &w, &wg),
			 KVSHM_PUBLISHED);
	assert_int_equal(w, page);
	assert_int_equal(wg, gen);
	assert_int_equal(state_of(&s, page), KVSHM_PAGE_READY);
	assert_int_equal(gen_of(&s, page), 1);
	assert_true(kvshm_key_eq(p->key, k));
	assert_true(kvshm_key_eq(p->parent, root));
	assert_memory_equal(kvshm_tokens(s.h, page), tok, sizeof(tok));
	assert_int_equal(kvshm_index_find(s.h, k), page);
	assert_counts(&s, NPAGES - 1, 0, 1);
	assert_int_equal(STAT(&s, publishes), 1);
	assert_int_equal(STAT(&s, index_entries), 1);
	g = 99;
	assert_true(kvshm_page_verify(s.h, page, 2, k, root, tok, &g));
	assert_int_equal(g, 1);

	/* READY -> EVICTING: gen unchanged, no longer verifiable. */
	assert_true(kvshm_page_evict_mark(s.h, page));
	assert_int_equal(state_of(&s, page), KVSHM_PAGE_EVICTING);
	assert_int_equal(gen_of(&s, page), 1);
	assert_false(kvshm_page_verify(s.h, page, 2, k, root, tok, &g));
	assert_false(kvshm_page_evict_mark(s.h, page));
	assert_counts(&s, NPAGES - 1, 0, 1);

	/* EVICTING -> READY (back-off): gen unchanged, counted. */
	kvshm_page_evict_back_off(s.h, page);
	assert_int_equal(state_of(&s, page), KVSHM_PAGE_READY);
	assert_int_equal(gen_of(&s, page), 1);
	assert_int_equal(STAT(&s, evict_backoffs), 1);
	assert_int_equal(kvshm_index_find(s.h, k), page);
	assert_true(kvshm_page_verify(s.h, page, 2, k, root, tok, &g));
	assert_int_equal(g, 1);
	assert_counts(&s, NPAGES - 1, 0, 1);

	/* EVICTING -> FREE: gen bumps, index entry gone. */
	assert_true(kvshm_page_evict_mark(s.h, page));
	kvshm_page_evict_finish(s.h, page);
	assert_int_equal(state_of(&s, page), KVSHM_PAGE_FREE);
	assert_int_equal(gen_of(&s, page), 2);
	assert_int_equal(kvshm_index_find(s.h, k), UINT32_MAX);
	assert_false(kvshm_page_verify(s.h, page, 2, k, root, tok, &g));
	assert_counts(&s, NPAGES, 0, 0);
	assert_int_equal(STAT(&s, evictions), 1);
	assert_int_equal(STAT(&s, index_entries), 0);
	assert_int_equal(STAT(&s, evict_backoffs), 1);

	/* The same page comes back next, one generation later. */
	assert_int_equal(kvshm_page_alloc(s.h, 8, 2, &page, &gen), 0);
	assert_int_equal(page, 0);
	assert_int_equal(gen, 3);
	assert_int_equal(kvshm_pages(s.h)[page].owner, 8);
	/* ...and the evicted key can be published again. */
	assert_int_equal(kvshm_page_publish(s.h, page, gen, 8, k, root, tok, &w, &wg),
			 KVSHM_PUBLISHED);
	assert_int_equal(kvshm_index_find(s.h, k), page);
	assert_int_equal(STAT(&s, publishes), 2);
	seg_free(&s);
}

/* WRITING -> FREE by its owner: gen bumps, page back on the stack. */
static void test_free_writing(void **state)
{
	struct seg s;
	uint32_t a, ga, b, gb, c, gc;

	(void)state;
	seg_new(&s, NPAGES, 0);
	assert_int_equal(kvshm_page_alloc(s.h, 1, 0, &a, &ga), 0);
	assert_int_equal(kvshm_page_alloc(s.h, 1, 0, &b, &gb), 0);
	assert_int_not_equal(a, b);
	assert_counts(&s, NPAGES - 2, 2, 0);
	assert_int_equal(kvshm_page_free(s.h, a, ga, 1), 0);
	assert_int_equal(state_of(&s, a), KVSHM_PAGE_FREE);
	assert_int_equal(gen_of(&s, a), ga + 1);
	assert_int_equal(kvshm_pages(s.h)[a].owner, 0);
	assert_counts(&s, NPAGES - 1, 1, 0);
	/* Freeing twice is refused: the page is no longer WRITING. */
	assert_int_equal(kvshm_page_free(s.h, a, ga, 1), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, a, ga + 1, 1), -EINVAL);
	assert_counts(&s, NPAGES - 1, 1, 0);
	/* LIFO: the freed page is handed out next, with a new gen. */
	assert_int_equal(kvshm_page_alloc(s.h, 2, 0, &c, &gc), 0);
	assert_int_equal(c, a);
	assert_int_equal(gc, ga + 2);
	/* The old (page, gen) of the first owner no longer names it. */
	assert_int_equal(kvshm_page_free(s.h, c, ga, 1), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, c, gc, 1), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, c, gc, 2), 0);
	assert_int_equal(kvshm_page_free(s.h, b, gb, 1), 0);
	assert_counts(&s, NPAGES, 0, 0);
	seg_free(&s);
}

static void test_alloc_until_full(void **state)
{
	struct seg s;
	uint32_t page[NPAGES], gen[NPAGES], x = 12345, gx = 6789, i;
	uint8_t seen[NPAGES] = { 0 };

	(void)state;
	seg_new(&s, NPAGES, 0);
	for (i = 0; i < NPAGES; i++) {
		assert_int_equal(kvshm_page_alloc(s.h, 3, 1, &page[i], &gen[i]), 0);
		assert_true(page[i] < NPAGES);
		assert_int_equal(seen[page[i]], 0);
		seen[page[i]] = 1;
		assert_int_equal(gen[i], 1);
	}
	assert_counts(&s, 0, NPAGES, 0);
	assert_int_equal(kvshm_page_alloc(s.h, 3, 1, &x, &gx), -ENOSPC);
	assert_int_equal(x, 12345);
	assert_int_equal(gx, 6789);
	assert_int_equal(STAT(&s, allocs), NPAGES);
	assert_counts(&s, 0, NPAGES, 0);
	for (i = 0; i < NPAGES; i++)
		assert_int_equal(kvshm_page_free(s.h, page[i], gen[i], 3), 0);
	assert_counts(&s, NPAGES, 0, 0);
	assert_int_equal(kvshm_page_alloc(s.h, 3, 1, &x, &gx), 0);
	seg_free(&s);
}

/* Wrong owner, gen, page or state: -EINVAL and not one byte written. */
static void test_refused_changes_nothing(void **state)
{
	struct seg s;
	uint32_t a, ga, r, gr, w = 777, wg = 888, tok[BT];
	struct kvshm_key k, k2;
	void *snap;

	(void)state;
	seg_new(&s, NPAGES, 0);
	block(tok, 2);
	k = key_of(root, tok);
	k2 = key_of(k, tok);
	assert_int_equal(kvshm_page_alloc(s.h, 5, 1, &r, &gr), 0);
	assert_int_equal(kvshm_page_publish(s.h, r, gr, 5, k, root, tok, &w, &wg), 0);
	assert_int_equal(kvshm_page_alloc(s.h, 5, 1, &a, &ga), 0);
	w = 777;
	wg = 888;

	snap = snapshot(&s);
	/* Wrong owner. */
	assert_int_equal(kvshm_page_free(s.h, a, ga, 6), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 6, k2, k, tok, &w, &wg), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, a, ga, 0), -EINVAL);
	/* Wrong gen (stale and future). */
	assert_int_equal(kvshm_page_free(s.h, a, ga - 1, 5), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, a, ga + 1, 5), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, a, ga + 1, 5, k2, k, tok, &w, &wg), -EINVAL);
	/* Out of range. */
	assert_int_equal(kvshm_page_free(s.h, NPAGES, 1, 5), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, UINT32_MAX, 1, 5), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, NPAGES, 1, 5, k2, k, tok, &w, &wg), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, UINT32_MAX, 0, 5, k2, k, tok, &w, &wg), -EINVAL);
	/* Not WRITING: a READY page, a FREE page (gen 0 and its owner 0). */
	assert_int_equal(kvshm_page_free(s.h, r, gr, 5), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, r, gr, 0), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, r, gr, 5, k2, k, tok, &w, &wg), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, r, gr, 0, k2, k, tok, &w, &wg), -EINVAL);
	assert_int_equal(kvshm_page_free(s.h, 10, 0, 0), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, 10, 0, 0, k2, k, tok, &w, &wg), -EINVAL);
	/* EVICTING is not WRITING either. */
	assert_unchanged(&s, snap);
	assert_true(kvshm_page_evict_mark(s.h, r));
	snap = snapshot(&s);
	assert_int_equal(kvshm_page_free(s.h, r, gr, 0), -EINVAL);
	assert_int_equal(kvshm_page_publish(s.h, r, gr, 0, k2, k, tok, &w, &wg), -EINVAL);
	assert_unchanged(&s, snap);
	assert_int_equal(w, 777);
	assert_int_equal(wg, 888);

	/* The right triple still works afterwards. */
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 5, k2, k, tok, &w, &wg), 0);
	assert_int_equal(kvshm_index_find(s.h, k2), a);
	seg_free(&s);
}

/* Two clients publish the same block: the first page wins, no leak. */
static void test_duplicate_publish(void **state)
{
	struct seg s;
	uint32_t a, ga, b, gb, w, wg, g, tok[BT], copy[BT];
	struct kvshm_key k;

	(void)state;
	seg_new(&s, NPAGES, 0);
	block(tok, 3);
	memcpy(copy, tok, sizeof(tok));
	k = key_of(root, tok);
	assert_int_equal(kvshm_page_alloc(s.h, 1, 4, &a, &ga), 0);
	assert_int_equal(kvshm_page_alloc(s.h, 2, 4, &b, &gb), 0);
	assert_counts(&s, NPAGES - 2, 2, 0);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 1, k, root, tok, &w, &wg),
			 KVSHM_PUBLISHED);
	assert_int_equal(w, a);
	/* The loser's tokens are an equal copy, not the same buffer. */
	w = wg = 12345;
	assert_int_equal(kvshm_page_publish(s.h, b, gb, 2, k, root, copy, &w, &wg),
			 KVSHM_PUBLISH_DUP);
	assert_int_equal(w, a);
	assert_int_equal(wg, ga);
	assert_int_equal(state_of(&s, a), KVSHM_PAGE_READY);
	assert_int_equal(state_of(&s, b), KVSHM_PAGE_FREE);
	assert_int_equal(gen_of(&s, b), gb + 1);
	assert_int_equal(kvshm_index_find(s.h, k), a);
	assert_counts(&s, NPAGES - 1, 0, 1);
	assert_int_equal(STAT(&s, publish_dups), 1);
	assert_int_equal(STAT(&s, publishes), 1);
	assert_int_equal(STAT(&s, publish_refused), 0);
	assert_int_equal(STAT(&s, index_entries), 1);
	assert_true(kvshm_page_verify(s.h, a, 4, k, root, tok, &g));
	assert_int_equal(g, ga);
	/* The loser's page is on the free stack (the next alloc gets it). */
	assert_int_equal(kvshm_page_alloc(s.h, 2, 4, &b, &gb), 0);
	assert_int_equal(b, 1);
	seg_free(&s);
}

/*
 * One key for two different blocks (a collision, by chance or crafted):
 * the second publish is refused and its page freed; the index keeps the
 * first page, and nothing verifies that page against the other block.
 */
static void test_collision_refused(void **state)
{
	struct seg s;
	uint32_t a, ga, b, gb, w = 0, wg = 0, g, t1[BT], t2[BT];
	struct kvshm_key k, other_parent = { 0xabc, 0xdef };

	(void)state;
	seg_new(&s, NPAGES, 0);
	block(t1, 10);
	block(t2, 10);
	t2[BT - 1] ^= 1;	/* differs in the last token only */
	k = key_of(root, t1);

	assert_int_equal(kvshm_page_alloc(s.h, 1, 4, &a, &ga), 0);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 1, k, root, t1, &w, &wg), 0);

	/* Same key, other tokens. */
	assert_int_equal(kvshm_page_alloc(s.h, 2, 4, &b, &gb), 0);
	w = wg = 4242;
	assert_int_equal(kvshm_page_publish(s.h, b, gb, 2, k, root, t2, &w, &wg), -EEXIST);
	assert_int_equal(w, 4242);
	assert_int_equal(state_of(&s, b), KVSHM_PAGE_FREE);
	assert_int_equal(gen_of(&s, b), gb + 1);
	assert_int_equal(kvshm_index_find(s.h, k), a);
	assert_memory_equal(kvshm_tokens(s.h, a), t1, sizeof(t1));
	assert_counts(&s, NPAGES - 1, 0, 1);
	assert_int_equal(STAT(&s, publish_refused), 1);
	assert_int_equal(STAT(&s, publish_dups), 0);

	/* Same key and tokens, other parent. */
	assert_int_equal(kvshm_page_alloc(s.h, 2, 4, &b, &gb), 0);
	assert_int_equal(kvshm_page_publish(s.h, b, gb, 2, k, other_parent, t1, &w, &wg),
			 -EEXIST);
	assert_int_equal(state_of(&s, b), KVSHM_PAGE_FREE);
	/* Same key, parent and tokens, other namespace: KV never crosses. */
	assert_int_equal(kvshm_page_alloc(s.h, 2, 5, &b, &gb), 0);
	assert_int_equal(kvshm_page_publish(s.h, b, gb, 2, k, root, t1, &w, &wg), -EEXIST);
	assert_int_equal(state_of(&s, b), KVSHM_PAGE_FREE);
	assert_counts(&s, NPAGES - 1, 0, 1);
	assert_int_equal(STAT(&s, publish_refused), 3);
	assert_int_equal(STAT(&s, index_entries), 1);

	/* A lookup of any of the other blocks under this key misses. */
	assert_false(kvshm_page_verify(s.h, a, 4, k, root, t2, &g));
	assert_false(kvshm_page_verify(s.h, a, 4, k, other_parent, t1, &g));
	assert_false(kvshm_page_verify(s.h, a, 5, k, root, t1, &g));
	assert_true(kvshm_page_verify(s.h, a, 4, k, root, t1, &g));
	assert_int_equal(g, ga);
	seg_free(&s);
}

/* The same, with keys made to collide by the key test hook. */
static void test_collision_by_mask(void **state)
{
	struct seg s;
	uint32_t tok[5][BT], a, ga, b, gb, w, wg, g;
	struct kvshm_key k[5];
	int i, j, x = -1, y = -1;

	(void)state;
	seg_new(&s, NPAGES, 0);
	kvshm_key_test_mask = 1ull << 63;	/* 4 possible keys: 5 blocks collide */
	for (i = 0; i < 5; i++) {
		block(tok[i], 20 + i);
		k[i] = key_of(root, tok[i]);
	}
	kvshm_key_test_mask = 0;
	for (i = 0; i < 5 && x < 0; i++)
		for (j = i + 1; j < 5 && x < 0; j++)
			if (kvshm_key_eq(k[i], k[j]))
				x = i, y = j;
	assert_true(x >= 0);

	assert_int_equal(kvshm_page_alloc(s.h, 1, 4, &a, &ga), 0);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 1, k[x], root, tok[x], &w, &wg), 0);
	assert_int_equal(kvshm_page_alloc(s.h, 2, 4, &b, &gb), 0);
	assert_int_equal(kvshm_page_publish(s.h, b, gb, 2, k[y], root, tok[y], &w, &wg),
			 -EEXIST);
	assert_int_equal(state_of(&s, b), KVSHM_PAGE_FREE);
	assert_int_equal(kvshm_index_find(s.h, k[y]), a);
	/* The client of block y finds page a as a candidate and rejects it. */
	assert_false(kvshm_page_verify(s.h, a, 4, k[y], root, tok[y], &g));
	assert_true(kvshm_page_verify(s.h, a, 4, k[x], root, tok[x], &g));
	assert_counts(&s, NPAGES - 1, 0, 1);
	seg_free(&s);
}

/* A full probe window: publish says -ENOSPC and gives the page back. */
static void test_publish_index_full(void **state)
{
	enum { CAP = KVSHM_BUCKET_ENTRIES * KVSHM_PROBE_MAX };
	struct seg s;
	uint32_t i, p, g, w, wg, tok[BT];
	struct kvshm_key k;

	(void)state;
	seg_new(&s, NPAGES, 8);	/* 8 buckets: 24 entries in all */
	for (i = 0; i <= CAP; i++) {
		block(tok, 100 + i);
		k.lo = 1000 + i;
		k.hi = 0x0000000100000000ull | i;	/* all in home bucket 1 */
		assert_int_equal(kvshm_page_alloc(s.h, 1, 0, &p, &g), 0);
		if (i < CAP) {
			assert_int_equal(kvshm_page_publish(s.h, p, g, 1, k, root, tok, &w, &wg), 0);
			continue;
		}
		assert_int_equal(kvshm_page_publish(s.h, p, g, 1, k, root, tok, &w, &wg), -ENOSPC);
		assert_int_equal(state_of(&s, p), KVSHM_PAGE_FREE);
		assert_int_equal(gen_of(&s, p), g + 1);
		assert_int_equal(kvshm_index_find(s.h, k), UINT32_MAX);
		assert_false(kvshm_page_verify(s.h, p, 0, k, root, tok, &wg));
	}
	assert_counts(&s, NPAGES - CAP, 0, CAP);
	assert_int_equal(STAT(&s, index_entries), CAP);
	assert_int_equal(STAT(&s, publishes), CAP);
	assert_int_equal(STAT(&s, publish_refused), 1);
	seg_free(&s);
}

/* Evictor calls on pages in the wrong state change nothing. */
static void test_evict_wrong_state(void **state)
{
	struct seg s;
	uint32_t a, ga, r, gr, w, wg, tok[BT];
	struct kvshm_key k;
	void *snap;

	(void)state;
	seg_new(&s, NPAGES, 0);
	block(tok, 30);
	k = key_of(root, tok);
	assert_int_equal(kvshm_page_alloc(s.h, 1, 0, &r, &gr), 0);
	assert_int_equal(kvshm_page_publish(s.h, r, gr, 1, k, root, tok, &w, &wg), 0);
	assert_int_equal(kvshm_page_alloc(s.h, 1, 0, &a, &ga), 0);

	snap = snapshot(&s);
	assert_false(kvshm_page_evict_mark(s.h, a));		/* WRITING */
	assert_false(kvshm_page_evict_mark(s.h, 20));		/* FREE */
	kvshm_page_evict_finish(s.h, r);			/* READY */
	kvshm_page_evict_finish(s.h, a);
	kvshm_page_evict_finish(s.h, 20);
	kvshm_page_evict_back_off(s.h, r);
	kvshm_page_evict_back_off(s.h, a);
	kvshm_page_evict_back_off(s.h, 20);
	assert_unchanged(&s, snap);
	assert_int_equal(kvshm_index_find(s.h, k), r);
	assert_int_equal(STAT(&s, evictions), 0);
	assert_int_equal(STAT(&s, evict_backoffs), 0);
	seg_free(&s);
}

/* Evicting one page of a chain removes only its own index entry. */
static void test_evict_finish_removes_entry(void **state)
{
	struct seg s;
	uint32_t pg[4], gn[4], tok[4][BT], w, wg, g, i;
	struct kvshm_key k[4], parent = root;

	(void)state;
	seg_new(&s, NPAGES, 0);
	for (i = 0; i < 4; i++) {
		block(tok[i], 40 + i);
		k[i] = key_of(parent, tok[i]);
		assert_int_equal(kvshm_page_alloc(s.h, 1, 0, &pg[i], &gn[i]), 0);
		assert_int_equal(kvshm_page_publish(s.h, pg[i], gn[i], 1, k[i], parent, tok[i],
						    &w, &wg), 0);
		parent = k[i];
	}
	assert_int_equal(STAT(&s, index_entries), 4);
	assert_true(kvshm_page_evict_mark(s.h, pg[2]));
	kvshm_page_evict_finish(s.h, pg[2]);
	assert_int_equal(STAT(&s, index_entries), 3);
	assert_int_equal(kvshm_index_find(s.h, k[2]), UINT32_MAX);
	for (i = 0; i < 4; i++) {
		if (i == 2)
			continue;
		assert_int_equal(kvshm_index_find(s.h, k[i]), pg[i]);
		assert_true(kvshm_page_verify(s.h, pg[i], 0, k[i], i ? k[i - 1] : root,
					      tok[i], &g));
	}
	assert_counts(&s, NPAGES - 3, 0, 3);
	seg_free(&s);
}

/* verify: every mismatch is a miss; out-of-range pages are a miss. */
static void test_verify(void **state)
{
	struct seg s;
	uint32_t a, ga, w, wg, g = 555, tok[BT], bad[BT];
	struct kvshm_key k, k2;

	(void)state;
	seg_new(&s, NPAGES, 0);
	block(tok, 50);
	k = key_of(root, tok);
	k2 = k;
	k2.hi ^= 1;
	assert_int_equal(kvshm_page_alloc(s.h, 1, 3, &a, &ga), 0);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 1, k, root, tok, &w, &wg), 0);
	assert_true(kvshm_page_verify(s.h, a, 3, k, root, tok, &g));
	assert_int_equal(g, ga);
	g = 555;
	assert_false(kvshm_page_verify(s.h, a, 3, k2, root, tok, &g));
	k2 = k;
	k2.lo ^= 1ull << 63;
	assert_false(kvshm_page_verify(s.h, a, 3, k2, root, tok, &g));
	memcpy(bad, tok, sizeof(tok));
	bad[0]++;
	assert_false(kvshm_page_verify(s.h, a, 3, k, root, bad, &g));
	assert_false(kvshm_page_verify(s.h, a, 2, k, root, tok, &g));
	assert_false(kvshm_page_verify(s.h, a + 1, 3, k, root, tok, &g));
	assert_false(kvshm_page_verify(s.h, NPAGES, 3, k, root, tok, &g));
	assert_false(kvshm_page_verify(s.h, UINT32_MAX, 3, k, root, tok, &g));
	assert_int_equal(g, 555);	/* untouched on a miss */
	seg_free(&s);
}

/* An announced page: in the index, in flight for readers other than its
 * owner, in the right namespace, key and parent only. */
static void assert_inflight(struct seg *s, uint32_t page, uint32_t ns, struct kvshm_key k,
			    struct kvshm_key parent, uint32_t owner)
{
	struct kvshm_key k2 = k;
	uint32_t o = 0;

	assert_int_equal(kvshm_index_find(s->h, k), page);
	assert_true(kvshm_page_inflight(s->h, page, ns, k, parent, 0, 0, 0, &o));
	assert_int_equal(o, owner);
	assert_false(kvshm_page_inflight(s->h, page, ns, k, parent, owner, 0, 0, &o));
	assert_false(kvshm_page_inflight(s->h, page, ns + 1, k, parent, 0, 0, 0, &o));
	assert_false(kvshm_page_inflight(s->h, page, ns, k, k, 0, 0, 0, &o));
	k2.lo ^= 1;
	assert_false(kvshm_page_inflight(s->h, page, ns, k2, parent, 0, 0, 0, &o));
	assert_false(kvshm_page_inflight(s->h, UINT32_MAX, ns, k, parent, 0, 0, 0, &o));
}

/* A fresh segment, a block from seed and its key, and a page WRITING for
 * each of two writers (owners 1 and 2, namespace 2). */
static struct kvshm_key two_writers(struct seg *s, uint32_t seed, uint32_t *tok, uint32_t *a,
				    uint32_t *ga, uint32_t *b, uint32_t *gb)
{
	seg_new(s, NPAGES, 0);
	block(tok, seed);
	assert_int_equal(kvshm_page_alloc(s->h, 1, 2, a, ga), 0);
	assert_int_equal(kvshm_page_alloc(s->h, 2, 2, b, gb), 0);
	return key_of(root, tok);
}

/* Announce, then publish: the entry stays, the page turns READY, the
 * flight ends; a second announcement of the same key is not made. */
static void test_announce_publish(void **state)
{
	struct seg s;
	uint32_t a, ga, b, gb, w, wg, g, o, tok[BT];
	struct kvshm_key k = two_writers(&s, 60, tok, &a, &ga, &b, &gb);

	(void)state;
	assert_int_equal(kvshm_page_announce(s.h, a, ga + 1, 1, k, root), -EINVAL);
	assert_int_equal(kvshm_page_announce(s.h, a, ga, 2, k, root), -EINVAL);
	assert_int_equal(kvshm_page_announce(s.h, a, ga, 1, k, root), 0);
	assert_inflight(&s, a, 2, k, root, 1);
	assert_false(kvshm_page_verify(s.h, a, 2, k, root, tok, &g));	/* not a hit */
	assert_int_equal(STAT(&s, pages_in_flight), 1);
	assert_int_equal(STAT(&s, flights), 1);
	assert_int_equal(STAT(&s, index_entries), 0);	/* counts cached blocks */
	/* Taken: the other writer's page is not announced. */
	assert_int_equal(kvshm_page_announce(s.h, b, gb, 2, k, root), 1);
	assert_int_equal(kvshm_page_announce(s.h, a, ga, 1, k, root), 1);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 1, k, root, tok, &w, &wg),
			 KVSHM_PUBLISHED);
	assert_int_equal(w, a);
	assert_false(kvshm_page_inflight(s.h, a, 2, k, root, 0, 0, 0, &o));
	assert_true(kvshm_page_verify(s.h, a, 2, k, root, tok, &g));
	assert_int_equal(kvshm_index_find(s.h, k), a);
	assert_int_equal(STAT(&s, pages_in_flight), 0);
	assert_int_equal(STAT(&s, index_entries), 1);
	/* The other writer publishes the same block: a duplicate. */
	assert_int_equal(kvshm_page_publish(s.h, b, gb, 2, k, root, tok, &w, &wg),
			 KVSHM_PUBLISH_DUP);
	assert_int_equal(w, a);
	assert_counts(&s, NPAGES - 1, 0, 1);
	seg_free(&s);
}

/* Another writer publishes an announced block first: the entry moves to
 * its page in place, and the announced page is no longer in flight (it
 * publishes as a duplicate later). */
static void test_announce_taken_over(void **state)
{
	struct seg s;
	uint32_t a, ga, b, gb, w, wg, g, o, tok[BT];
	struct kvshm_key k = two_writers(&s, 61, tok, &a, &ga, &b, &gb);

	(void)state;
	assert_int_equal(kvshm_page_announce(s.h, a, ga, 1, k, root), 0);
	assert_int_equal(kvshm_page_publish(s.h, b, gb, 2, k, root, tok, &w, &wg),
			 KVSHM_PUBLISHED);
	assert_int_equal(w, b);
	assert_int_equal(kvshm_index_find(s.h, k), b);
	assert_true(kvshm_page_verify(s.h, b, 2, k, root, tok, &g));
	assert_false(kvshm_page_inflight(s.h, a, 2, k, root, 0, 0, 0, &o));
	assert_int_equal(state_of(&s, a), KVSHM_PAGE_WRITING);
	assert_int_equal(STAT(&s, pages_in_flight), 0);
	assert_int_equal(STAT(&s, index_entries), 1);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 1, k, root, tok, &w, &wg),
			 KVSHM_PUBLISH_DUP);
	assert_int_equal(w, b);
	assert_counts(&s, NPAGES - 1, 0, 1);
	seg_free(&s);
}

/* An announced page freed unpublished, or published as another block:
 * its entry leaves the index (a miss for whoever waits). */
static void test_announce_released(void **state)
{
	struct seg s;
	uint32_t a, ga, w, wg, g, o, tok[BT], tok2[BT];
	struct kvshm_key k, k2;

	(void)state;
	seg_new(&s, NPAGES, 0);
	block(tok, 62);
	block(tok2, 63);
	k = key_of(root, tok);
	k2 = key_of(root, tok2);
	assert_int_equal(kvshm_page_alloc(s.h, 1, 2, &a, &ga), 0);
	assert_int_equal(kvshm_page_announce(s.h, a, ga, 1, k, root), 0);
	assert_int_equal(kvshm_page_free(s.h, a, ga, 1), 0);
	assert_int_equal(kvshm_index_find(s.h, k), UINT32_MAX);
	assert_false(kvshm_page_inflight(s.h, a, 2, k, root, 0, 0, 0, &o));
	assert_int_equal(STAT(&s, pages_in_flight), 0);
	assert_counts(&s, NPAGES, 0, 0);
	/* Announced as k, published as k2: k is given up, k2 cached. */
	assert_int_equal(kvshm_page_alloc(s.h, 1, 2, &a, &ga), 0);
	assert_int_equal(kvshm_page_announce(s.h, a, ga, 1, k, root), 0);
	assert_int_equal(kvshm_page_publish(s.h, a, ga, 1, k2, root, tok2, &w, &wg),
			 KVSHM_PUBLISHED);
	assert_int_equal(kvshm_index_find(s.h, k), UINT32_MAX);
	assert_int_equal(kvshm_index_find(s.h, k2), a);
	assert_true(kvshm_page_verify(s.h, a, 2, k2, root, tok2, &g));
	assert_int_equal(STAT(&s, pages_in_flight), 0);
	assert_int_equal(STAT(&s, index_entries), 1);
	/* A key that is cached already is not announced again. */
	assert_int_equal(kvshm_page_alloc(s.h, 1, 2, &a, &ga), 0);
	assert_int_equal(kvshm_page_announce(s.h, a, ga, 1, k2, root), 1);
	assert_false(kvshm_page_inflight(s.h, a, 2, k2, root, 0, 0, 0, &o));
	seg_free(&s);
}

static int reset_mask(void **state)
{
	(void)state;
	kvshm_key_test_mask = 0;
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_life),
		cmocka_unit_test(test_free_writing),
		cmocka_unit_test(test_alloc_until_full),
		cmocka_unit_test(test_refused_changes_nothing),
		cmocka_unit_test(test_duplicate_publish),
		cmocka_unit_test(test_collision_refused),
		cmocka_unit_test_teardown(test_collision_by_mask, reset_mask),
		cmocka_unit_test(test_publish_index_full),
		cmocka_unit_test(test_evict_wrong_state),
		cmocka_unit_test(test_evict_finish_removes_entry),
		cmocka_unit_test(test_verify),
		cmocka_unit_test(test_announce_publish),
		cmocka_unit_test(test_announce_taken_over),
		cmocka_unit_test(test_announce_released),
	};

	return cmocka_run_group_tests_name("page", tests, NULL, reset_mask);
}
