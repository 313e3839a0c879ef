// SPDX-License-Identifier: MIT
/*
 * spill.c - the spill tier: pool pages evicted to NVMe slots, restored on
 * demand, found again after a restart.
 *
 * The life of a slot (daemon-private state; the shared slot table in the
 * segment shows clients only whether a slot is SPILLED):
 *
 *   FREE --(evictor picks a page)--> BUSY (header + payload writes in
 *        flight; the page stays EVICTING, unpinnable)
 *   BUSY --(both writes done)--> SPILLED: the page's index entry moves to
 *        the slot in place, the page goes FREE
 *   SPILLED --(RESTORE)--> BUSY (reads in flight into a fresh page)
 *        --(header and payload checksums good)--> BACKING: the page is
 *        READY, the index names it again, the slot keeps a clean copy
 *   BACKING --(the page is evicted again, unchanged)--> SPILLED, no I/O
 *   SPILLED / BACKING --(area full: CLOCK over slots)--> FREE
 *   any failed check --> FREE, counted, the block reported as a miss
 *
 * A write error (disk full, EIO, the directory gone) stops further spill
 * writes with one log line; eviction goes on as it would without the tier.
 * Restores block the main loop for the reads of one RESTORE (a few
 * milliseconds per hundred megabytes on NVMe); spill writes never do
 * unless an ALLOC has nothing else to wait for.
 */
#include "spill_int.h"

/* ------------------------------------------------------------ evictor */

bool kvd_spill_page(struct kvd_ground *g, uint32_t page)
{
	struct kvd_spill *sp = spill_of(g);
	struct kvshm_page *p = &kvshm_pages(g->h)[page];
	const struct kvshm_ns *ns;
	uint32_t slot, idx;
	struct sop *o;

	if (!sp || sp->page_op[page])
		return false;	/* (a write in flight: never a second one) */
	if (g->damaged && g->damaged[page]) {
		/* Punched out by a client: its contents are gone; evict it
		 * plainly (and any clean copy on disk stays good). */
		g->damaged[page] = 0;
		return false;
	}
	slot = sp->backing[page];
	if (slot--) {
		sp->backing[page] = 0;
		if (sp->s[slot].state == KVSHM_SLOT_BACKING && sp->s[slot].page == page &&
		    kvd_spill_backing_live(g, slot)) {
			/* A clean copy is on disk: no write. */
			kvd_spill_shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			if (!kvshm_page_evict_to_slot(g->h, page, slot)) {
				kvd_events_spilled(g, page, slot);
				kvd_stat_add(&st_of(g)->pages_spilled, 1);
				kvd_stat_add(&st_of(g)->spill_clean, 1);
				return true;
			}
			kvd_spill_slot_free(g, slot);
			return false;
		}
	}
	if (!sp->writes_on || sp->io_dead)
		return false;
	o = kvd_spill_op_get(g, &idx);
	if (!o)
		return false;
	slot = kvd_spill_slot_get(g);
	if (slot == UINT32_MAX) {
		kvd_spill_op_put(sp, idx);
		return false;
	}
	ns = &kvshm_ns(g->h)[p->ns_id];
	if (sp->stage && kvd_pool_copy_out(g->pool, page, 1, kvd_spill_payload_of(g, idx, page))) {
		kvd_spill_slot_free(g, slot);
		kvd_spill_op_put(sp, idx);
		return false;
	}
	o->kind = OP_WRITE;
	o->page = page;
	o->slot = slot;
	o->len = kvd_spill_aligned(ns->page_bytes);
	kvd_slot_hdr_fill(sp->staging + (uint64_t)idx * sp->hdr_bytes, sp->hdr_bytes, ++sp->seq,
			  ns, p->key, p->parent, kvshm_tokens(g->h, page), g->h->geo.block_tokens,
			  ns->page_bytes, kvd_payload_check(kvd_spill_payload_of(g, idx, page), ns->page_bytes));
	sp->s[slot].seq = sp->seq;
	sp->s[slot].page = page;
	sp->s[slot].tok = tok_hash(sp, kvshm_tokens(g->h, page), g->h->geo.block_tokens);
	kvd_spill_shared_set(g, slot, KVSHM_SLOT_BUSY, NULL, NULL, 0, 0);
	if (kvd_spill_op_queue(g, idx, true)) {
		/* Cannot happen: kvd_spill_op_get saw room for both parts. */
		kvd_spill_shared_set(g, slot, KVSHM_SLOT_FREE, NULL, NULL, 0, 0);
		kvd_spill_slot_free(g, slot);
		kvd_spill_op_put(sp, idx);
		return false;
	}
	sp->page_op[page] = idx + 1;
	sp->writes++;
	return true;
}

