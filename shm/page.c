// SPDX-License-Identifier: MIT
/*
 * page.c - page life transitions (daemon, single writer) and exact
 * verification (any reader). See page.h for the state machine and
 * segment.h for the ordering of each page-table field.
 */
#include <errno.h>

#include "index.h"
#include "page.h"

#define RELAXED __ATOMIC_RELAXED

static void stat_add(struct kvshm_header *h, _Atomic uint64_t *c, int64_t d)
{
	(void)h;
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d,
			      memory_order_relaxed);
}

/* A page starts or stops holding a block of its namespace (READY or
 * EVICTING): that namespace's and that tenant's page gauges follow, with
 * no sweep. */
static void ns_pages_add(struct kvshm_header *h, const struct kvshm_page *p, int64_t d)
{
	if (p->ns_id < h->geo.max_ns)
		stat_add(h, &kvshm_ns_stats(h)[p->ns_id].pages, d);
	if (p->tenant < KVSHM_TENANTS)
		stat_add(h, &kvshm_tenants(h)[p->tenant].pages, d);
}

static void set_state(struct kvshm_page *p, uint32_t s)
{
	atomic_store_explicit(&p->state, s, memory_order_seq_cst);
}

static uint32_t state_of(const struct kvshm_page *p)
{
	return atomic_load_explicit(&p->state, memory_order_seq_cst);
}

static void bump_gen(struct kvshm_page *p)
{
	uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed);

	atomic_store_explicit(&p->gen, g + 1, memory_order_release);
	/* Order the identity writes that follow after the bump, for readers
	 * that re-check gen after reading them (kvshm_page_verify). */
	atomic_thread_fence(memory_order_release);
}

/* A page written by one rank, or not WRITING: no slices. */
static void slices_clear(struct kvshm_page *p)
{
	atomic_store_explicit(&p->writers, 0, memory_order_relaxed);
	atomic_store_explicit(&p->slices, 0, memory_order_relaxed);
}

void kvshm_page_slices(struct kvshm_header *h, uint32_t page, uint32_t writers,
		       uint32_t slices)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];

	atomic_store_explicit(&p->writers, writers, memory_order_relaxed);
	atomic_store_explicit(&p->slices, slices, memory_order_relaxed);
}

static bool in_flight(const struct kvshm_page *p)
{
	return atomic_load_explicit(&p->flight, memory_order_relaxed) != 0;
}

/* The page is no longer in flight (its index entry, if still under the
 * announced key, is gone or taken over by now). */
static void flight_clear(struct kvshm_header *h, struct kvshm_page *p)
{
	atomic_store_explicit(&p->flight, 0, memory_order_release);
	stat_add(h, &kvshm_stats(h)->pages_in_flight, -1);
}

/* An announced page gives up its key: out of the index, out of flight. A
 * reader that found the entry then sees flight 0 or the entry gone. */
static void flight_cancel(struct kvshm_header *h, uint32_t page)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];

	if (!in_flight(p))
		return;
	kvshm_index_remove(h, kvshm_load_key(&p->key), page);
	flight_clear(h, p);
}

void kvshm_page_unannounce(struct kvshm_header *h, uint32_t page)
{
	if (page < h->geo.n_pages)
		flight_cancel(h, page);
}

/* Any state -> FREE (caller has checked it may), back on the stack. */
static void to_free(struct kvshm_header *h, uint32_t page)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];
	struct kvshm_free *fr = kvshm_free(h);
	struct kvshm_stats *st = kvshm_stats(h);
	uint32_t old = state_of(p);

	flight_cancel(h, page);
	bump_gen(p);
	set_state(p, KVSHM_PAGE_FREE);
	__atomic_store_n(&p->owner, 0, RELAXED);
	__atomic_store_n(&p->unlisted, 0, RELAXED);
	slices_clear(p);
	fr->page[fr->count++] = page;
	stat_add(h, &st->pages_free, 1);
	if (old == KVSHM_PAGE_WRITING)
		stat_add(h, &st->pages_writing, -1);
	else if (old == KVSHM_PAGE_READY || old == KVSHM_PAGE_EVICTING) {
		stat_add(h, &st->pages_ready, -1);
		ns_pages_add(h, p, -1);
	}
}

