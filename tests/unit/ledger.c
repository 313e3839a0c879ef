// SPDX-License-Identifier: MIT
/*
 * ledger.c - unit tests for shm/ledger.c: a client's pin ledger.
 *
 * Pins succeed only on a READY page at the expected generation and leave
 * the slot empty otherwise; a hold on a WRITING page stays a valid pin once
 * the page is published; the daemon's scan reports exactly the slots that
 * name EVICTING pages (whatever gen they carry) and ignores garbage slot
 * values a client could write; the pin count; the lossy access ring; and
 * validation of a mapped ledger.
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
#include "../../shm/ledger.h"
#include "../../shm/page.h"
#include "../../shm/prefix.h"
#include "../../shm/segment.h"

#define BT 16
#define NPAGES 64
#define NSLOTS 64

struct fix {
	struct kvshm_header *h;
	void *base;
	struct kvshm_ledger *l;
	uint64_t lbytes;
};

static int setup(void **state)
{
	struct kvshm_geometry geo = {
		.page_bytes = 4096,
		.n_pages = NPAGES,
		.block_tokens = BT,
		.n_buckets = kvshm_buckets_for(NPAGES),
		.max_clients = 4,
		.max_ns = 4,
		.ledger_slots = NSLOTS,
	};
	struct kvshm_header h;
	struct fix *f = calloc(1, sizeof(*f));

	if (!f || kvshm_layout(&h, &geo))
		return -1;
	f->base = aligned_alloc(4096, h.segment_bytes);
	if (!f->base)
		return -1;
	memset(f->base, 0, h.segment_bytes);
	kvshm_init(f->base, &h);
	f->h = f->base;
	f->lbytes = kvshm_ledger_bytes(NSLOTS);
	f->l = calloc(1, f->lbytes);
	if (!f->l)
		return -1;
	kvshm_ledger_init(f->l, NSLOTS, 3, 1);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	free(f->l);
	free(f->base);
	free(f);
	return 0;
}

static uint64_t slot(const struct fix *f, uint32_t i)
{
	return atomic_load(&f->l->slot[i]);
}

/* A READY page: alloc and publish a block keyed by `seed`. */
static void ready_page(struct fix *f, uint32_t seed, uint32_t *page, uint32_t *gen)
{
	struct kvshm_key k = { 0x1000 + seed, (uint64_t)seed << 32 | seed };
	struct kvshm_key parent = { seed, 0 };
	uint32_t tok[BT], w, wg, i;

	for (i = 0; i < BT; i++)
		tok[i] = seed + i;
	assert_int_equal(kvshm_page_alloc(f->h, 3, 1, page, gen), 0);
	assert_int_equal(kvshm_page_publish(f->h, *page, *gen, 3, k, parent, tok, &w, &wg),
			 KVSHM_PUBLISHED);
}

static void test_init_and_bytes(void **state)
{
	struct fix *f = *state;
	uint32_t n;

	assert_int_equal(f->l->magic, KVSHM_LEDGER_MAGIC);
	assert_int_equal(f->l->version, KVSHM_VERSION);
	assert_int_equal(f->l->nslots, NSLOTS);
	assert_int_equal(f->l->client_id, 3);
	assert_int_equal(f->l->ns_id, 1);
	assert_int_equal(f->l->bytes, f->lbytes);
	for (n = 0; n < 20000; n = n * 3 + 1) {
		uint64_t b = kvshm_ledger_bytes(n);

		assert_int_equal(b % 4096, 0);
		assert_true(b >= sizeof(struct kvshm_ledger) + (uint64_t)n * 8);
		assert_true(b < sizeof(struct kvshm_ledger) + (uint64_t)n * 8 + 4096);
	}
	/* The largest slot count does not wrap. */
	assert_true(kvshm_ledger_bytes(UINT32_MAX) > (uint64_t)UINT32_MAX * 8);
	assert_int_equal(kvshm_ledger_validate(f->l, f->lbytes), 0);
}

static void test_slot_pack(void **state)
{
	(void)state;
	assert_int_equal(kvshm_slot_page(0), UINT32_MAX);
	assert_int_not_equal(kvshm_slot_pack(0, 0), 0);	/* page 0 gen 0 is not empty */
	assert_int_equal(kvshm_slot_page(kvshm_slot_pack(0, 0)), 0);
	assert_int_equal(kvshm_slot_page(kvshm_slot_pack(63, 7)), 63);
	assert_int_equal(kvshm_slot_pack(63, 7) & 0xffffffffu, 7);
	assert_int_equal(kvshm_slot_page(kvshm_slot_pack(UINT32_MAX - 1, 1)), UINT32_MAX - 1);
}

