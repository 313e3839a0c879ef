/* SPDX-License-Identifier: MIT */
/*
 * prefix.h - the verified, pinned prefix walk: the reader side of the
 * index, the page table and the ledger put together, as a client's lookup
 * runs it (libclient/lookup.c) and as kvbench's flat mode times it on a
 * segment of millions of blocks.
 *
 * A block's page is found one of two ways. Through the index, a block
 * costs three lines nobody else's lookup shares: the key's index bucket,
 * its page entry and its tokens; with millions of blocks cached each is a
 * cache (and TLB) miss, so that path is a software pipeline over the
 * request's keys, which kvc_req_new computed up front:
 *
 *   block j + KVSHM_AHEAD_BUCKET   its home bucket is prefetched;
 *   block j + KVSHM_AHEAD_PAGE     its bucket is read (the candidate page
 *                                  kept) and the candidate's page entry
 *                                  and tokens are prefetched;
 *   block j                        verified (kvshm_page_verify).
 *
 * But the blocks of one request are allocated together, and the free
 * list hands out runs of consecutive pages, so most blocks sit on the
 * page after their parent's. The walk guesses that page and verifies it:
 * no bucket, and the page entries and tokens of a run are consecutive
 * lines, prefetched KVSHM_AHEAD_SEQ pages ahead. This is what keeps a
 * lookup's cost flat in the number of blocks cached (kvbench --mode scale
 * and flat, docs/BENCHMARKS.md). See kvshm_walk_pin for when it guesses.
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
#define KVSHM_AHEAD_SEQ 32	/* pages ahead prefetched while guessing */
#define KVSHM_AHEAD_FIRST 8	/* buckets kvshm_walk_prefetch prefetches */

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
 * range, or a spill slot: nothing is prefetched then). */
static inline void kvshm_walk_prefetch_page(const struct kvshm_header *h, uint32_t loc)
{
	if (loc >= h->geo.n_pages)
		return;
	__builtin_prefetch(&kvshm_pages(h)[loc], 0, 3);
	__builtin_prefetch(kvshm_tokens(h, loc), 0, 3);
}

/*
 * Prefetch the home buckets of the first keys of a walk, so they are on
 * their way while the engine goes on to kvc_lookup (kvc_req_new prefetches
 * block 0's bucket on its own, before hashing the rest, and this for the
 * keys after it). The walk reads block 0's bucket and, when block 1 is not
 * on the page after block 0's, block 1's and the pipeline's first ones:
 * KVSHM_AHEAD_FIRST of them, not a whole pipeline's worth, since most
 * requests then guess the rest and never read those buckets.
 */
static inline void kvshm_walk_prefetch(const struct kvshm_header *h, const struct kvshm_key *keys,
				       size_t n)
{
	size_t k;

	for (k = 0; k < n && k < KVSHM_AHEAD_FIRST; k++)
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
 * failure). The pinned run is noted in the ledger's access ring, deepest
 * block first (kvshm_ledger_touch_run), once, when the walk ends.
 *
 * When it guesses: block 0 comes from the index; block 1 is guessed on the
 * page after block 0's (a request's blocks are one run as a rule); a
 * guess that does not verify costs that block's bucket, read at once;
 * when that bucket names the page on the other side of the parent's, the
 * run goes down and the walk guesses downwards, else the pipeline is
 * primed from the next block, and the walk guesses again once
 * KVSHM_SEQ_AFTER blocks in a row came from neighbouring pages. A
 * guessed page is exactly as good as an indexed one: kvshm_page_verify
 * checks the same identity, and a READY page that left the index is
 * `unlisted`, which verify refuses.
 */
#define KVSHM_SEQ_AFTER 2

