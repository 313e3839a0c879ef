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
 * A block is pinned as it is verified (kvshm_take_at): its page's gen is
 * read, its ledger slot stored (relaxed) naming that page and gen, and
 * only then are its state and identity read and its gen read again. That is
 * the Dekker handshake of ledger.h (the client's slot store before its
 * state load, against the evictor's EVICTING store before its slot
 * scan) with the verify's own loads as the pin's re-check. A client
 * registered for the daemon's membarrier (w->fence false; ledger.h)
 * needs no more than the compiler's order there: the daemon's barrier
 * before each scan does the rest. A client without it (w->fence) makes
 * one seq_cst fence per run of up to KVSHM_PIN_RUN blocks and checks the
 * run's pages again after it (kvshm_pin_check): the evictor's seq_cst
 * EVICTING store and slot loads, against the client's slot stores
 * before the fence and its state loads after it, still leave at least
 * one side seeing the other.
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
#define KVSHM_AHEAD_SEQ 64	/* pages ahead prefetched while guessing */
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
static inline void kvshm_view_walk_keys(const struct kvshm_view *v, struct kvshm_key root,
					struct kvshm_key extra, const uint32_t *tokens,
					uint32_t *copy, uint32_t bt, size_t n,
					struct kvshm_key *keys)
{
	size_t m = n - 1 < KVSHM_PEEK_AFTER ? n - 1 : KVSHM_PEEK_AFTER;

	if (!n)
		return;
	kvshm_key_chain(root, root, extra, tokens, bt, bt, keys);
	kvshm_view_prefetch(v, keys[0]);
	if (copy) {
		memcpy(copy, tokens, n * bt * sizeof(uint32_t));
		tokens = copy;
	}
	if (m) {
		kvshm_key_chain(root, keys[0], extra, tokens + bt, m * bt, bt, keys + 1);
		kvshm_walk_prefetch_run(v, kvshm_view_find(v, keys[0]), n);
	}
	if (n > m + 1)
		kvshm_key_chain(root, keys[m], extra, tokens + (m + 1) * bt, (n - m - 1) * bt, bt,
				keys + m + 1);
}

/* The same on header h's view (kvbench's flat mode). */
static inline void kvshm_walk_keys(const struct kvshm_header *h, struct kvshm_key root,
				   struct kvshm_key extra, const uint32_t *tokens, uint32_t *copy,
				   uint32_t bt, size_t n, struct kvshm_key *keys)
{
	struct kvshm_view v = kvshm_view(h);

	kvshm_view_walk_keys(&v, root, extra, tokens, copy, bt, n, keys);
}

/*
 * The second half of a pin (slots already stored): one fence (or, without
 * `fence`, only the compiler's order: ledger.h), then pages page[0..n)
 * re-checked READY at gen[0..n). Returns how many leading ones are
 * pinned; the slots of the rest are cleared again.
 */
static inline size_t kvshm_pin_check(struct kvshm_ledger *l, const uint32_t *slot,
				     const struct kvshm_page *pages, const uint32_t *page,
				     const uint32_t *gen, size_t n, bool fence)
{
	size_t i, k;

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

/*
 * Pin pages page[0..n) at gen[0..n) through slots slot[0..n): every slot
 * stored (relaxed), then kvshm_pin_check. Returns how many leading ones
 * are pinned.
 */
static inline size_t kvshm_pin_run_at(struct kvshm_ledger *l, const uint32_t *slot,
				      const struct kvshm_page *pages, const uint32_t *page,
				      const uint32_t *gen, size_t n, bool fence)
{
	size_t i;

	for (i = 0; i < n; i++)
		atomic_store_explicit(&l->slot[slot[i]], kvshm_slot_pack(page[i], gen[i]),
				      memory_order_relaxed);
	return kvshm_pin_check(l, slot, pages, page, gen, n, fence);
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
 * The header's fields are read once, into a view (kvc_open keeps one in
 * the handle: kvshm_view_walk_pin); block 0 is found inline, before the
 * loop (kvshm_walk_on, out of line), so that a short request costs one
 * probe, one check, one pin and little else, and no call.
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

/*
 * Block `key` on page entry p (page pg, its tokens at t, bt of them),
 * verified and pinned in one pass: its gen read, slot `slot` stored naming
 * (pg, gen), then, in the compiler's order, kvshm_page_holds: the
 * verify's seqlock read with the pin's store inside it, so the state and
 * gen loads a pin makes after its store (ledger.h) are the verify's own.
 * Returns whether the block held; its slot is cleared when not. A walk
 * with `fence` checks its pins again after one fence per run
 * (kvshm_pin_check): for it, these checks are a first look.
 */
static inline __attribute__((always_inline)) bool
kvshm_take_at(struct kvshm_ledger *l, uint32_t slot, const struct kvshm_page *p,
	      const uint32_t *t, uint32_t pg, uint32_t ns_id, const struct kvshm_key *key,
	      const struct kvshm_key *parent, const uint32_t *tokens, uint32_t bt, uint32_t *gen)
{
	uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);

	atomic_store_explicit(&l->slot[slot], kvshm_slot_pack(pg, g), memory_order_relaxed);
	atomic_signal_fence(memory_order_seq_cst);
	if (kvshm_page_holds(p, t, g, ns_id, key, parent, tokens, bt)) {
		*gen = g;
		return true;
	}
	atomic_store_explicit(&l->slot[slot], 0, memory_order_release);
	return false;
}