/* A pin on a READY page at its gen holds; unpin clears the slot. */
static void test_pin_ready(void **state)
{
	struct fix *f = *state;
	uint32_t p, g;

	ready_page(f, 1, &p, &g);
	assert_true(kvshm_ledger_pin(f->l, 5, f->h, p, g));
	assert_int_equal(slot(f, 5), kvshm_slot_pack(p, g));
	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 1);
	/* A second slot on the same page is another, independent pin. */
	assert_true(kvshm_ledger_pin(f->l, 6, f->h, p, g));
	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 2);
	kvshm_ledger_unpin(f->l, 5);
	assert_int_equal(slot(f, 5), 0);
	assert_int_equal(slot(f, 6), kvshm_slot_pack(p, g));
	kvshm_ledger_unpin(f->l, 6);
	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 0);
}

/* A pin that does not hold leaves the slot empty, whatever was in it. */
static void test_pin_fails(void **state)
{
	struct fix *f = *state;
	uint32_t r, gr, w, gw, e, ge;

	ready_page(f, 2, &r, &gr);
	ready_page(f, 3, &e, &ge);
	assert_true(kvshm_page_evict_mark(f->h, e));
	assert_int_equal(kvshm_page_alloc(f->h, 3, 1, &w, &gw), 0);

	/* Wrong gen of a READY page (older and newer). */
	atomic_store(&f->l->slot[0], 0xdeadull);
	assert_false(kvshm_ledger_pin(f->l, 0, f->h, r, gr - 1));
	assert_int_equal(slot(f, 0), 0);
	assert_false(kvshm_ledger_pin(f->l, 0, f->h, r, gr + 1));
	assert_int_equal(slot(f, 0), 0);
	/* A FREE page, at its own gen. */
	assert_int_equal(atomic_load(&kvshm_pages(f->h)[40].state), KVSHM_PAGE_FREE);
	assert_false(kvshm_ledger_pin(f->l, 1, f->h, 40,
				      atomic_load(&kvshm_pages(f->h)[40].gen)));
	assert_int_equal(slot(f, 1), 0);
	/* A WRITING page, at its own gen. */
	assert_false(kvshm_ledger_pin(f->l, 2, f->h, w, gw));
	assert_int_equal(slot(f, 2), 0);
	/* An EVICTING page, at its own (unchanged) gen. */
	assert_int_equal(atomic_load(&kvshm_pages(f->h)[e].gen), ge);
	assert_false(kvshm_ledger_pin(f->l, 3, f->h, e, ge));
	assert_int_equal(slot(f, 3), 0);
	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 0);

	/* After a back-off the same (page, gen) pins again. */
	kvshm_page_evict_back_off(f->h, e);
	assert_true(kvshm_ledger_pin(f->l, 3, f->h, e, ge));
	/* After eviction and reuse the old gen never pins. */
	kvshm_ledger_unpin(f->l, 3);
	assert_true(kvshm_page_evict_mark(f->h, e));
	kvshm_page_evict_finish(f->h, e);
	assert_false(kvshm_ledger_pin(f->l, 3, f->h, e, ge));
	assert_int_equal(slot(f, 3), 0);
}

static uint32_t held_page;

static void record_simple(uint32_t page, void *arg)
{
	assert_int_equal(page, held_page);
	(*(uint32_t *)arg)++;
}

/* hold() on a WRITING page, then publish: the same slot is a valid pin. */
static void test_hold_then_publish(void **state)
{
	struct fix *f = *state;
	struct kvshm_key k = { 0x77, 0x0000000500000077ull }, parent = { 1, 2 };
	uint32_t p, g, w, wg, tok[BT] = { 0 };
	uint32_t nseen = 0;

	assert_int_equal(kvshm_page_alloc(f->h, 3, 1, &p, &g), 0);
	kvshm_ledger_hold(f->l, 9, p, g);
	held_page = p;
	assert_int_equal(slot(f, 9), kvshm_slot_pack(p, g));
	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 1);
	assert_int_equal(kvshm_page_publish(f->h, p, g, 3, k, parent, tok, &w, &wg), 0);
	/* Publishing does not change gen: the held (page, gen) still names it. */
	assert_int_equal(slot(f, 9), kvshm_slot_pack(p, g));
	assert_int_equal(atomic_load(&kvshm_pages(f->h)[p].gen), g);
	assert_true(kvshm_ledger_pin(f->l, 10, f->h, p, g));
	kvshm_ledger_unpin(f->l, 10);

	/* The evictor sees the held slot and backs off. */
	assert_true(kvshm_page_evict_mark(f->h, p));
	kvshm_ledger_scan(f->l, NSLOTS, f->h, record_simple, &nseen);
	assert_int_equal(nseen, 1);
	kvshm_page_evict_back_off(f->h, p);
	assert_int_equal(atomic_load(&kvshm_pages(f->h)[p].state), KVSHM_PAGE_READY);
	assert_int_equal(slot(f, 9), kvshm_slot_pack(p, g));
	assert_true(kvshm_page_verify(f->h, p, 1, k, parent, tok, &wg));
	assert_int_equal(wg, g);
}

