/* SPDX-License-Identifier: MIT */
/*
 * page.h - the life of a pool page, and exact verification.
 *
 *   FREE -> WRITING -> READY -> EVICTING -> FREE
 *                \--(free, lost race, refused)--> FREE
 *                      EVICTING -> READY  (back-off: someone pins it)
 *
 * Single flight: a WRITING page may be *announced* (kvshm_page_announce):
 * its key and parent are written and the index names the page under that
 * key while it is still WRITING, with `flight` set, so that a client
 * looking the block up finds it being written (kvshm_page_inflight) and
 * may wait for it instead of computing it too. The announcement ends when
 * the page is published (the entry stays: the block becomes a hit), when
 * another writer publishes the same block first (the entry moves to its
 * page in place), or when the page is freed (the entry goes: a miss).
 * Waiters sleep on their writer's client-row `flight` word, which the
 * daemon bumps after any of these (daemon/core/flight.c).
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
#include <stdint.h>
#include <string.h>

#include "segment.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Outcome of kvshm_page_publish. */
enum kvshm_publish {
	KVSHM_PUBLISHED = 0,	/* page is READY and indexed */
	KVSHM_PUBLISH_DUP = 1,	/* an equal block was there first: page freed */
};

/*
 * Writer: a WRITING page that `writers` ranks write together (kvproto_part)
 * has slices `slices` granted: stores both (relaxed) for lookups to read
 * (kvshm_page_inflight). Before the page is announced, so that a reader
 * that sees it in flight sees them; both are cleared when it leaves
 * WRITING.
 */
void kvshm_page_slices(struct kvshm_header *h, uint32_t page, uint32_t writers,
		       uint32_t slices);

/* Writer: pop a free page, make it WRITING for owner. -ENOSPC if none. */
int kvshm_page_alloc(struct kvshm_header *h, uint32_t owner, uint32_t ns_id,
		     uint32_t *page, uint32_t *gen);

/* Writer: the tenant row (struct kvshm_tenant) whose key space the block of
 * WRITING page `page` is in; kvshm_page_alloc leaves KVSHM_TENANT_NONE. Its
 * READY life counts in that tenant's page gauge. */
void kvshm_page_set_tenant(struct kvshm_header *h, uint32_t page, uint32_t tenant);

/* Writer: an announced page leaves flight (and the index) but stays
 * WRITING with its owner: nobody may wait for it any more. */
void kvshm_page_unannounce(struct kvshm_header *h, uint32_t page);

/* Writer: WRITING (owner, gen) -> FREE. -EINVAL if not so. */
int kvshm_page_free(struct kvshm_header *h, uint32_t page, uint32_t gen,
		    uint32_t owner);

/*
 * Writer: announce WRITING page (owner, gen) as the block `key` (child of
 * `parent`) in flight: write both, set flight and index the page under
 * key. Returns 0; 1 when not announced (key already in the index: in
 * flight elsewhere, cached or spilled; or no room in its probe window;
 * or the page is announced already); -EINVAL (not WRITING by owner at gen).
 */
int kvshm_page_announce(struct kvshm_header *h, uint32_t page, uint32_t gen,
			uint32_t owner, struct kvshm_key key, struct kvshm_key parent);

/*
 * Writer: WRITING (owner, gen) -> READY with this identity. A page
 * announced under another key gives that key up first. When the index
 * names a page in flight for `key` (this one, announced; or another
 * writer's, which loses the announcement and its entry, moved in place to
 * this page), the page is published. When the index already holds `key`
 * otherwise:
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

/*
 * Writer: take a page that must not be served again out of the index and
 * mark it unlisted, so that no lookup finds it by any path, though it
 * stays READY for readers that pinned it until the evictor frees it.
 * Returns 0 if its entry was removed, else nonzero (not indexed).
 */
int kvshm_page_unlist(struct kvshm_header *h, uint32_t page);

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