/* kvshm_take_at for page pg of view v, false when out of range. */
static inline __attribute__((always_inline)) bool
kvshm_walk_take(const struct kvshm_view *v, struct kvshm_ledger *l, uint32_t slot, uint32_t pg,
		uint32_t ns_id, const struct kvshm_key *key, const struct kvshm_key *parent,
		const uint32_t *tokens, uint32_t *gen)
{
	if (pg >= v->n_pages)
		return false;
	return kvshm_take_at(l, slot, &v->pages[pg], v->tokens + (uint64_t)pg * v->bt, pg, ns_id,
			     key, parent, tokens, v->bt, gen);
}

/*
 * The walk's fast path: blocks j.. of w guessed on the pages one stride
 * past their parent's, taken (kvshm_take_at) while they hold, up to `end`
 * or the end of the pool, those at least KVSHM_AHEAD_SEQ short of the
 * request's end prefetching the page KVSHM_AHEAD_SEQ strides on (a hint:
 * an address past the pool faults nothing). Returns the first block that
 * did not hold, or `end`.
 *
 * Out of line, stepping pointers, and compiled twice: for the common walk
 * (blocks of 16 tokens, pages going up), where stride and block size are
 * constants, and for any other. Inlined into kvshm_walk_pin, whose probe
 * calls keep a score of values live, GCC kept half of this loop's on the
 * stack.
 */
static inline __attribute__((always_inline)) size_t
kvshm_walk_seq_at(const struct kvshm_view *v, struct kvshm_ledger *l, const struct kvshm_walk *w,
		  size_t j, size_t end, int32_t stride, uint32_t bt)
{
	const uint32_t ns_id = w->ns_id, *slot = w->slot;
	const uint32_t *q = w->tokens + j * bt;
	const struct kvshm_key *key = &w->keys[j], *parent = w->flat ? &w->parent : key - 1;
	const ptrdiff_t pstep = w->flat ? 0 : 1;
	uint32_t pg = w->page[j - 1], *wpage = w->page, *wgen = w->gen;
	const struct kvshm_page *p = &v->pages[pg];
	const uint32_t *t = v->tokens + (uint64_t)pg * bt;
	size_t room = stride > 0 ? v->n_pages - 1 - pg : pg, pre;

	/* Pages past the pool's end are not guessed (the caller probes). */
	if (room < end - j)
		end = j + room;
	/* The blocks that prefetch: those KVSHM_AHEAD_SEQ short of n. */
	pre = w->n > KVSHM_AHEAD_SEQ ? w->n - KVSHM_AHEAD_SEQ : 0;
	for (; j < end; j++, key++, parent += pstep, q += bt) {
		pg += (uint32_t)stride;
		p += stride;
		t += (ptrdiff_t)stride * bt;
		wpage[j] = pg;
		if (!kvshm_take_at(l, slot[j], p, t, pg, ns_id, key, parent, q, bt, &wgen[j]))
			break;
		if (j < pre) {
			__builtin_prefetch(p + KVSHM_AHEAD_SEQ * stride, 0, 3);
			__builtin_prefetch(t + (ptrdiff_t)KVSHM_AHEAD_SEQ * stride * bt, 0, 3);
		}
	}
	return j;
}

static __attribute__((noinline)) size_t
kvshm_walk_seq_up16(const struct kvshm_view *v, struct kvshm_ledger *l,
		    const struct kvshm_walk *w, size_t j, size_t end)
{
	return kvshm_walk_seq_at(v, l, w, j, end, 1, 16);
}

static __attribute__((noinline)) size_t
kvshm_walk_seq_any(const struct kvshm_view *v, struct kvshm_ledger *l,
		   const struct kvshm_walk *w, size_t j, size_t end, int32_t stride)
{
	return kvshm_walk_seq_at(v, l, w, j, end, stride, v->bt);
}