struct calls {
	uint32_t n;
	uint32_t page[NSLOTS];
};

static void record(uint32_t page, void *arg)
{
	struct calls *c = arg;

	assert_true(c->n < NSLOTS);
	c->page[c->n++] = page;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* scan calls back once per slot naming an EVICTING page, and only then. */
static void test_scan(void **state)
{
	struct fix *f = *state;
	uint32_t r, gr, e1, g1, e2, g2, w, gw;
	struct calls c = { 0 };

	ready_page(f, 10, &r, &gr);
	ready_page(f, 11, &e1, &g1);
	ready_page(f, 12, &e2, &g2);
	assert_int_equal(kvshm_page_alloc(f->h, 3, 1, &w, &gw), 0);

	assert_true(kvshm_ledger_pin(f->l, 0, f->h, r, gr));
	assert_true(kvshm_ledger_pin(f->l, 1, f->h, e1, g1));
	assert_true(kvshm_ledger_pin(f->l, 2, f->h, e2, g2));
	kvshm_ledger_hold(f->l, 3, w, gw);
	/* A stale pin (old gen) on e1 still protects it: the page alone counts. */
	atomic_store(&f->l->slot[4], kvshm_slot_pack(e1, g1 - 1));
	/* Garbage a client could write: out-of-range pages, odd encodings. */
	atomic_store(&f->l->slot[5], kvshm_slot_pack(NPAGES, 0));
	atomic_store(&f->l->slot[6], kvshm_slot_pack(UINT32_MAX - 1, 5));
	atomic_store(&f->l->slot[7], 5);		/* page field 0: "page -1" */
	atomic_store(&f->l->slot[8], UINT64_MAX);
	atomic_store(&f->l->slot[NSLOTS - 1], kvshm_slot_pack(1u << 31, 1));
	/* A FREE page. */
	atomic_store(&f->l->slot[9], kvshm_slot_pack(50, 0));

	/* Nothing EVICTING yet: no calls. */
	kvshm_ledger_scan(f->l, NSLOTS, f->h, record, &c);
	assert_int_equal(c.n, 0);

	assert_true(kvshm_page_evict_mark(f->h, e1));
	kvshm_ledger_scan(f->l, NSLOTS, f->h, record, &c);
	assert_int_equal(c.n, 2);
	assert_int_equal(c.page[0], e1);
	assert_int_equal(c.page[1], e1);

	c.n = 0;
	assert_true(kvshm_page_evict_mark(f->h, e2));
	kvshm_ledger_scan(f->l, NSLOTS, f->h, record, &c);
	assert_int_equal(c.n, 3);
	qsort(c.page, c.n, sizeof(c.page[0]), cmp_u32);
	assert_int_equal(c.page[0], e1 < e2 ? e1 : e2);
	assert_int_equal(c.page[2], e1 < e2 ? e2 : e1);

	/* Unpinned pages are not reported. */
	c.n = 0;
	kvshm_ledger_unpin(f->l, 1);
	kvshm_ledger_unpin(f->l, 4);
	kvshm_ledger_scan(f->l, NSLOTS, f->h, record, &c);
	assert_int_equal(c.n, 1);
	assert_int_equal(c.page[0], e2);

	/* Slots past the daemon's nslots are not the ledger's. */
	c.n = 0;
	kvshm_ledger_unpin(f->l, 2);
	atomic_store(&f->l->slot[5], kvshm_slot_pack(e2, g2));
	kvshm_ledger_scan(f->l, 2, f->h, record, &c);
	assert_int_equal(c.n, 0);

	/*
	 * Regression: the header is client-writable. A client that raises
	 * l->nslots must not widen the daemon's scan (it used to, reading
	 * past the mapping); the scan goes by the nslots it is given.
	 */
	c.n = 0;
	f->l->nslots = UINT32_MAX;
	kvshm_ledger_scan(f->l, 2, f->h, record, &c);
	assert_int_equal(kvshm_ledger_count(f->l, 2, f->h), 1);	/* slot 0 pins r */
	f->l->nslots = NSLOTS;
	assert_int_equal(c.n, 0);
}

/* count: slots in use that name a page in range. */
static void test_count(void **state)
{
	struct fix *f = *state;
	uint32_t r, gr;

	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 0);
	ready_page(f, 20, &r, &gr);
	assert_true(kvshm_ledger_pin(f->l, 0, f->h, r, gr));
	kvshm_ledger_hold(f->l, 1, 30, 1);
	atomic_store(&f->l->slot[2], kvshm_slot_pack(NPAGES - 1, 0));
	atomic_store(&f->l->slot[3], kvshm_slot_pack(NPAGES, 0));	/* out of range */
	atomic_store(&f->l->slot[4], UINT64_MAX);			/* out of range */
	atomic_store(&f->l->slot[5], 1);				/* page -1 */
	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 3);
	kvshm_ledger_unpin(f->l, 1);
	assert_int_equal(kvshm_ledger_count(f->l, NSLOTS, f->h), 2);
}