void kvd_spill_flush(struct kvd_ground *g)
{
	/* A refused submit stays queued and is retried by the next reap. */
	if (spill_of(g) && !spill_of(g)->io_dead)
		kvd_sio_flush(spill_of(g)->io);
}

bool kvd_spill_cancel(struct kvd_ground *g, uint32_t page)
{
	struct kvd_spill *sp = spill_of(g);

	if (!sp || !sp->page_op[page])
		return false;
	sp->ops[sp->page_op[page] - 1].cancel = true;
	return true;
}

bool kvd_spill_busy(const struct kvd_ground *g, uint32_t page)
{
	return spill_of(g) && spill_of(g)->page_op[page];
}

uint32_t kvd_spill_room(const struct kvd_ground *g)
{
	const struct kvd_spill *sp = spill_of(g);

	if (!sp || !sp->writes_on || sp->io_dead)
		return UINT32_MAX;	/* eviction does not wait for the tier */
	return sp->nopfree;
}

uint32_t kvd_spill_pending(const struct kvd_ground *g)
{
	return spill_of(g) ? spill_of(g)->writes : 0;
}

void kvd_spill_reap(struct kvd_ground *g)
{
	if (spill_of(g) && !spill_of(g)->io_dead)
		kvd_sio_reap(spill_of(g)->io, false, kvd_spill_reap_done, g);
}

void kvd_spill_drain(struct kvd_ground *g)
{
	if (!spill_of(g))
		return;
	while (kvd_sio_inflight(spill_of(g)->io))
		if (!kvd_spill_reap_wait(g))
			break;
}

int kvd_spill_fd(const struct kvd_ground *g)
{
	return spill_of(g) ? kvd_sio_eventfd(spill_of(g)->io) : -1;
}

void kvd_spill_unindex(struct kvd_ground *g, struct kvshm_key key, struct kvshm_key parent,
		       const uint32_t *tokens, uint32_t ns_id)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t loc, bt = g->h->geo.block_tokens;

	if (!sp)
		return;
	/* Only the same block (namespace, parent, tokens) gives way; anything
	 * else is a collision, which the publish then refuses as in tier 0. */
	loc = kvshm_index_find(g->h, key);
	if (kvshm_loc_is_slot(loc)) {
		uint32_t slot = loc & ~KVSHM_LOC_SLOT;
		const struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

		if (slot < sp->n && sp->s[slot].state == KVSHM_SLOT_SPILLED &&
		    e->ns_id == ns_id && kvshm_key_eq(e->parent, parent) &&
		    kvshm_key_eq(sp->s[slot].tok, tok_hash(sp, tokens, bt))) {
			kvd_events_slot_gone(g, slot);
			kvd_spill_slot_forget(g, slot);
		}
	} else if (loc < g->h->geo.n_pages && sp->page_op[loc]) {
		const struct kvshm_page *pg = &kvshm_pages(g->h)[loc];

		if (pg->ns_id != ns_id || !kvshm_key_eq(pg->parent, parent) ||
		    memcmp(kvshm_tokens(g->h, loc), tokens, (size_t)bt * sizeof(*tokens)))
			return;
		sp->ops[sp->page_op[loc] - 1].cancel = true;
		kvd_events_page_gone(g, loc);
		if (!kvshm_index_remove(g->h, key, loc))
			kvd_stat_add(&st_of(g)->index_entries, -1);
	}
}

