/* SPDX-License-Identifier: MIT */
/*
 * page.h - the life of a pool page, and exact verification.
 *
 *   FREE -> WRITING -> READY -> EVICTING -> FREE
 *                \--(free, lost race, refused)--> FREE
 *                      EVICTING -> READY  (back-off: someone pins it)
 *
 * Every transition below is a daemon-only writer function, called from its
 * main thread; kvshm_page_verify is the reader side that a client's lookup
 * runs with no lock. Transitions check the state they start from and
 * return -EINVAL without touching anything when it is not what they expect,
 * so a client that names a page it does not own changes nothing.
 */
#ifndef KVSHM_PAGE_H
#define KVSHM_PAGE_H

#include <stdbool.h>
#include "segment.h"

/* Outcome of kvshm_page_publish. */
enum kvshm_publish {
	KVSHM_PUBLISHED = 0,	/* page is READY and indexed */
	KVSHM_PUBLISH_DUP = 1,	/* an equal block was there first: page freed */
};

/* Writer: pop a free page, make it WRITING for owner. -ENOSPC if none. */
int kvshm_page_alloc(struct kvshm_header *h, uint32_t owner, uint32_t ns_id,
		     uint32_t *page, uint32_t *gen);

/* Writer: WRITING (owner, gen) -> FREE. -EINVAL if not so. */
int kvshm_page_free(struct kvshm_header *h, uint32_t page, uint32_t gen,
		    uint32_t owner);

/*
 * Writer: WRITING (owner, gen) -> READY with this identity. When the index
 * already holds `key`:
 *   - for the same parent, tokens and namespace: the page is freed and
 *     *winner / *winner_gen name the indexed page (KVSHM_PUBLISH_DUP);
 *   - for anything else (a collision): the page is freed, the index is left
 *     as it was, and -EEXIST is returned.
 * Other errors: -EINVAL (not WRITING, not owner, wrong gen, page out of
 * range), -ENOSPC (index window full; page freed).
 */
int kvshm_page_publish(struct kvshm_header *h, uint32_t page, uint32_t gen,
		       uint32_t owner, struct kvshm_key key,
		       struct kvshm_key parent, const uint32_t *tokens,
		       uint32_t *winner, uint32_t *winner_gen);

/* Writer: READY -> EVICTING. Returns false if the page was not READY. */
bool kvshm_page_evict_mark(struct kvshm_header *h, uint32_t page);

/* Writer: EVICTING -> READY (a pin was found). */
void kvshm_page_evict_back_off(struct kvshm_header *h, uint32_t page);

/* Writer: EVICTING -> FREE: drop from the index, bump gen, free it. */
void kvshm_page_evict_finish(struct kvshm_header *h, uint32_t page);

/*
 * Writer (spill tier): EVICTING -> FREE with the page's index entry moved,
 * in place, to spill slot `slot` (whose entry the caller has made
 * SPILLED). Returns 0, or -EINVAL if the page was not EVICTING or not
 * indexed (then nothing changed).
 */
int kvshm_page_evict_to_slot(struct kvshm_header *h, uint32_t page, uint32_t slot);

/*
 * Writer (spill tier): a WRITING page of `owner` into which the daemon has
 * read spill slot `slot` becomes READY with this identity, taking over the
 * slot's index entry in place. Returns 0 or -EINVAL (page not so, or the
 * index does not name the slot for key).
 */
int kvshm_page_restore(struct kvshm_header *h, uint32_t page, uint32_t gen,
		       uint32_t owner, uint32_t slot, struct kvshm_key key,
		       struct kvshm_key parent, const uint32_t *tokens);

/* Relaxed atomic load of a 64-bit field that the daemon may be writing. */
static inline uint64_t kvshm_load64(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline struct kvshm_key kvshm_load_key(const struct kvshm_key *k)
{
	struct kvshm_key r = { kvshm_load64(&k->lo), kvshm_load64(&k->hi) };
	return r;
}

static inline void kvshm_store_key(struct kvshm_key *d, struct kvshm_key k)
{
	__atomic_store_n(&d->lo, k.lo, __ATOMIC_RELAXED);
	__atomic_store_n(&d->hi, k.hi, __ATOMIC_RELAXED);
}

static inline bool kvshm_tokens_eq(const uint32_t *stored, const uint32_t *q,
				   uint32_t bt)
{
	uint32_t i;

	for (i = 0; i < bt; i++)
		if (__atomic_load_n(&stored[i], __ATOMIC_RELAXED) != q[i])
			return false;
	return true;
}

/*
 * Reader (inline: the client's hot path): is `page` READY in namespace
 * ns_id with exactly this key, parent and tokens? On success *gen is the
 * generation under which it matched; the caller pins (page, *gen) and the
 * pin's re-check of state and gen guarantees the identity read here was
 * stable.
 */
static inline bool kvshm_page_verify(const struct kvshm_header *h, uint32_t page,
				     uint32_t ns_id, struct kvshm_key key,
				     struct kvshm_key parent, const uint32_t *tokens,
				     uint32_t *gen)
{
	const struct kvshm_page *p;
	uint32_t g;

	if (page >= h->geo.n_pages)
		return false;
	p = &kvshm_pages(h)[page];
	g = atomic_load_explicit(&p->gen, memory_order_acquire);
	if (atomic_load_explicit(&p->state, memory_order_acquire) != KVSHM_PAGE_READY)
		return false;
	if (__atomic_load_n(&p->ns_id, __ATOMIC_RELAXED) != ns_id ||
	    !kvshm_key_eq(kvshm_load_key(&p->key), key) ||
	    !kvshm_key_eq(kvshm_load_key(&p->parent), parent) ||
	    !kvshm_tokens_eq(kvshm_tokens(h, page), tokens, h->geo.block_tokens))
		return false;
	/* Identity read under gen g: the caller's pin re-checks gen. */
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&p->gen, memory_order_relaxed) != g)
		return false;
	*gen = g;
	return true;
}

/*
 * Reader (inline, the client's lookup): is `loc` (from kvshm_index_find) a
 * spill slot holding exactly this key and parent in namespace ns_id? Tier 1
 * keeps no tokens in shared memory: the tokens are checked when the block
 * is restored and pinned as a page (kvshm_page_verify).
 */
static inline bool kvshm_slot_verify(const struct kvshm_header *h, uint32_t loc,
				     uint32_t ns_id, struct kvshm_key key,
				     struct kvshm_key parent)
{
	const struct kvshm_slot *s;
	uint32_t slot = loc & ~KVSHM_LOC_SLOT, g;

	if (!kvshm_loc_is_slot(loc) || slot >= h->geo.n_slots)
		return false;
	s = &kvshm_slots(h)[slot];
	g = atomic_load_explicit(&s->gen, memory_order_acquire);
	if (atomic_load_explicit(&s->state, memory_order_acquire) != KVSHM_SLOT_SPILLED)
		return false;
	if (__atomic_load_n(&s->ns_id, __ATOMIC_RELAXED) != ns_id ||
	    !kvshm_key_eq(kvshm_load_key(&s->key), key) ||
	    !kvshm_key_eq(kvshm_load_key(&s->parent), parent))
		return false;
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(&s->gen, memory_order_relaxed) == g;
}

#endif