/* The access ring keeps the last KVSHM_RING pages, head counts them all. */
static void test_ring_wraps(void **state)
{
	struct fix *f = *state;
	const uint32_t n = KVSHM_RING * 2 + 37;
	uint32_t i;

	assert_int_equal(atomic_load(&f->l->ring_head), 0);
	for (i = 0; i < 10; i++)
		kvshm_ledger_touch(f->l, 1000 + i);
	assert_int_equal(atomic_load(&f->l->ring_head), 10);
	for (i = 0; i < 10; i++)
		assert_int_equal(atomic_load(&f->l->ring[i]), 1000 + i);
	assert_int_equal(atomic_load(&f->l->ring[10]), 0);

	for (i = 10; i < n; i++)
		kvshm_ledger_touch(f->l, 1000 + i);
	assert_int_equal(atomic_load(&f->l->ring_head), n);
	/* Entry j holds the newest access that mapped to it. */
	for (i = n - KVSHM_RING; i < n; i++)
		assert_int_equal(atomic_load(&f->l->ring[i % KVSHM_RING]), 1000 + i);
	/* The ring does not run into the slots. */
	assert_int_equal(slot(f, 0), 0);
}

/* A hit run is noted deepest block first, after what came before;
 * neighbouring pages as a page and a run entry. */
static void test_ring_run_deepest_first(void **state)
{
	struct fix *f = *state;
	const uint32_t run[3] = { 7, 8, 9 };

	kvshm_ledger_touch(f->l, 5);
	kvshm_ledger_touch_run(f->l, run, 3);
	kvshm_ledger_touch_run(f->l, run, 0);
	assert_int_equal(atomic_load(&f->l->ring_head), 3);
	assert_int_equal(atomic_load(&f->l->ring[0]), 5);
	assert_int_equal(atomic_load(&f->l->ring[1]), 9);
	assert_int_equal(atomic_load(&f->l->ring[2]), KVSHM_RING_RUN | 2);	/* 8, 7 */
}

/* Runs up and down, single pages between them, and a run longer than one
 * entry may name. */
static void test_ring_runs(void **state)
{
	struct fix *f = *state;
	const uint32_t mixed[7] = { 3, 10, 11, 12, 6, 5, 40 };
	uint32_t lng[300], i;

	kvshm_ledger_touch_run(f->l, mixed, 7);
	/* Deepest first: 40, 5 6, 12 11 10, 3. */
	assert_int_equal(atomic_load(&f->l->ring_head), 6);
	assert_int_equal(atomic_load(&f->l->ring[0]), 40);
	assert_int_equal(atomic_load(&f->l->ring[1]), 5);
	assert_int_equal(atomic_load(&f->l->ring[2]), KVSHM_RING_RUN | KVSHM_RING_UP | 1);
	assert_int_equal(atomic_load(&f->l->ring[3]), 12);
	assert_int_equal(atomic_load(&f->l->ring[4]), KVSHM_RING_RUN | 2);
	assert_int_equal(atomic_load(&f->l->ring[5]), 3);

	for (i = 0; i < 300; i++)
		lng[i] = 100 + i;
	kvshm_ledger_touch_run(f->l, lng, 300);
	/* 399, then 256 more down to 143; 142, then 42 more down to 100. */
	assert_int_equal(atomic_load(&f->l->ring_head), 10);
	assert_int_equal(atomic_load(&f->l->ring[6]), 399);
	assert_int_equal(atomic_load(&f->l->ring[7]), KVSHM_RING_RUN | KVSHM_RING_RUN_MAX);
	assert_int_equal(atomic_load(&f->l->ring[8]), 142);
	assert_int_equal(atomic_load(&f->l->ring[9]), KVSHM_RING_RUN | 42);
}

