// SPDX-License-Identifier: MIT
/*
 * segment.c - unit tests for shm/segment.c: layout, init and validation.
 *
 * kvshm_layout refuses bad geometry (zero, oversized, not a power of two,
 * overflowing), and for good geometry gives cache-line aligned regions that
 * do not overlap and fit in a whole number of 4 KiB pages. kvshm_init
 * builds the free stack. kvshm_validate accepts a fresh segment and refuses
 * every kind of damage with the right code and a reason.
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

#include "../../shm/ledger.h"
#include "../../shm/segment.h"

static struct kvshm_geometry good_geo(void)
{
	struct kvshm_geometry geo = {
		.page_bytes = 4096,
		.n_pages = 64,
		.block_tokens = 16,
		.n_buckets = kvshm_buckets_for(64),
		.max_clients = 4,
		.max_ns = 4,
		.ledger_slots = 64,
	};

	return geo;
}

static void test_layout_rejects(void **state)
{
	struct kvshm_geometry g;
	struct kvshm_header h;

	(void)state;
#define REJECT(stmt) do { g = good_geo(); stmt; \
		assert_int_equal(kvshm_layout(&h, &g), -EINVAL); } while (0)
	REJECT(g.page_bytes = 0);
	REJECT(g.n_pages = 0);
	REJECT(g.block_tokens = 0);
	REJECT(g.block_tokens = KVSHM_MAX_BLOCK_TOKENS + 1);
	REJECT(g.block_tokens = UINT32_MAX);
	REJECT(g.n_buckets = 0);
	REJECT(g.n_buckets = 3);
	REJECT(g.n_buckets = 96);
	REJECT(g.n_buckets = (1u << 31) + 1);
	REJECT(g.max_clients = 0);
	REJECT(g.max_ns = 0);
	REJECT(g.ledger_slots = 0);
	REJECT(g.n_pages = UINT32_MAX);
	REJECT(g.n_pages = UINT32_MAX - 1);
	/* Index entries name a page or, with KVSHM_LOC_SLOT, a spill slot. */
	REJECT(g.n_pages = KVSHM_LOC_SLOT - 1);
	REJECT(g.n_slots = KVSHM_LOC_SLOT - 1);
	/* page_bytes * n_pages does not fit in 64 bits. */
	REJECT(g.page_bytes = 1ull << 40; g.n_pages = 1u << 24);
	REJECT(g.page_bytes = UINT64_MAX; g.n_pages = 2);
	REJECT(g.page_bytes = (UINT64_MAX / 3) + 1; g.n_pages = 3);
#undef REJECT

	/* The edges that are allowed. */
	g = good_geo();
	g.block_tokens = KVSHM_MAX_BLOCK_TOKENS;
	assert_int_equal(kvshm_layout(&h, &g), 0);
	g = good_geo();
	g.n_buckets = 1;
	assert_int_equal(kvshm_layout(&h, &g), 0);
	g = good_geo();
	g.page_bytes = UINT64_MAX / 64;
	assert_int_equal(kvshm_layout(&h, &g), 0);
	assert_int_equal(h.geo.pool_bytes, (UINT64_MAX / 64) * 64);
}

struct region {
	uint64_t off, len;
	const char *name;
};

