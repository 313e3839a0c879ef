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
 * after it, still leave at least one side seeing the other. A client
 * registered for the daemon's membarrier (w->fence false; ledger.h) makes
 * no fence at all: the compiler keeps the stores before the loads, and
 * the daemon's barrier before each scan does the rest.
 */
#ifndef KVSHM_PREFIX_H
#define KVSHM_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "index.h"
#include "key.h"
#include "ledger.h"
#include "page.h"

#define KVSHM_AHEAD_BUCKET 32	/* blocks ahead whose bucket is prefetched */
#define KVSHM_AHEAD_PAGE 8	/* blocks ahead whose page is prefetched */
#define KVSHM_PIN_RUN 32	/* verified blocks pinned under one fence */
#define KVSHM_AHEAD_SEQ 32	/* pages ahead prefetched while guessing */
#define KVSHM_AHEAD_FIRST 8	/* buckets kvshm_walk_prefetch prefetches */
#define KVSHM_PEEK_AFTER 4	/* blocks hashed before block 0's bucket is read */

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
	bool fence;			/* a full fence per run of pins (false: the
					 * daemon's membarrier orders them) */
	bool ahead;			/* the run from block 0's page is already
					 * prefetched (kvshm_walk_keys) */
};

/* Prefetch the page entry and tokens of candidate loc (no fault if out of
 * range, or a spill slot: nothing is prefetched then). */
static inline __attribute__((always_inline)) void
kvshm_walk_prefetch_page(const struct kvshm_view *v, uint32_t loc)
{
	if (loc >= v->n_pages)
		return;
	__builtin_prefetch(&v->pages[loc], 0, 3);
	__builtin_prefetch(v->tokens + (uint64_t)loc * v->bt, 0, 3);
}

/*
 * Prefetch the page entries and tokens of a run of n blocks that would
 * start on page `first` (from block 0's bucket, read before the walk),
 * at most KVSHM_AHEAD_SEQ + 1 of them: where the walk will look first,
 * since a request's blocks are one run as a rule (kvshm_walk_pin), up to
 * where the walk's own prefetches take over (its block 1 prefetches the
 * page KVSHM_AHEAD_SEQ past its own). kvc_req_new calls it while it still
 * has blocks to hash, and its walk then makes no first prefetches of its
 * own (kvshm_walk.ahead).
 */
static inline __attribute__((always_inline)) void
kvshm_walk_prefetch_run(const struct kvshm_view *v, uint32_t first, size_t n)
{
	size_t k;

	for (k = 0; k < n && k <= KVSHM_AHEAD_SEQ; k++)
		kvshm_walk_prefetch_page(v, first + (uint32_t)k);
}

/*
 * Prefetch the home buckets of the first keys of a walk (engine-keyed
 * requests, whose blocks are not a chain the walk can guess along):
 * KVSHM_AHEAD_FIRST of them, so they are on their way while the engine
 * goes on to kvc_lookup.
 */
static inline __attribute__((always_inline)) void
kvshm_walk_prefetch(const struct kvshm_header *h, const struct kvshm_key *keys, size_t n)
{
	struct kvshm_view v = kvshm_view(h);
	size_t k;

	for (k = 0; k < n && k < KVSHM_AHEAD_FIRST; k++)
		kvshm_view_prefetch(&v, keys[k]);
}

/*
 * The key chain of a request of n blocks (tokens, bt a block) into keys,
 * with the first lines its walk reads on their way meanwhile: block 0's
 * key first, and its bucket prefetched (with millions of blocks cached it
 * is a cache and TLB miss); then the tokens copied into `copy` (unless
 * NULL) and KVSHM_PEEK_AFTER more blocks hashed, by which time the bucket
 * has arrived and names block 0's page: its entry and tokens, and those of
 * the pages after it, where the rest of the request is likely to sit, go
 * on their way (kvshm_walk_prefetch_run) while the rest of the chain is
 * hashed. A short request on a big cache then finds its first lines in
 * cache. kvc_req_new runs this; so does kvbench's flat mode.
 */
static inline void kvshm_walk_keys(const struct kvshm_header *h, struct kvshm_key root,
				   struct kvshm_key extra, const uint32_t *tokens, uint32_t *copy,
				   uint32_t bt, size_t n, struct kvshm_key *keys)
{
	struct kvshm_view v = kvshm_view(h);
	size_t m = n - 1 < KVSHM_PEEK_AFTER ? n - 1 : KVSHM_PEEK_AFTER;

	if (!n)
		return;
	kvshm_key_chain(root, root, extra, tokens, bt, bt, keys);
	kvshm_view_prefetch(&v, keys[0]);
	if (copy) {
		memcpy(copy, tokens, n * bt * sizeof(uint32_t));
		tokens = copy;
	}
	kvshm_key_chain(root, keys[0], extra, tokens + bt, m * bt, bt, keys + 1);
	if (m)
		kvshm_walk_prefetch_run(&v, kvshm_view_find(&v, keys[0]), n);
	if (n > m + 1)
		kvshm_key_chain(root, keys[m], extra, tokens + (m + 1) * bt, (n - m - 1) * bt, bt,
				keys + m + 1);
}