/* kvshm_ledger_touch_seq writes what kvshm_ledger_touch_run writes for
 * the same run (up or down, shorter and longer than a run entry, across
 * the ring's wrap), without reading the run's pages. */
static void test_ring_seq(void **state)
{
	struct fix *f = *state;
	static const size_t lens[] = { 1, 2, 3, 256, 257, 258, 300, 513, 600 };
	uint32_t pages[600], a[KVSHM_RING], i;
	uint64_t h0, h1, h2;
	size_t k;

	for (k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		for (int32_t stride = -1; stride <= 1; stride += 2) {
			uint32_t first = stride > 0 ? 1000 : 5000;

			for (i = 0; i < lens[k]; i++)
				pages[i] = first + (uint32_t)((int32_t)i * stride);
			h0 = atomic_load(&f->l->ring_head);
			kvshm_ledger_touch_run(f->l, pages, lens[k]);
			h1 = atomic_load(&f->l->ring_head);
			for (i = 0; i < h1 - h0; i++)
				a[i] = atomic_load(&f->l->ring[(h0 + i) % KVSHM_RING]);
			kvshm_ledger_touch_seq(f->l, first, lens[k], stride);
			h2 = atomic_load(&f->l->ring_head);
			assert_int_equal(h2 - h1, h1 - h0);
			for (i = 0; i < h1 - h0; i++)
				assert_int_equal(atomic_load(&f->l->ring[(h1 + i) % KVSHM_RING]),
						 a[i]);
		}
	}
}

static void test_validate(void **state)
{
	struct fix *f = *state;
	struct kvshm_ledger *l = f->l;

	assert_int_equal(kvshm_ledger_validate(l, f->lbytes), 0);
	assert_int_equal(kvshm_ledger_validate(l, f->lbytes + 4096), 0);
	/* Mapped bytes too small for the header, or for nslots. */
	assert_true(kvshm_ledger_validate(l, sizeof(*l) - 1) < 0);
	assert_true(kvshm_ledger_validate(l, 0) < 0);
	assert_int_equal(kvshm_ledger_validate(l, sizeof(*l)), -EBADMSG);
	assert_int_equal(kvshm_ledger_validate(l, f->lbytes - 8), -EBADMSG);
	l->nslots = NSLOTS * 1000;
	assert_int_equal(kvshm_ledger_validate(l, f->lbytes), -EBADMSG);
	l->nslots = UINT32_MAX;
	assert_int_equal(kvshm_ledger_validate(l, f->lbytes), -EBADMSG);
	l->nslots = NSLOTS;
	/* Bad magic or version. */
	l->magic ^= 1;
	assert_int_equal(kvshm_ledger_validate(l, f->lbytes), -EPROTO);
	l->magic ^= 1;
	l->version++;
	assert_int_equal(kvshm_ledger_validate(l, f->lbytes), -EPROTO);
	l->version--;
	assert_int_equal(kvshm_ledger_validate(l, f->lbytes), 0);
}

/* A chain of n READY, indexed blocks (keys[i] child of keys[i - 1], root
 * {7, 7}), tokens seed + i * BT + j; their pages and gens out. */
static void chain(struct fix *f, uint32_t seed, uint32_t n, struct kvshm_key *keys,
		  uint32_t *tokens, uint32_t *page, uint32_t *gen)
{
	struct kvshm_key parent = { 7, 7 };
	uint32_t i, j, w, wg;

	for (i = 0; i < n; i++) {
		keys[i] = (struct kvshm_key){ 0x5000 + seed * 100 + i,
					      (uint64_t)(seed * 100 + i) << 32 | (seed + i) };
		for (j = 0; j < BT; j++)
			tokens[i * BT + j] = seed + i * BT + j;
		assert_int_equal(kvshm_page_alloc(f->h, 3, 1, &page[i], &gen[i]), 0);
		assert_int_equal(kvshm_page_publish(f->h, page[i], gen[i], 3, keys[i], parent,
						    tokens + i * BT, &w, &wg), KVSHM_PUBLISHED);
		parent = keys[i];
	}
}

/*
 * shm/prefix.h: the walk pins exactly the verified prefix (through the
 * slots given, one fence per run), stops on a block whose tokens, parent
 * or namespace differ (missed), and when a page left READY after its
 * verification its pin fails and the slots from there on are empty again
 * (not missed: a pin failure). The evictor's scan sees every pin it took.
 */