static int cmp_region(const void *a, const void *b)
{
	const struct region *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

static void check_layout(const struct kvshm_geometry *g)
{
	struct kvshm_header h;
	struct region r[12];
	int i;

	memset(&h, 0xa5, sizeof(h));
	assert_int_equal(kvshm_layout(&h, g), 0);
	assert_int_equal(h.magic, KVSHM_MAGIC);
	assert_int_equal(h.version, KVSHM_VERSION);
	assert_int_equal(h.header_bytes, sizeof(struct kvshm_header));
	assert_int_equal(h.page_entry_bytes, sizeof(struct kvshm_page));
	assert_int_equal(h.bucket_bytes, sizeof(struct kvshm_bucket));
	assert_int_equal(h.stats_bytes, sizeof(struct kvshm_stats));
	assert_int_equal(h.ns_bytes, sizeof(struct kvshm_ns));
	assert_int_equal(h.client_row_bytes, sizeof(struct kvshm_client_row));
	assert_int_equal(h.ledger_header_bytes, sizeof(struct kvshm_ledger));
	assert_int_equal(h.top_bytes, sizeof(struct kvshm_top));
	assert_int_equal(h.geo.n_pages, g->n_pages);
	assert_int_equal(h.geo.page_bytes, g->page_bytes);
	assert_int_equal(h.geo.n_buckets, g->n_buckets);
	assert_int_equal(h.geo.pool_bytes, g->page_bytes * g->n_pages);
	/* Fields the daemon fills later start out zero, not garbage. */
	assert_int_equal(h.daemon_pid, 0);
	assert_int_equal(h.start_time_ns, 0);
	assert_int_equal(atomic_load(&h.heartbeat), 0);

	r[0] = (struct region){ h.off_stats, sizeof(struct kvshm_stats), "stats" };
	r[1] = (struct region){ h.off_ns, (uint64_t)g->max_ns * sizeof(struct kvshm_ns), "ns" };
	r[2] = (struct region){ h.off_clients,
		(uint64_t)g->max_clients * sizeof(struct kvshm_client_row), "clients" };
	r[3] = (struct region){ h.off_buckets,
		(uint64_t)g->n_buckets * sizeof(struct kvshm_bucket), "buckets" };
	r[4] = (struct region){ h.off_pages, (uint64_t)g->n_pages * sizeof(struct kvshm_page),
		"pages" };
	r[5] = (struct region){ h.off_tokens, (uint64_t)g->n_pages * g->block_tokens * 4,
		"tokens" };
	r[6] = (struct region){ h.off_free, sizeof(struct kvshm_free) + (uint64_t)g->n_pages * 4,
		"free" };
	r[7] = (struct region){ h.off_top, sizeof(struct kvshm_top), "top" };
	r[8] = (struct region){ h.off_slots, (uint64_t)g->n_slots * sizeof(struct kvshm_slot),
		"slots" };
	r[9] = (struct region){ h.off_ns_stats,
		(uint64_t)g->max_ns * sizeof(struct kvshm_ns_stats), "ns stats" };
	r[10] = (struct region){ h.off_tenants, KVSHM_TENANTS * sizeof(struct kvshm_tenant),
		"tenants" };
	r[11] = (struct region){ h.off_pinned, KVSHM_PINNED * sizeof(struct kvshm_pinned),
		"pinned" };
	assert_int_equal(h.slot_entry_bytes, sizeof(struct kvshm_slot));
	assert_int_equal(h.ns_stats_bytes, sizeof(struct kvshm_ns_stats));
	assert_int_equal(h.tenant_bytes, sizeof(struct kvshm_tenant));
	assert_int_equal(h.pinned_bytes, sizeof(struct kvshm_pinned));
	for (i = 0; i < 12; i++)
		assert_int_equal(r[i].off % KVSHM_CACHELINE, 0);
	qsort(r, 12, sizeof(r[0]), cmp_region);
	assert_true(r[0].off >= sizeof(struct kvshm_header));
	for (i = 0; i + 1 < 12; i++)
		assert_true(r[i].off + r[i].len <= r[i + 1].off);
	assert_true(r[11].off + r[11].len <= h.segment_bytes);
	assert_int_equal(h.segment_bytes % 4096, 0);
	/* No more than one 4 KiB page of slack at the end. */
	assert_true(h.segment_bytes - (r[11].off + r[11].len) < 4096);
}

static void test_layout_regions(void **state)
{
	struct kvshm_geometry g;

	(void)state;
	g = good_geo();
	check_layout(&g);
	g.n_pages = 1;
	g.n_buckets = 1;
	g.max_ns = 1;
	g.max_clients = 1;
	g.block_tokens = 1;
	check_layout(&g);
	g = good_geo();
	g.n_pages = 100003;	/* odd sizes everywhere */
	g.block_tokens = 7;
	g.max_clients = 3;
	g.max_ns = 5;
	g.n_buckets = kvshm_buckets_for(g.n_pages);
	check_layout(&g);
	g.block_tokens = KVSHM_MAX_BLOCK_TOKENS;
	g.page_bytes = 2ull << 20;
	check_layout(&g);
	g.n_slots = 77777;	/* a spill tier */
	check_layout(&g);
	/* Very large (but valid) tables: layout is arithmetic only. */
	g.n_pages = KVSHM_LOC_SLOT - 2;
	g.n_slots = KVSHM_LOC_SLOT - 2;
	g.n_buckets = 1u << 31;
	g.max_clients = UINT32_MAX;
	g.max_ns = UINT32_MAX;
	g.page_bytes = 4096;
	check_layout(&g);
}

static void test_buckets_for(void **state)
{
	static const uint64_t n[] = { 0, 1, 11, 12, 13, 64, 1000, 4096, 1u << 20, 3000000 };
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(n) / sizeof(n[0]); i++) {
		uint32_t b = kvshm_buckets_for(n[i]);

		assert_true(b >= 8);
		assert_int_equal(b & (b - 1), 0);
		/* Load at most 1/4 of the entry slots... */
		assert_true((uint64_t)b * KVSHM_BUCKET_ENTRIES >= 4 * n[i]);
		/* ...and the smallest power of two that gives that. */
		if (b > 8)
			assert_true((uint64_t)(b / 2) * KVSHM_BUCKET_ENTRIES < 4 * n[i]);
	}
}

struct seg {
	void *base;
	struct kvshm_header *h;
	uint64_t bytes;
};

static void seg_new(struct seg *s, const struct kvshm_geometry *g)
{
	struct kvshm_header h;

	assert_int_equal(kvshm_layout(&h, g), 0);
	s->bytes = h.segment_bytes;
	s->base = aligned_alloc(4096, s->bytes);
	assert_non_null(s->base);
	memset(s->base, 0, s->bytes);
	kvshm_init(s->base, &h);
	s->h = s->base;
}