/* Drop the slots of namespace ns_id and tenant (UINT32_MAX: any). */
static void forget_where(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t i;

	if (!sp)
		return;
	kvd_spill_drain(g);
	for (i = 0; i < sp->n; i++) {
		if ((ns_id != UINT32_MAX && kvshm_slots(g->h)[i].ns_id != ns_id) ||
		    (tenant != UINT32_MAX && kvshm_slots(g->h)[i].tenant != tenant))
			continue;
		if (sp->s[i].state == KVSHM_SLOT_SPILLED) {
			kvd_events_slot_gone(g, i);
			kvd_spill_slot_forget(g, i);
		} else if (sp->s[i].state == KVSHM_SLOT_BACKING)
			kvd_spill_backing_drop(g, i);
	}
}

void kvd_spill_forget_ns(struct kvd_ground *g, uint32_t ns_id)
{
	forget_where(g, ns_id, UINT32_MAX);
}

void kvd_spill_forget_tenant(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant)
{
	forget_where(g, ns_id, tenant);
}

/* ------------------------------------------------------------ restore */

int kvd_spill_claim(struct kvd_ground *g, uint32_t ns_id, uint32_t loc, bool full,
		    struct kvd_fetch *f)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t slot = loc & ~KVSHM_LOC_SLOT;

	/* A tier-1 block of this client's namespace? */
	if (!sp || !kvshm_loc_is_slot(loc) || slot >= sp->n ||
	    sp->s[slot].state != KVSHM_SLOT_SPILLED || kvshm_slots(g->h)[slot].ns_id != ns_id)
		return 0;
	if (full || sp->io_dead) {
		kvd_stat_add(&st_of(g)->restore_misses, 1);
		return -ENOSPC;
	}
	kvd_spill_shared_set(g, slot, KVSHM_SLOT_BUSY, NULL, NULL, 0, 0);
	f->ref = slot;
	return 1;
}

int kvd_spill_fetch(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant, struct kvd_fetch *f,
		    uint32_t n, struct kvd_restore *rq)
{
	struct kvd_spill *sp = spill_of(g);
	uint64_t t0, bytes = 0;
	uint32_t i;

	(void)ns_id;
	(void)tenant;
	(void)rq;
	t0 = kvd_now_ns();
	for (i = 0; i < n; i++) {
		uint32_t slot = f[i].ref, idx;
		struct sop *o;

		o = kvd_spill_op_get(g, &idx);
		if (!o) {
			kvd_spill_shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			*f[i].status = -EIO;
			kvd_stat_add(&st_of(g)->restore_misses, 1);
			continue;
		}
		if (kvshm_page_alloc(g->h, OWNER_SPILL, kvshm_slots(g->h)[slot].ns_id,
				     &o->page, &o->gen)) {
			kvd_spill_op_put(sp, idx);
			kvd_spill_shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			*f[i].status = -ENOSPC;
			kvd_stat_add(&st_of(g)->restore_misses, 1);
			continue;
		}
		/* A page for the daemon, not handed to a client; its block
		 * stays in its tenant's key space. */
		kvshm_page_set_tenant(g->h, o->page, kvshm_slots(g->h)[slot].tenant);
		kvd_stat_add(&st_of(g)->allocs, -1);
		o->kind = OP_READ;
		o->slot = slot;
		o->len = kvd_spill_aligned(kvshm_ns(g->h)[kvshm_slots(g->h)[slot].ns_id].page_bytes);
		o->status = f[i].status;
		if (kvd_spill_op_queue(g, idx, false)) {
			/* Cannot happen: kvd_spill_op_get saw room for both parts. */
			kvshm_page_free(g->h, o->page, o->gen, OWNER_SPILL);
			kvd_spill_op_put(sp, idx);
			kvd_spill_shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			*f[i].status = -EIO;
			kvd_stat_add(&st_of(g)->restore_misses, 1);
			continue;
		}
		bytes += o->len;
		sp->reads++;
		kvd_spill_flush(g);
	}
	while (sp->reads)
		if (!kvd_spill_reap_wait(g))
			break;	/* the tier stopped; statuses say -EIO */
	if (bytes) {
		uint64_t dt = kvd_now_ns() - t0, bps, old;

		bps = dt ? (uint64_t)((double)bytes * 1e9 / (double)dt) : 0;
		old = atomic_load_explicit(&st_of(g)->spill_read_bps, memory_order_relaxed);
		atomic_store_explicit(&st_of(g)->spill_read_bps, old ? (old * 3 + bps) / 4 : bps,
				      memory_order_relaxed);
	}
	return 0;
}