static void test_walk_pins_verified_prefix(void **state)
{
	enum { N = 40 };	/* more than one pin run (KVSHM_PIN_RUN) */
	struct fix *f = *state;
	struct kvshm_key keys[N];
	uint32_t tokens[N * BT], page[N], gen[N], slots[N], got_page[N], got_gen[N], i;
	struct kvshm_walk w = { keys, tokens, slots, got_page, got_gen, N, 1, { 7, 7 } };
	struct calls c = { 0 };
	bool missed;

	_Static_assert(N > KVSHM_PIN_RUN, "two runs");
	chain(f, 1, N, keys, tokens, page, gen);
	for (i = 0; i < N; i++)
		slots[i] = N - 1 - i;	/* any slots, in any order */
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), N);
	assert_false(missed);
	for (i = 0; i < N; i++) {
		assert_int_equal(got_page[i], page[i]);
		assert_int_equal(got_gen[i], gen[i]);
		assert_int_equal(slot(f, slots[i]), kvshm_slot_pack(page[i], gen[i]));
	}
	/* A fresh pool hands out one run of pages: the ring notes it as its
	 * deepest page and a run down from it. */
	assert_int_equal(page[N - 1], page[0] + N - 1);
	assert_int_equal(atomic_load(&f->l->ring_head), 2);
	assert_int_equal(atomic_load(&f->l->ring[0]), page[N - 1]);
	assert_int_equal(atomic_load(&f->l->ring[1]), KVSHM_RING_RUN | (N - 1));
	assert_true(kvshm_page_evict_mark(f->h, page[35]));
	kvshm_ledger_scan(f->l, NSLOTS, f->h, record, &c);
	assert_int_equal(c.n, 1);
	assert_int_equal(c.page[0], page[35]);
	kvshm_page_evict_back_off(f->h, page[35]);
	for (i = 0; i < N; i++)
		kvshm_ledger_unpin(f->l, slots[i]);

	/* Other tokens in block 33 (the query's): the prefix is 33, a miss. */
	tokens[33 * BT + 5] ^= 1;
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), 33);
	assert_true(missed);
	for (i = 0; i < N; i++)
		assert_int_equal(slot(f, slots[i]), i < 33 ? kvshm_slot_pack(page[i], gen[i]) : 0);
	for (i = 0; i < N; i++)
		kvshm_ledger_unpin(f->l, slots[i]);
	tokens[33 * BT + 5] ^= 1;
	/* Another parent for block 0, another namespace: nothing. */
	w.parent = (struct kvshm_key){ 7, 8 };
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), 0);
	assert_true(missed);
	w.parent = (struct kvshm_key){ 7, 7 };
	w.ns_id = 2;
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), 0);
	assert_true(missed);
	w.ns_id = 1;

	/* A run whose page 2 left READY after it verified: pin_run pins the
	 * two before it and leaves the rest of the run's slots empty. */
	for (i = 0; i < 5; i++)
		atomic_store(&f->l->slot[slots[i]], 0);
	assert_true(kvshm_page_evict_mark(f->h, page[2]));
	assert_int_equal(kvshm_ledger_pin_run(f->l, slots, f->h, page, gen, 5), 2);
	for (i = 0; i < 5; i++)
		assert_int_equal(slot(f, slots[i]), i < 2 ? kvshm_slot_pack(page[i], gen[i]) : 0);
	/* The walk over it: verification fails first (not READY): a miss. */
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), 2);
	assert_true(missed);
	kvshm_page_evict_back_off(f->h, page[2]);
	/* A gen that moved on since verification: not pinned. */
	gen[1]++;
	assert_int_equal(kvshm_ledger_pin_run(f->l, slots, f->h, page, gen, 5), 1);
	assert_int_equal(slot(f, slots[1]), 0);
	gen[1]--;
	for (i = 0; i < N; i++)
		kvshm_ledger_unpin(f->l, slots[i]);

	/* One block (the walk's short path), with and without the fence:
	 * pinned and noted, a miss, and a miss when its page is EVICTING
	 * (verification refuses it; a pin lost after verification is the
	 * general path's, above, through the same kvshm_pin_run_at). */
	w.n = 1;
	for (int fence = 0; fence < 2; fence++) {
		uint64_t hd = atomic_load(&f->l->ring_head);

		w.fence = fence;
		assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), 1);
		assert_false(missed);
		assert_int_equal(got_page[0], page[0]);
		assert_int_equal(slot(f, slots[0]), kvshm_slot_pack(page[0], gen[0]));
		assert_int_equal(atomic_load(&f->l->ring_head), hd + 1);
		assert_int_equal(atomic_load(&f->l->ring[hd % KVSHM_RING]), page[0]);
		kvshm_ledger_unpin(f->l, slots[0]);
		tokens[3] ^= 1;
		assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), 0);
		assert_true(missed);
		tokens[3] ^= 1;
		assert_true(kvshm_page_evict_mark(f->h, page[0]));
		assert_int_equal(kvshm_walk_pin(f->h, f->l, &w, &missed), 0);
		assert_true(missed);
		kvshm_page_evict_back_off(f->h, page[0]);
	}
}

