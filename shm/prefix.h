/* SPDX-License-Identifier: MIT */
/*
 * prefix.h - the verified, pinned prefix walk: the reader side of the
 * index, the page table and the ledger put together, as a client's lookup
 * runs it (libclient/lookup.c) and as kvbench's flat mode times it on a
 * segment of millions of blocks.
 *
 * Per block the walk reads three lines nobody else's lookup shares: the
 * key's index bucket, its page entry and its tokens. With millions of
 * blocks cached each is a cache (and TLB) miss, so the walk is a software
 * pipeline over the request's keys, which kvc_req_new computed up front:
 *
 *   block j + KVSHM_AHEAD_BUCKET   its home bucket is prefetched;
 *   block j + KVSHM_AHEAD_PAGE     its bucket is read (the candidate page
 *                                  kept) and the candidate's page entry
 *                                  and tokens are prefetched;
 *   block j                        verified (kvshm_page_verify).
 *
 * Pins go by runs of up to KVSHM_PIN_RUN verified blocks: each block's
 * ledger slot is stored (relaxed), then one seq_cst fence, then every
 * page's state and gen are re-checked. That is the Dekker handshake of
 * ledger.h with one fence per run instead of one seq_cst store per block:
 * the evictor's seq_cst EVICTING store and seq_cst slot loads, against
 * the client's slot stores sequenced before the fence and its state loads
 * after it, still leave at least one side seeing the other.
 */
#ifndef KVSHM_PREFIX_H
#define KVSHM_PREFIX_H

#include <stdbool.h>
#include <stddef.h>

#include "index.h"
#include "ledger.h"
#include "page.h"

#define KVSHM_AHEAD_BUCKET 32	/* blocks ahead whose bucket is prefetched */
#define KVSHM_AHEAD_PAGE 8	/* blocks ahead whose page is prefetched */
#define KVSHM_PIN_RUN 32	/* verified blocks pinned under one fence */

_Static_assert(KVSHM_AHEAD_PAGE < KVSHM_AHEAD_BUCKET, "buckets are read after their prefetch");
_Static_assert((KVSHM_AHEAD_BUCKET & (KVSHM_AHEAD_BUCKET - 1)) == 0, "candidate ring size");

/* What one walk is given and fills. */
struct kvshm_walk {
	const struct kvshm_key *keys;	/* n block keys */
	const uint32_t *tokens;		/* n x block_tokens */
	const uint32_t *slot;		/* n ledger slots the pins go through */
	uint32_t *page, *gen;		/* out: n, valid for the pinned prefix */
	size_t n;
	uint32_t ns_id;
	struct kvshm_key parent;	/* the parent of keys[0] */
	bool flat;			/* every block's parent is `parent` (engine-
					 * keyed requests: blocks not chained) */
};

/* Prefetch the page entry and tokens of candidate loc (no fault if out of
 * range: nothing is prefetched then). */
static inline void kvshm_walk_prefetch_page(const struct kvshm_header *h, uint32_t loc)
{
	if (loc >= h->geo.n_pages)
		return;
	__builtin_prefetch(&kvshm_pages(h)[loc], 0, 3);
	__builtin_prefetch(kvshm_tokens(h, loc), 0, 3);
}

/*
 * Prefetch the home buckets of the first keys of a walk (as many as the
 * walk itself keeps ahead). kvc_req_new calls it as soon as it has the
 * key chain, so the buckets are on their way while the engine goes on to
 * kvc_lookup, instead of the walk's first blocks waiting for them.
 */
static inline void kvshm_walk_prefetch(const struct kvshm_header *h, const struct kvshm_key *keys,
				       size_t n)
{
	size_t k;

	for (k = 0; k < n && k < KVSHM_AHEAD_BUCKET; k++)
		kvshm_index_prefetch(h, keys[k]);
}

/*
 * Pin pages page[0..n) at gen[0..n) through slots slot[0..n) with one
 * fence; returns how many leading ones are pinned (READY at their gen once
 * the slots are visible). The slots of the rest are cleared again.
 */
static inline size_t kvshm_ledger_pin_run(struct kvshm_ledger *l, const uint32_t *slot,
					  const struct kvshm_header *h, const uint32_t *page,
					  const uint32_t *gen, size_t n)
{
	const struct kvshm_page *pages = kvshm_pages(h);
	size_t i, k;

	for (i = 0; i < n; i++)
		atomic_store_explicit(&l->slot[slot[i]], kvshm_slot_pack(page[i], gen[i]),
				      memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	for (i = 0; i < n; i++)
		if (atomic_load_explicit(&pages[page[i]].state, memory_order_relaxed) !=
			    KVSHM_PAGE_READY ||
		    atomic_load_explicit(&pages[page[i]].gen, memory_order_relaxed) != gen[i])
			break;
	for (k = i; k < n; k++)
		atomic_store_explicit(&l->slot[slot[k]], 0, memory_order_release);
	return i;
}

/*
 * Walk w: the longest prefix of READY pages that verify (key, parent,
 * tokens, namespace), pinned. Returns its length; *missed says whether the
 * walk stopped on a block that did not verify (false: all n pinned, or a
 * pin lost a race with the evictor, counted by the caller as a pin
 * failure). Every pinned page is noted in the ledger's access ring.
 */
static inline size_t kvshm_walk_pin(const struct kvshm_header *h, struct kvshm_ledger *l,
				    const struct kvshm_walk *w, bool *missed)
{
	uint32_t cand[KVSHM_AHEAD_BUCKET], bt = h->geo.block_tokens;
	struct kvshm_key parent = w->parent;
	size_t n = w->n, i, j, k, run, end;

	*missed = false;
	for (k = 0; k < n && k < KVSHM_AHEAD_BUCKET; k++)
		kvshm_index_prefetch(h, w->keys[k]);
	for (k = 0; k < n && k < KVSHM_AHEAD_PAGE; k++) {
		cand[k] = kvshm_index_find(h, w->keys[k]);
		kvshm_walk_prefetch_page(h, cand[k]);
	}
	for (i = 0; i < n; i = end) {
		end = i + KVSHM_PIN_RUN < n ? i + KVSHM_PIN_RUN : n;
		for (j = i; j < end; j++) {
			k = j + KVSHM_AHEAD_BUCKET;
			if (k < n)
				kvshm_index_prefetch(h, w->keys[k]);
			k = j + KVSHM_AHEAD_PAGE;
			if (k < n) {
				cand[k % KVSHM_AHEAD_BUCKET] = kvshm_index_find(h, w->keys[k]);
				kvshm_walk_prefetch_page(h, cand[k % KVSHM_AHEAD_BUCKET]);
			}
			w->page[j] = cand[j % KVSHM_AHEAD_BUCKET];
			if (w->page[j] == UINT32_MAX ||
			    !kvshm_page_verify(h, w->page[j], w->ns_id, w->keys[j], parent,
					       w->tokens + j * bt, &w->gen[j])) {
				*missed = true;
				break;
			}
			if (!w->flat)
				parent = w->keys[j];
		}
		run = kvshm_ledger_pin_run(l, w->slot + i, h, w->page + i, w->gen + i, j - i);
		kvshm_ledger_touch_run(l, w->page + i, run);
		if (run < j - i) {
			*missed = false;	/* lost to the evictor: a pin failure */
			return i + run;
		}
		if (*missed)
			return j;
	}
	return n;
}

#endif