/*
 * The identity of a page entry equal to (key, parent, q)? Called only
 * between the two reads of a page's gen in kvshm_page_verify, so this is
 * the read side of a seqlock: the key, parent and tokens of a READY page
 * do not change while its gen stays the same, and a read that raced a
 * rewrite (the page freed and handed out again, gen bumped) is thrown
 * away by the gen re-check after the acquire fence. So they are read with
 * plain 16-byte vector loads (the Linux seqlock readers' plain reads),
 * a key or four tokens a load, all differences or'ed together and one
 * branch at the end; read one relaxed atomic at a time, the tokens were
 * a third of a lookup.
 */
typedef uint32_t kvshm_u32x4 __attribute__((vector_size(16), aligned(4), may_alias));

static inline bool kvshm_vec_zero(kvshm_u32x4 d)
{
#if defined(__SSE2__)
	/* One compare and mask, not four lane extractions. */
	return _mm_movemask_epi8(_mm_cmpeq_epi8((__m128i)d, _mm_setzero_si128())) == 0xffff;
#else
	return !(d[0] | d[1] | d[2] | d[3]);
#endif
}

static inline bool kvshm_ident_eq(const struct kvshm_page *p, const uint32_t *stored,
				  const struct kvshm_key *key, const struct kvshm_key *parent,
				  const uint32_t *q, uint32_t bt)
{
	kvshm_u32x4 d = (*(const kvshm_u32x4 *)&p->key ^ *(const kvshm_u32x4 *)key) |
			(*(const kvshm_u32x4 *)&p->parent ^ *(const kvshm_u32x4 *)parent);
	uint32_t i = 0, rest = 0;

	if (__builtin_expect(bt == 16, 1)) {
		/* The common block: four loads a side, unrolled. */
		const kvshm_u32x4 *s4 = (const kvshm_u32x4 *)stored, *q4 = (const kvshm_u32x4 *)q;

		d |= (s4[0] ^ q4[0]) | (s4[1] ^ q4[1]) | (s4[2] ^ q4[2]) | (s4[3] ^ q4[3]);
		return kvshm_vec_zero(d);
	}
	for (; i + 4 <= bt; i += 4)
		d |= *(const kvshm_u32x4 *)(stored + i) ^ *(const kvshm_u32x4 *)(q + i);
	for (; i < bt; i++)
		rest |= __atomic_load_n(&stored[i], __ATOMIC_RELAXED) ^ q[i];
	return !rest && kvshm_vec_zero(d);
}

/*
 * Reader: the body of a verify, between the caller's acquire read of page
 * entry p's gen (g) and its return: READY, listed, in namespace ns_id
 * with exactly this key, parent and tokens (the page's own at t, bt of
 * them), and gen still g after an acquire fence, so the identity read was
 * stable. kvshm_view_verify runs it right after reading g; a walk's pin
 * (kvshm_take_at, prefix.h) stores its slot in between, which makes these
 * loads the pin's re-check as well.
 */
static inline __attribute__((always_inline)) bool
kvshm_page_holds(const struct kvshm_page *p, const uint32_t *t, uint32_t g, uint32_t ns_id,
		 const struct kvshm_key *key, const struct kvshm_key *parent,
		 const uint32_t *tokens, uint32_t bt)
{
	if (atomic_load_explicit(&p->state, memory_order_acquire) != KVSHM_PAGE_READY ||
	    (__atomic_load_n(&p->ns_id, __ATOMIC_RELAXED) ^ ns_id) |
		    __atomic_load_n(&p->unlisted, __ATOMIC_RELAXED) ||
	    !kvshm_ident_eq(p, t, key, parent, tokens, bt))
		return false;
	/* Identity read under gen g: the caller's pin re-checks gen. */
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(&p->gen, memory_order_relaxed) == g;
}