/*
 * Every page of the pool handed out (a fresh pool hands out 0, 1, ...),
 * then a chain of n blocks (keys[i] child of keys[i - 1], root {7, 7},
 * tokens seed + i * BT + j) published on pages at[0..n), and the other
 * pages freed; their gens out in gens[NPAGES].
 */
static void lay_chain(struct fix *f, const uint32_t *at, uint32_t n, uint32_t seed,
		      struct kvshm_key *keys, uint32_t *tokens, uint32_t *gens)
{
	struct kvshm_key parent = { 7, 7 };
	uint32_t all[NPAGES], i, j, w, wg;
	bool used[NPAGES] = { false };

	for (i = 0; i < NPAGES; i++) {
		assert_int_equal(kvshm_page_alloc(f->h, 3, 1, &all[i], &gens[i]), 0);
		assert_int_equal(all[i], i);
	}
	for (i = 0; i < n; i++) {
		used[at[i]] = true;
		keys[i] = (struct kvshm_key){ seed + i, (uint64_t)(seed + 0x33 + i) << 32 | i };
		for (j = 0; j < BT; j++)
			tokens[i * BT + j] = seed + i * BT + j;
		assert_int_equal(kvshm_page_publish(f->h, at[i], gens[at[i]], 3, keys[i], parent,
						    tokens + i * BT, &w, &wg), KVSHM_PUBLISHED);
		parent = keys[i];
	}
	for (i = NPAGES; i-- > 0;)
		if (!used[i])
			assert_int_equal(kvshm_page_free(f->h, i, gens[i], 3), 0);
}

/* Walk w whole: every block found on its page at[] (slots 0..n), pinned
 * at its page's gen, then unpinned. */
static void walk_whole(struct fix *f, const struct kvshm_walk *w, const uint32_t *at,
		       const uint32_t *gens)
{
	bool missed;
	uint32_t i;

	assert_int_equal(kvshm_walk_pin(f->h, f->l, w, &missed), w->n);
	assert_false(missed);
	for (i = 0; i < w->n; i++) {
		assert_int_equal(w->page[i], at[i]);
		assert_int_equal(slot(f, i), kvshm_slot_pack(at[i], gens[at[i]]));
		kvshm_ledger_unpin(f->l, i);
	}
}

/*
 * shm/prefix.h finds a block's page two ways: by guessing the page next to
 * its parent's (blocks allocated together) or through the index. A chain
 * laid out in a run, then scattered, then in a run up and one down is
 * found whole, every block on its own page. A READY page that left the index
 * (kvshm_page_unlist: punched out, still pinned by a reader) is never
 * found by the guess, though it is the page after its parent's and its
 * identity is exact: the walk takes the block's indexed page instead, or
 * misses when there is none.
 */
static void test_walk_guess_and_index(void **state)
{
	enum { N = 40 };
	struct fix *f = *state;
	struct kvshm_key keys[N];
	uint32_t tokens[N * BT], gens[NPAGES], page[N], slots[N], gp[N], gg[N];
	uint32_t i, w, wg, fresh, fresh_gen;
	struct kvshm_walk walk = { keys, tokens, slots, gp, gg, N, 1, { 7, 7 } };
	bool missed;

	for (i = 0; i < N; i++) {
		/* 0..11 in a run, 12..23 scattered, 24..31 a run, 32..39 a
		 * run downwards. */
		page[i] = i < 12 ? i : i < 24 ? 62 - 2 * (i - 12) : i < 32 ? 12 + (i - 24) :
			  27 - (i - 32);
		slots[i] = i;
	}
	lay_chain(f, page, N, 0x7100, keys, tokens, gens);
	walk_whole(f, &walk, page, gens);

	/* Block 30's page (18, right after block 29's) leaves the index but
	 * stays READY: the walk stops there, a miss. */
	assert_int_equal(page[30], page[29] + 1);
	assert_int_equal(kvshm_page_unlist(f->h, page[30]), 0);
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &walk, &missed), 30);
	assert_true(missed);
	for (i = 0; i < 30; i++)
		kvshm_ledger_unpin(f->l, i);
	/* The same block published again elsewhere: the walk finds that one
	 * through the index, and goes on to the end. */
	assert_int_equal(kvshm_page_alloc(f->h, 3, 1, &fresh, &fresh_gen), 0);
	assert_true(fresh != page[30] && fresh != page[29] + 1);
	assert_int_equal(kvshm_page_publish(f->h, fresh, fresh_gen, 3, keys[30], keys[29],
					    tokens + 30 * BT, &w, &wg), KVSHM_PUBLISHED);
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &walk, &missed), N);
	assert_false(missed);
	for (i = 0; i < N; i++) {
		assert_int_equal(gp[i], i == 30 ? fresh : page[i]);
		kvshm_ledger_unpin(f->l, i);
	}
}