int kvshm_page_alloc(struct kvshm_header *h, uint32_t owner, uint32_t ns_id,
		     uint32_t *page, uint32_t *gen)
{
	struct kvshm_free *fr = kvshm_free(h);
	struct kvshm_stats *st = kvshm_stats(h);
	struct kvshm_page *p;
	uint32_t i;

	if (!fr->count)
		return -ENOSPC;
	i = fr->page[--fr->count];
	p = &kvshm_pages(h)[i];
	bump_gen(p);
	__atomic_store_n(&p->owner, owner, RELAXED);
	__atomic_store_n(&p->ns_id, ns_id, __ATOMIC_RELAXED);
	/* Whose key space it is in, the caller says (kvshm_page_set_tenant). */
	__atomic_store_n(&p->tenant, KVSHM_TENANT_NONE, __ATOMIC_RELAXED);
	slices_clear(p);
	set_state(p, KVSHM_PAGE_WRITING);
	stat_add(h, &st->pages_free, -1);
	stat_add(h, &st->pages_writing, 1);
	stat_add(h, &st->allocs, 1);
	*page = i;
	*gen = atomic_load_explicit(&p->gen, memory_order_relaxed);
	return 0;
}

void kvshm_page_set_tenant(struct kvshm_header *h, uint32_t page, uint32_t tenant)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];

	if (page < h->geo.n_pages && state_of(p) == KVSHM_PAGE_WRITING)
		__atomic_store_n(&p->tenant, tenant, __ATOMIC_RELAXED);
}

static bool is_writing_by(const struct kvshm_header *h, uint32_t page,
			  uint32_t gen, uint32_t owner)
{
	const struct kvshm_page *p;

	if (page >= h->geo.n_pages)
		return false;
	p = &kvshm_pages(h)[page];
	return state_of(p) == KVSHM_PAGE_WRITING &&
	       __atomic_load_n(&p->owner, RELAXED) == owner &&
	       atomic_load_explicit(&p->gen, memory_order_relaxed) == gen;
}

int kvshm_page_free(struct kvshm_header *h, uint32_t page, uint32_t gen,
		    uint32_t owner)
{
	if (!is_writing_by(h, page, gen, owner))
		return -EINVAL;
	to_free(h, page);
	return 0;
}

static void write_identity(struct kvshm_header *h, uint32_t page, struct kvshm_key key,
			   struct kvshm_key parent, const uint32_t *tokens)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];
	uint32_t *tok = kvshm_tokens(h, page), i;

	kvshm_store_key(&p->key, key);
	kvshm_store_key(&p->parent, parent);
	for (i = 0; i < h->geo.block_tokens; i++)
		__atomic_store_n(&tok[i], tokens[i], RELAXED);
}

/* WRITING -> READY, indexed: the last step of a publish. */
static void make_ready(struct kvshm_header *h, struct kvshm_page *p)
{
	struct kvshm_stats *st = kvshm_stats(h);

	__atomic_store_n(&p->owner, 0, RELAXED);
	slices_clear(p);
	set_state(p, KVSHM_PAGE_READY);
	stat_add(h, &st->pages_writing, -1);
	stat_add(h, &st->pages_ready, 1);
	ns_pages_add(h, p, 1);
	stat_add(h, &st->publishes, 1);
	stat_add(h, &st->index_entries, 1);
}

/*
 * Publish `page` where the index names `have` for key, a page in flight:
 * `page` itself (announced) or another writer's. READY comes before the
 * index names the page and before the flight ends, so a reader that finds
 * the entry sees either the block in flight or the page whole.
 */
static void publish_inflight(struct kvshm_header *h, uint32_t page, uint32_t have,
			     struct kvshm_key key, struct kvshm_key parent,
			     const uint32_t *tokens)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];

	write_identity(h, page, key, parent, tokens);
	make_ready(h, p);
	if (have != page) {
		kvshm_index_move(h, key, have, page);
		if (in_flight(&kvshm_pages(h)[have]))
			flight_clear(h, &kvshm_pages(h)[have]);
	} else if (in_flight(p)) {
		flight_clear(h, p);
	}
}

int kvshm_page_announce(struct kvshm_header *h, uint32_t page, uint32_t gen,
			uint32_t owner, struct kvshm_key key, struct kvshm_key parent)
{
	struct kvshm_page *p;

	if (!is_writing_by(h, page, gen, owner))
		return -EINVAL;
	p = &kvshm_pages(h)[page];
	if (in_flight(p) || kvshm_index_find(h, key) != UINT32_MAX)
		return 1;
	kvshm_store_key(&p->key, key);
	kvshm_store_key(&p->parent, parent);
	atomic_store_explicit(&p->flight, 1, memory_order_release);
	if (kvshm_index_insert(h, key, page)) {
		atomic_store_explicit(&p->flight, 0, memory_order_release);
		return 1;
	}
	stat_add(h, &kvshm_stats(h)->pages_in_flight, 1);
	stat_add(h, &kvshm_stats(h)->flights, 1);
	return 0;
}