static void test_init(void **state)
{
	struct kvshm_geometry g = good_geo();
	struct kvshm_free *fr;
	uint8_t seen[64] = { 0 };
	struct seg s;
	uint32_t i;

	(void)state;
	seg_new(&s, &g);
	assert_int_equal(s.h->magic, KVSHM_MAGIC);
	assert_int_equal(s.h->daemon_pid, getpid());
	assert_true(s.h->start_time_ns > 0);
	fr = kvshm_free(s.h);
	assert_int_equal(fr->count, 64);
	for (i = 0; i < 64; i++) {
		assert_true(fr->page[i] < 64);
		assert_int_equal(seen[fr->page[i]], 0);
		seen[fr->page[i]] = 1;
		assert_int_equal(atomic_load(&kvshm_pages(s.h)[i].state), KVSHM_PAGE_FREE);
	}
	/* The top of the stack is page 0: low pages are handed out first. */
	assert_int_equal(fr->page[fr->count - 1], 0);
	assert_int_equal(atomic_load(&kvshm_stats(s.h)->pages_free), 64);
	free(s.base);
}

static void expect(const struct seg *s, uint64_t bytes, int rc)
{
	const char *why = NULL;

	assert_int_equal(kvshm_validate(s->base, bytes, &why), rc);
	if (rc) {
		assert_non_null(why);
		assert_true(strlen(why) > 0);
	}
	/* why may be NULL. */
	assert_int_equal(kvshm_validate(s->base, bytes, NULL), rc);
}

static void test_validate(void **state)
{
	struct kvshm_geometry g = good_geo();
	struct seg s;
	struct kvshm_header *h;
	const char *why = NULL;

	(void)state;
	seg_new(&s, &g);
	h = s.h;
	assert_int_equal(kvshm_validate(s.base, s.bytes, &why), 0);
	expect(&s, s.bytes + 4096, 0);

#define DAMAGE(field, delta, rc) do { h->field += (delta); expect(&s, s.bytes, rc); \
		h->field -= (delta); expect(&s, s.bytes, 0); } while (0)
	DAMAGE(magic, 1, -EPROTO);
	DAMAGE(version, 1, -EPROTO);
	DAMAGE(version, (uint32_t)-1, -EPROTO);
	DAMAGE(header_bytes, 8, -EPROTO);
	DAMAGE(page_entry_bytes, 8, -EPROTO);
	DAMAGE(bucket_bytes, (uint32_t)-64, -EPROTO);
	DAMAGE(stats_bytes, 8, -EPROTO);
	DAMAGE(ns_bytes, 8, -EPROTO);
	DAMAGE(client_row_bytes, 8, -EPROTO);
	DAMAGE(ledger_header_bytes, 64, -EPROTO);
	DAMAGE(off_stats, 64, -EBADMSG);
	DAMAGE(off_ns, 64, -EBADMSG);
	DAMAGE(off_clients, 64, -EBADMSG);
	DAMAGE(off_buckets, 64, -EBADMSG);
	DAMAGE(off_pages, (uint64_t)-64, -EBADMSG);
	DAMAGE(off_tokens, 64, -EBADMSG);
	DAMAGE(off_free, 64, -EBADMSG);
	DAMAGE(off_top, 64, -EBADMSG);
	DAMAGE(top_bytes, 64, -EPROTO);
	DAMAGE(segment_bytes, 4096, -EBADMSG);
	/* Geometry that no layout accepts, or that implies other offsets. */
	DAMAGE(geo.n_buckets, 1, -EBADMSG);
	DAMAGE(geo.block_tokens, KVSHM_MAX_BLOCK_TOKENS, -EBADMSG);
	DAMAGE(geo.n_pages, 1, -EBADMSG);
	DAMAGE(geo.max_clients, 1, -EBADMSG);
#undef DAMAGE
	h->geo.n_pages = 0;
	expect(&s, s.bytes, -EBADMSG);
	h->geo.n_pages = 64;

	/* Mapped bytes smaller than the segment, or than its header. */
	expect(&s, s.bytes - 1, -EBADMSG);
	expect(&s, s.bytes - 4096, -EBADMSG);
	expect(&s, sizeof(struct kvshm_header), -EBADMSG);
	expect(&s, sizeof(struct kvshm_header) - 1, -EBADMSG);
	expect(&s, 0, -EBADMSG);
	expect(&s, s.bytes, 0);

	/* Zeroed memory is not a segment. */
	memset(s.base, 0, sizeof(struct kvshm_header));
	expect(&s, s.bytes, -EPROTO);
	free(s.base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout_rejects),
		cmocka_unit_test(test_layout_regions),
		cmocka_unit_test(test_buckets_for),
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_validate),
	};

	return cmocka_run_group_tests_name("segment", tests, NULL, NULL);
}