/* A chain of 8 blocks on pages `at` (every other page of the pool free):
 * walked whole, each block on its page, and pinned. */
static void walk_laid(struct fix *f, const uint32_t *at)
{
	enum { N = 8 };
	struct kvshm_key keys[N];
	uint32_t tokens[N * BT], gens[NPAGES], slots[N], gp[N], gg[N], i;
	struct kvshm_walk walk = { keys, tokens, slots, gp, gg, N, 1, { 7, 7 } };

	for (i = 0; i < N; i++)
		slots[i] = i;
	lay_chain(f, at, N, 0x7300, keys, tokens, gens);
	for (int fence = 0; fence < 2; fence++) {
		walk.fence = fence;
		walk_whole(f, &walk, at, gens);
	}
}

/* A run up to the pool's last page that goes on at page 0, and one down
 * to page 0 that goes on at the last, with and without the fence: the
 * guessing stops at the pool's end and the index finds the rest. */
static void test_walk_past_the_pool_end(void **state)
{
	const uint32_t up[8] = { NPAGES - 4, NPAGES - 3, NPAGES - 2, NPAGES - 1, 0, 1, 2, 3 };

	walk_laid(*state, up);
}

static void test_walk_down_past_page_0(void **state)
{
	const uint32_t down[8] = { 3, 2, 1, 0, NPAGES - 1, NPAGES - 2, NPAGES - 3, NPAGES - 4 };

	walk_laid(*state, down);
}

/* An engine-keyed walk (flat): every block's parent is the walk's parent
 * (the root), not the block before it; a chained walk over the same
 * blocks stops after the first. */
static void test_walk_flat(void **state)
{
	struct fix *f = *state;
	struct kvshm_key keys[3], root = { 9, 9 };
	uint32_t tokens[3 * BT], page[3], gen[3], slots[3] = { 0, 1, 2 }, gp[3], gg[3], i, j, w, wg;
	struct kvshm_walk walk = { keys, tokens, slots, gp, gg, 3, 1, root, true };
	bool missed;

	for (i = 0; i < 3; i++) {
		keys[i] = (struct kvshm_key){ 0x9000 + i, (uint64_t)(0x77 + i) << 32 | i };
		for (j = 0; j < BT; j++)
			tokens[i * BT + j] = 500 + i * BT + j;
		assert_int_equal(kvshm_page_alloc(f->h, 3, 1, &page[i], &gen[i]), 0);
		assert_int_equal(kvshm_page_publish(f->h, page[i], gen[i], 3, keys[i], root,
						    tokens + i * BT, &w, &wg), KVSHM_PUBLISHED);
	}
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &walk, &missed), 3);
	assert_false(missed);
	for (i = 0; i < 3; i++)
		kvshm_ledger_unpin(f->l, slots[i]);
	walk.flat = false;
	assert_int_equal(kvshm_walk_pin(f->h, f->l, &walk, &missed), 1);
	assert_true(missed);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_init_and_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_slot_pack, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_ready, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hold_then_publish, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scan, setup, teardown),
		cmocka_unit_test_setup_teardown(test_count, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ring_wraps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ring_run_deepest_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ring_runs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ring_seq, setup, teardown),
		cmocka_unit_test_setup_teardown(test_validate, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_pins_verified_prefix, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_flat, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_guess_and_index, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_past_the_pool_end, setup, teardown),
		cmocka_unit_test_setup_teardown(test_walk_down_past_page_0, setup, teardown),
	};

	return cmocka_run_group_tests_name("ledger", tests, NULL, NULL);
}