/*
 * Reader (inline: the client's hot path): is `page` READY, listed, in
 * namespace ns_id with exactly this key, parent and tokens? On success
 * *gen is the generation under which it matched; the caller pins (page,
 * *gen) and the pin's re-check of state and gen guarantees the identity
 * read here was stable. kvshm_view_verify takes the header's fields from
 * a view, and the keys by address (a walk's request holds them).
 */
static inline __attribute__((always_inline)) bool
kvshm_view_verify(const struct kvshm_view *v, uint32_t page, uint32_t ns_id,
		  const struct kvshm_key *key, const struct kvshm_key *parent,
		  const uint32_t *tokens, uint32_t *gen)
{
	const struct kvshm_page *p;
	uint32_t g;

	if (page >= v->n_pages)
		return false;
	p = &v->pages[page];
	g = atomic_load_explicit(&p->gen, memory_order_acquire);
	if (!kvshm_page_holds(p, v->tokens + (uint64_t)page * v->bt, g, ns_id, key, parent,
			      tokens, v->bt))
		return false;
	*gen = g;
	return true;
}

static inline bool kvshm_page_verify(const struct kvshm_header *h, uint32_t page,
				     uint32_t ns_id, struct kvshm_key key,
				     struct kvshm_key parent, const uint32_t *tokens,
				     uint32_t *gen)
{
	struct kvshm_view v = kvshm_view(h);

	return kvshm_view_verify(&v, page, ns_id, &key, &parent, tokens, gen);
}

/*
 * Reader (inline, the client's lookup): is `page` (from kvshm_index_find)
 * announced in flight in namespace ns_id as exactly this key and parent,
 * by an owner other than `not_owner`, and not a page the caller itself
 * must help write? A caller that writes slice `slice` of pages of
 * `writers` slices (writers > 1; 0 otherwise) must not wait for a page of
 * that many slices whose slice `slice` nobody was granted yet: it is its
 * own to write (its kvc_alloc joins it). On success *owner is the writer's
 * owner id (client row owner - 1): wait on that row's flight word. The
 * tokens are not known until the publish; the waiter verifies them when
 * it pins the published page (kvshm_page_verify).
 */
static inline bool kvshm_page_inflight(const struct kvshm_header *h, uint32_t page,
				       uint32_t ns_id, struct kvshm_key key,
				       struct kvshm_key parent, uint32_t not_owner,
				       uint32_t writers, uint32_t slice, uint32_t *owner)
{
	const struct kvshm_page *p;
	uint32_t g, o;

	if (page >= h->geo.n_pages)
		return false;
	p = &kvshm_pages(h)[page];
	g = atomic_load_explicit(&p->gen, memory_order_acquire);
	if (!atomic_load_explicit(&p->flight, memory_order_acquire) ||
	    atomic_load_explicit(&p->state, memory_order_acquire) != KVSHM_PAGE_WRITING)
		return false;
	o = __atomic_load_n(&p->owner, __ATOMIC_RELAXED);
	if (!o || o == not_owner || o > h->geo.max_clients ||
	    __atomic_load_n(&p->ns_id, __ATOMIC_RELAXED) != ns_id ||
	    !kvshm_key_eq(kvshm_load_key(&p->key), key) ||
	    !kvshm_key_eq(kvshm_load_key(&p->parent), parent))
		return false;
	if (writers > 1 &&
	    atomic_load_explicit(&p->writers, memory_order_relaxed) == writers &&
	    !(atomic_load_explicit(&p->slices, memory_order_relaxed) >> slice & 1))
		return false;	/* ours to join, not to wait for */
	atomic_thread_fence(memory_order_acquire);
	if (atomic_load_explicit(&p->gen, memory_order_relaxed) != g ||
	    !atomic_load_explicit(&p->flight, memory_order_relaxed))
		return false;
	*owner = o;
	return true;
}

/* The futex word waiters of owner's announced pages sleep on. */
static inline _Atomic uint32_t *kvshm_flight_word(const struct kvshm_header *h,
						  uint32_t owner)
{
	return &kvshm_clients(h)[owner - 1].flight;
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