int kvshm_page_publish(struct kvshm_header *h, uint32_t page, uint32_t gen,
		       uint32_t owner, struct kvshm_key key,
		       struct kvshm_key parent, const uint32_t *tokens,
		       uint32_t *winner, uint32_t *winner_gen)
{
	struct kvshm_stats *st = kvshm_stats(h);
	uint32_t have, wgen;
	struct kvshm_page *p;
	int rc;

	if (!is_writing_by(h, page, gen, owner))
		return -EINVAL;
	p = &kvshm_pages(h)[page];
	/* Announced under another key than it publishes: give that one up. */
	if (in_flight(p) && !kvshm_key_eq(kvshm_load_key(&p->key), key))
		flight_cancel(h, page);
	have = kvshm_index_find(h, key);
	if (have == page || (have < h->geo.n_pages &&
			     state_of(&kvshm_pages(h)[have]) == KVSHM_PAGE_WRITING)) {
		/* The entry names a page in flight: ours (announced), or another
		 * writer's, whose entry this publish takes over in place. */
		publish_inflight(h, page, have, key, parent, tokens);
		*winner = page;
		*winner_gen = gen;
		return KVSHM_PUBLISHED;
	}
	if (have != UINT32_MAX && have < h->geo.n_pages) {
		/* Someone was first. Equal block: share it. Else: collision. */
		if (kvshm_page_verify(h, have, p->ns_id, key, parent, tokens, &wgen)) {
			to_free(h, page);
			stat_add(h, &st->publish_dups, 1);
			*winner = have;
			*winner_gen = wgen;
			return KVSHM_PUBLISH_DUP;
		}
		to_free(h, page);
		stat_add(h, &st->publish_refused, 1);
		return -EEXIST;
	}
	write_identity(h, page, key, parent, tokens);
	rc = kvshm_index_insert(h, key, page);
	if (rc) {
		to_free(h, page);
		stat_add(h, &st->publish_refused, 1);
		return rc;
	}
	make_ready(h, p);
	*winner = page;
	*winner_gen = gen;
	return KVSHM_PUBLISHED;
}

int kvshm_page_unlist(struct kvshm_header *h, uint32_t page)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];

	__atomic_store_n(&p->unlisted, 1, RELAXED);
	return kvshm_index_remove(h, p->key, page);
}

bool kvshm_page_evict_mark(struct kvshm_header *h, uint32_t page)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];

	if (state_of(p) != KVSHM_PAGE_READY)
		return false;
	set_state(p, KVSHM_PAGE_EVICTING);
	return true;
}

void kvshm_page_evict_back_off(struct kvshm_header *h, uint32_t page)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];

	if (state_of(p) != KVSHM_PAGE_EVICTING)
		return;
	set_state(p, KVSHM_PAGE_READY);
	stat_add(h, &kvshm_stats(h)->evict_backoffs, 1);
}

void kvshm_page_evict_finish(struct kvshm_header *h, uint32_t page)
{
	struct kvshm_page *p = &kvshm_pages(h)[page];
	struct kvshm_stats *st = kvshm_stats(h);

	if (state_of(p) != KVSHM_PAGE_EVICTING)
		return;
	if (!kvshm_index_remove(h, p->key, page))
		stat_add(h, &st->index_entries, -1);
	to_free(h, page);
	stat_add(h, &st->evictions, 1);
}

int kvshm_page_evict_to_slot(struct kvshm_header *h, uint32_t page, uint32_t slot)
{
	struct kvshm_page *p;

	if (page >= h->geo.n_pages)
		return -EINVAL;
	p = &kvshm_pages(h)[page];
	if (state_of(p) != KVSHM_PAGE_EVICTING ||
	    kvshm_index_move(h, p->key, page, KVSHM_LOC_SLOT | slot))
		return -EINVAL;
	to_free(h, page);
	stat_add(h, &kvshm_stats(h)->evictions, 1);
	return 0;
}

int kvshm_page_restore(struct kvshm_header *h, uint32_t page, uint32_t gen,
		       uint32_t owner, uint32_t slot, struct kvshm_key key,
		       struct kvshm_key parent, const uint32_t *tokens)
{
	struct kvshm_stats *st = kvshm_stats(h);
	struct kvshm_page *p;

	if (!is_writing_by(h, page, gen, owner) ||
	    kvshm_index_find(h, key) != (KVSHM_LOC_SLOT | slot))
		return -EINVAL;
	p = &kvshm_pages(h)[page];
	write_identity(h, page, key, parent, tokens);
	/* READY before the index names the page: a reader that finds it
	 * through the index sees it whole. */
	__atomic_store_n(&p->owner, 0, RELAXED);
	slices_clear(p);
	set_state(p, KVSHM_PAGE_READY);
	kvshm_index_move(h, key, KVSHM_LOC_SLOT | slot, page);
	stat_add(h, &st->pages_writing, -1);
	stat_add(h, &st->pages_ready, 1);
	ns_pages_add(h, p, 1);
	return 0;
}