/*
 * Pin pages page[0..n) at gen[0..n) through slots slot[0..n) with one
 * fence (or, without `fence`, only the compiler's order: ledger.h);
 * returns how many leading ones are pinned (READY at their gen once the
 * slots are visible). The slots of the rest are cleared again.
 */
static inline size_t kvshm_pin_run_at(struct kvshm_ledger *l, const uint32_t *slot,
				      const struct kvshm_page *pages, const uint32_t *page,
				      const uint32_t *gen, size_t n, bool fence)
{
	size_t i, k;

	for (i = 0; i < n; i++)
		atomic_store_explicit(&l->slot[slot[i]], kvshm_slot_pack(page[i], gen[i]),
				      memory_order_relaxed);
	if (fence)
		atomic_thread_fence(memory_order_seq_cst);
	else
		atomic_signal_fence(memory_order_seq_cst);
	for (i = 0; i < n; i++)
		if (atomic_load_explicit(&pages[page[i]].state, memory_order_relaxed) !=
			    KVSHM_PAGE_READY ||
		    atomic_load_explicit(&pages[page[i]].gen, memory_order_relaxed) != gen[i])
			break;
	for (k = i; k < n; k++)
		atomic_store_explicit(&l->slot[slot[k]], 0, memory_order_release);
	return i;
}

