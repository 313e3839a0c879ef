/* SPDX-License-Identifier: MIT */
/*
 * floor.h - kvbench's floor of a verified lookup: what kvc_lookup must do
 * for a request that is all hits, and nothing else, in one straight
 * function, from the same shm/ helpers. The lookup mode times it on the
 * same prepared requests as kvc_lookup, so that its rows say how far the
 * library is from what its design allows, and the design from the
 * in-process table (docs/BENCHMARKS.md, "The floor of a verified lookup").
 *
 * What it keeps, because a cross-process lookup cannot go without it:
 *   - the handle's checks (fork, dead) and the request's stage;
 *   - the thread's record, its pin slots (one per block) and counter row;
 *   - block 0's bucket and, for every block, the page's gen, its slot
 *     stored naming (page, gen), state, namespace, listed, key, parent,
 *     tokens and gen again (kvshm_take_at), and one fence and re-check
 *     when the daemon does not order pins with membarrier;
 *   - the request's pages, gens, slots and state bytes (kvc_req_free
 *     and kvc_load read them);
 *   - the access ring (eviction), the hit record (top prefixes) and the
 *     counters (lookups, tokens, hits, hit tokens, pins held).
 * What it leaves out: every case but a hit on one run of pages going up
 * (a miss, a request on scattered pages, a walk down, a short slot cache,
 * a shared counter row), which it hands to kvc_lookup, undone first.
 * Private to kvbench: it reads the library's internals (client_int.h).
 */
#ifndef KVBENCH_FLOOR_H
#define KVBENCH_FLOOR_H

#include "../../libclient/client_int.h"
#include "../../shm/index.h"
#include "../../shm/page.h"
#include "../../shm/prefix.h"

/* Requests the floor handed to kvc_lookup (not its case), per process. */
static uint64_t floor_fallbacks;

/* Pins 0..pinned of r dropped and its n slots given back: r as it was. */
static void floor_undo(kvc_t *c, struct kvci_thr *t, struct kvc_req *r, size_t pinned,
		       size_t n)
{
	size_t k;

	for (k = 0; k < pinned; k++)
		atomic_store_explicit(&c->ledger->slot[r->slot[k]], 0, memory_order_release);
	kvci_slots_give(c, t, r->slot, (uint32_t)n);
	for (k = 0; k < n; k++)
		r->slot[k] = UINT32_MAX;
}

static int floor_fallback(kvc_t *c, struct kvci_thr *t, struct kvc_req *r, size_t pinned,
			  size_t taken)
{
	if (taken)
		floor_undo(c, t, r, pinned, taken);
	floor_fallbacks++;
	return kvc_lookup(r);
}

static __attribute__((noinline)) int floor_lookup(struct kvc_req *r)
{
	kvc_t *c = r->c;
	const struct kvshm_view *v = &c->view;
	struct kvshm_ledger *l = c->ledger;
	struct kvci_thr *t;
	struct kvshm_ctr *row;
	struct kvshm_walk w;
	size_t n = r->n, j;
	uint32_t pg;

	if (r->stage != 0 || kvc_usable(c) || !n)
		return floor_fallback(c, NULL, r, 0, 0);
	t = kvci_thr(c);
	if (!t || !t->row)
		return floor_fallback(c, t, r, 0, 0);
	j = kvci_slots_take(c, t, r->slot, (uint32_t)n);
	if (j < n)
		return floor_fallback(c, t, r, 0, j);
	pg = kvshm_view_find(v, r->keys[0]);
	r->page[0] = pg;
	if (!kvshm_walk_take(v, l, r->slot[0], pg, c->ns_id, &r->keys[0], &c->root, r->tokens,
			     &r->gen[0]))
		return floor_fallback(c, t, r, 0, n);
	if (n > 1) {
		w = (struct kvshm_walk){
			.keys = r->keys, .tokens = r->tokens, .slot = r->slot, .page = r->page,
			.gen = r->gen, .n = n, .ns_id = c->ns_id, .parent = c->root,
		};
		j = kvshm_walk_seq(v, l, &w, 1, n, 1);
		if (j != n)
			return floor_fallback(c, t, r, j, n);
	}
	if (c->pin_fence) {
		/* The check clears the slots of the pins it lost. */
		j = kvshm_pin_check(l, r->slot, v->pages, r->page, r->gen, n, true);
		if (j != n)
			return floor_fallback(c, t, r, j, n);
	}
	memset(r->state, KVC_B_PINNED, n);
	r->hits = (uint32_t)n;
	r->counted_hits = (uint32_t)n;
	r->stage = 1;
	if (n == 1)
		kvshm_ledger_touch(l, pg);
	else
		kvshm_ledger_touch_seq(l, pg, n, 1);
	kvshm_ledger_hit(l, r->keys[0], (uint64_t)n * c->bt, r->label);
	row = &l->ctr[t->row];
	kvci_own_add(&row->lookups, 1);
	kvci_own_add(&row->lookup_tokens, r->n_tokens);
	kvci_own_add(&row->hit_blocks, n);
	kvci_own_add(&row->hit_tokens, (uint64_t)n * c->bt);
	kvci_own_add(&row->pins_held, n);
	return (int)n;
}

#endif