static inline size_t kvshm_walk_seq(const struct kvshm_view *v, struct kvshm_ledger *l,
				    const struct kvshm_walk *w, size_t j, size_t end,
				    int32_t stride)
{
	if (stride == 1 && v->bt == 16)
		return kvshm_walk_seq_up16(v, l, w, j, end);
	return kvshm_walk_seq_any(v, l, w, j, end, stride);
}

/*
 * kvshm_walk_pin's blocks 1.. (block 0 pinned on page wpage[0]): out of
 * line, so that a one-block walk is its caller's code alone.
 */
static __attribute__((noinline)) size_t
kvshm_walk_on(const struct kvshm_view *vp, struct kvshm_ledger *l, const struct kvshm_walk *w,
	      bool *missed)
{
	const struct kvshm_view v = *vp;
	const struct kvshm_key *keys = w->keys, *parent = &w->parent;
	const uint32_t *slot = w->slot;
	uint32_t *wpage = w->page, *wgen = w->gen, k;
	size_t n = w->n, i, j, run, end;
	bool guess = true, ramp = !w->ahead, fence = w->fence, stop = false;
	bool seq = true;	/* every block so far a guess that held, one way */
	int32_t stride = 1;
	struct kvshm_walk_state s;

	s.streak = 1;
	/* Runs of KVSHM_PIN_RUN under one fence each; with no fence, one. */
	for (i = 0, j = 1; i < n; i = end) {
		end = fence && i + KVSHM_PIN_RUN < n ? i + KVSHM_PIN_RUN : n;
		while (j < end) {
			bool guessed = guess;

			if (guessed) {
				/* Pages ahead on their way, as far as the
				 * request goes, when the guessing (re)starts:
				 * the whole distance at once. */
				if (__builtin_expect(ramp, 0)) {
					for (k = 0; k <= KVSHM_AHEAD_SEQ && j + k < n; k++)
						kvshm_walk_prefetch_page(
							&v, wpage[j - 1] +
								    (uint32_t)((int32_t)(k + 1) * stride));
					ramp = false;
				}
				j = kvshm_walk_seq(&v, l, w, j, end, stride);
				if (j == end)
					break;
			}
			seq = false;
			if (!w->flat)
				parent = &keys[j - 1];
			s.stride = stride;
			if (!kvshm_walk_probe(&v, w, &s, j, parent, guessed)) {
				stop = true;
				break;
			}
			/* Verified before its slot was stored: pinned now. */
			if (!kvshm_pin_run_at(l, slot + j, v.pages, wpage + j, wgen + j, 1, false))
				break;
			stride = s.stride;
			guess = s.guess;
			ramp = s.ramp;
			j++;
		}
		run = j - i;
		if (fence)
			run = kvshm_pin_check(l, slot + i, v.pages, wpage + i, wgen + i, run, true);
		if (run < end - i && !stop) {
			/* Lost to the evictor: a pin failure (*missed stays
			 * false). */
			kvshm_ledger_touch_run(l, wpage, i + run);
			return i + run;
		}
		if (stop) {
			*missed = run == j - i;
			kvshm_ledger_touch_run(l, wpage, i + run);
			return i + run;
		}
	}
	if (seq)
		kvshm_ledger_touch_seq(l, wpage[0], n, stride);
	else
		kvshm_ledger_touch_run(l, wpage, n);
	return n;
}

/* The walk on view v (the header's fields read once, by the caller or
 * kvshm_walk_pin). Block 0 here: its bucket, which kvc_req_new
 * prefetched; a one-block walk ends here too. */
static inline __attribute__((always_inline)) size_t
kvshm_view_walk_pin(const struct kvshm_view *v, struct kvshm_ledger *l, const struct kvshm_walk *w,
		    bool *missed)
{
	uint32_t pg;

	*missed = false;
	if (!w->n)
		return 0;
	pg = kvshm_view_find(v, w->keys[0]);
	w->page[0] = pg;
	if (!kvshm_walk_take(v, l, w->slot[0], pg, w->ns_id, &w->keys[0], &w->parent, w->tokens,
			     &w->gen[0])) {
		*missed = true;
		return 0;
	}
	if (w->n > 1)
		return kvshm_walk_on(v, l, w, missed);
	/* A one-block request: nothing of the loop's set-up. */
	if (w->fence && !kvshm_pin_check(l, w->slot, v->pages, w->page, w->gen, 1, true))
		return 0;
	kvshm_ledger_touch(l, pg);
	return 1;
}

static inline size_t kvshm_walk_pin(const struct kvshm_header *h, struct kvshm_ledger *l,
				    const struct kvshm_walk *w, bool *missed)
{
	const struct kvshm_view v = kvshm_view(h);

	return kvshm_view_walk_pin(&v, l, w, missed);
}

#endif