static inline size_t kvshm_ledger_pin_run(struct kvshm_ledger *l, const uint32_t *slot,
					  const struct kvshm_header *h, const uint32_t *page,
					  const uint32_t *gen, size_t n)
{
	return kvshm_pin_run_at(l, slot, kvshm_pages(h), page, gen, n, true);
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
 *
 * The header's fields are read once, into a view; block 0 is found
 * before the loop, so that a short request costs one probe, one check,
 * one pin and little else.
 */
#define KVSHM_SEQ_AFTER 2

/* A walk's guessing state, as kvshm_walk_probe takes and leaves it. */
struct kvshm_walk_state {
	uint32_t cand[KVSHM_AHEAD_BUCKET];	/* the pipeline's candidates, by block */
	uint32_t streak;	/* blocks in a row on neighbouring pages */
	int32_t stride;		/* +1 or -1: the run's direction */
	bool guess;		/* the next block is guessed */
	bool ramp;		/* the first guess since the last probe */
};

/*
 * Block j of walk w when it is not guessed, or its guess failed (guessed):
 * its page from its bucket (read at once after a failed guess) or from
 * the pipeline; stores it in w->page[j] and, when it verifies, w->gen[j],
 * and returns whether it did. Decides whether the next block is guessed,
 * and primes the pipeline when it is not. Out of line: the walk's fast
 * loop, guesses that hold, stays small.
 */
static __attribute__((noinline)) bool kvshm_walk_probe(const struct kvshm_view *v,
						       const struct kvshm_walk *w,
						       struct kvshm_walk_state *s, size_t j,
						       const struct kvshm_key *parent, bool guessed)
{
	const struct kvshm_key *keys = w->keys;
	size_t n = w->n, k, top;
	bool piped = !guessed, ok;
	uint32_t pg;
	int32_t d;

	if (guessed) {
		/* Not the next page: this block's bucket at once. */
		pg = kvshm_view_find(v, keys[j]);
	} else {
		/* The pipeline, primed up to j + its distances. */
		k = j + KVSHM_AHEAD_BUCKET - 1;
		if (k < n)
			kvshm_view_prefetch(v, keys[k]);
		k = j + KVSHM_AHEAD_PAGE - 1;
		if (k < n) {
			s->cand[k % KVSHM_AHEAD_BUCKET] = kvshm_view_find(v, keys[k]);
			kvshm_walk_prefetch_page(v, s->cand[k % KVSHM_AHEAD_BUCKET]);
		}
		pg = s->cand[j % KVSHM_AHEAD_BUCKET];
	}
	w->page[j] = pg;
	ok = kvshm_view_verify(v, pg, w->ns_id, &keys[j], parent, w->tokens + j * v->bt,
			       &w->gen[j]);
	if (!ok)
		return false;
	/* The next block is guessed after a probe that found this one next
	 * to its parent's, and in the pipeline after KVSHM_SEQ_AFTER such
	 * blocks in a row. A run may go down as well as up (a free list
	 * refilled by an eviction in publish order). */
	d = (int32_t)(pg - w->page[j - 1]);
	if (d == 1 || d == -1) {
		s->streak = d == s->stride ? s->streak + 1 : 1;
		s->stride = d;
	} else {
		s->streak = 0;
	}
	s->guess = s->ramp = s->streak >= (piped ? KVSHM_SEQ_AFTER : 1);
	if (!s->guess && !piped) {
		/* Into the pipeline from the next block: buckets and
		 * candidates up to their distances. */
		top = j + KVSHM_AHEAD_BUCKET < n ? j + KVSHM_AHEAD_BUCKET : n;
		for (k = j + 1; k < top; k++)
			kvshm_view_prefetch(v, keys[k]);
		top = j + KVSHM_AHEAD_PAGE < n ? j + KVSHM_AHEAD_PAGE : n;
		for (k = j + 1; k < top; k++) {
			s->cand[k % KVSHM_AHEAD_BUCKET] = kvshm_view_find(v, keys[k]);
			kvshm_walk_prefetch_page(v, s->cand[k % KVSHM_AHEAD_BUCKET]);
		}
	}
	return true;
}

static inline size_t kvshm_walk_pin(const struct kvshm_header *h, struct kvshm_ledger *l,
				    const struct kvshm_walk *w, bool *missed)
{
	const struct kvshm_view v = kvshm_view(h);
	const struct kvshm_key *keys = w->keys, *parent = &w->parent;
	const uint32_t *tokens = w->tokens;
	uint32_t *wpage = w->page, *wgen = w->gen, pg, k, ns_id = w->ns_id, bt = v.bt;
	size_t n = w->n, i, j, run, end;
	bool guess = true, ramp = !w->ahead, flat = w->flat, stop = false;
	int32_t stride = 1;
	struct kvshm_walk_state s;

	*missed = false;
	if (!n)
		return 0;
	/* The first block: its bucket, which kvc_req_new prefetched. Its
	 * successor is guessed at once (a request's blocks are one run as a
	 * rule). The guessing state lives in locals: only a probe, out of
	 * line, sees it in s. */
	pg = kvshm_view_find(&v, keys[0]);
	wpage[0] = pg;
	if (!kvshm_view_verify(&v, pg, ns_id, &keys[0], parent, tokens, &wgen[0])) {
		*missed = true;
		return 0;
	}
	if (n == 1) {
		/* A one-block request: its pin and its access, nothing of
		 * the loop's set-up (2 of its 23 ns). */
		if (!kvshm_pin_run_at(l, w->slot, v.pages, wpage, wgen, 1, w->fence))
			return 0;
		kvshm_ledger_touch_run(l, wpage, 1);
		return 1;
	}
	s.streak = 1;
	for (i = 0, j = 1; i < n; i = end) {
		end = i + KVSHM_PIN_RUN < n ? i + KVSHM_PIN_RUN : n;
		for (; j < end; j++) {
			bool guessed = guess;

			if (!flat)
				parent = &keys[j - 1];
			if (guessed) {
				pg = wpage[j - 1] + (uint32_t)stride;
				wpage[j] = pg;
				if (kvshm_view_verify(&v, pg, ns_id, &keys[j], parent,
						      tokens + j * bt, &wgen[j])) {
					/* Pages ahead on their way, as far as the
					 * request goes: after the first guess that
					 * held, the whole distance at once. */
					if (__builtin_expect(ramp, 0)) {
						for (k = 1; k <= KVSHM_AHEAD_SEQ && j + k < n; k++)
							kvshm_walk_prefetch_page(
								&v, pg + (uint32_t)((int32_t)k * stride));
						ramp = false;
					} else if (j + KVSHM_AHEAD_SEQ < n) {
						kvshm_walk_prefetch_page(
							&v, pg + (uint32_t)(KVSHM_AHEAD_SEQ * stride));
					}
					continue;
				}
			}
			s.stride = stride;
			if (!kvshm_walk_probe(&v, w, &s, j, parent, guessed)) {
				stop = true;
				break;
			}
			stride = s.stride;
			guess = s.guess;
			ramp = s.ramp;
		}
		run = kvshm_pin_run_at(l, w->slot + i, v.pages, wpage + i, wgen + i, j - i,
				       w->fence);
		if (run < j - i) {
			/* Lost to the evictor: a pin failure (*missed stays
			 * false). */
			kvshm_ledger_touch_run(l, wpage, i + run);
			return i + run;
		}
		if (stop) {
			*missed = true;
			kvshm_ledger_touch_run(l, wpage, j);
			return j;
		}
	}
	kvshm_ledger_touch_run(l, wpage, n);
	return n;
}

#endif