static inline size_t kvshm_walk_pin(const struct kvshm_header *h, struct kvshm_ledger *l,
				    const struct kvshm_walk *w, bool *missed)
{
	uint32_t cand[KVSHM_AHEAD_BUCKET], bt = h->geo.block_tokens, pg, streak = 0;
	int32_t stride = 1;	/* +1 or -1: the run's direction */
	struct kvshm_key parent = w->parent;
	size_t n = w->n, i, j, k, run, end, top;
	bool guess = false, ramp = false, ok;

	*missed = false;
	for (i = 0; i < n; i = end) {
		end = i + KVSHM_PIN_RUN < n ? i + KVSHM_PIN_RUN : n;
		for (j = i; j < end; j++) {
			bool guessed = guess, piped = false;

			if (guess) {
				pg = w->page[j - 1] + (uint32_t)stride;
			} else if (!j) {
				/* The first block: its bucket, which kvc_req_new
				 * prefetched. */
				pg = kvshm_index_find(h, w->keys[0]);
			} else {
				/* The pipeline, primed up to j + its distances. */
				k = j + KVSHM_AHEAD_BUCKET - 1;
				if (k < n)
					kvshm_index_prefetch(h, w->keys[k]);
				k = j + KVSHM_AHEAD_PAGE - 1;
				if (k < n) {
					cand[k % KVSHM_AHEAD_BUCKET] = kvshm_index_find(h, w->keys[k]);
					kvshm_walk_prefetch_page(h, cand[k % KVSHM_AHEAD_BUCKET]);
				}
				pg = cand[j % KVSHM_AHEAD_BUCKET];
				piped = true;
			}
			for (;;) {
				ok = kvshm_page_verify(h, pg, w->ns_id, w->keys[j], parent,
						       w->tokens + j * bt, &w->gen[j]);
				if (ok || !guessed)
					break;
				/* Not the next page: this block's bucket at once. */
				guessed = guess = false;
				pg = kvshm_index_find(h, w->keys[j]);
			}
			if (ok && guess) {
				/* Pages ahead on their way: after the first
				 * guess that held, the whole distance at once. */
				for (k = ramp ? 1 : KVSHM_AHEAD_SEQ; k <= KVSHM_AHEAD_SEQ; k++)
					kvshm_walk_prefetch_page(h, pg + (uint32_t)((int32_t)k * stride));
				ramp = false;
			} else if (ok) {
				/* The first block's successor is guessed at once
				 * (a request's blocks are one run as a rule), a
				 * block's after a probe that found it next to its
				 * parent's, and in the pipeline after
				 * KVSHM_SEQ_AFTER such blocks in a row. A run may
				 * go down as well as up (a free list refilled
				 * by an eviction in publish order). */
				int32_t d = j ? (int32_t)(pg - w->page[j - 1]) : 1;

				if (d == 1 || d == -1) {
					streak = j && d == stride ? streak + 1 : 1;
					stride = d;
				} else {
					streak = 0;
				}
				guess = ramp = streak >= (piped ? KVSHM_SEQ_AFTER : 1);
				if (!guess && !piped) {
					/* Into the pipeline from the next block:
					 * buckets and candidates up to their
					 * distances. */
					top = j + KVSHM_AHEAD_BUCKET < n ? j + KVSHM_AHEAD_BUCKET : n;
					for (k = j + 1; k < top; k++)
						kvshm_index_prefetch(h, w->keys[k]);
					top = j + KVSHM_AHEAD_PAGE < n ? j + KVSHM_AHEAD_PAGE : n;
					for (k = j + 1; k < top; k++) {
						cand[k % KVSHM_AHEAD_BUCKET] =
							kvshm_index_find(h, w->keys[k]);
						kvshm_walk_prefetch_page(h, cand[k % KVSHM_AHEAD_BUCKET]);
					}
				}
			}
			w->page[j] = pg;
			if (!ok) {
				*missed = true;
				break;
			}
			if (!w->flat)
				parent = w->keys[j];
		}
		run = kvshm_ledger_pin_run(l, w->slot + i, h, w->page + i, w->gen + i, j - i);
		if (run < j - i) {
			*missed = false;	/* lost to the evictor: a pin failure */
			kvshm_ledger_touch_run(l, w->page, i + run);
			return i + run;
		}
		if (*missed) {
			kvshm_ledger_touch_run(l, w->page, j);
			return j;
		}
	}
	kvshm_ledger_touch_run(l, w->page, n);
	return n;
}

#endif
