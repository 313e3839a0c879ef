// SPDX-License-Identifier: MIT
/*
 * spill_table.c - the spill tier's slot table: each slot's state, its
 * entry in the shared slot table, its place in the slots' eviction order,
 * and the clean copies (BACKING) pool pages keep on disk.
 */
#include "spill_int.h"

/* The slot of `parent`'s block when the tier holds it, else
 * KVD_POLICY_NONE. */
static uint32_t parent_slot(const struct kvd_ground *g, const struct kvshm_key *parent)
{
	uint32_t loc = kvshm_index_find(g->h, *parent), ps = loc & ~KVSHM_LOC_SLOT;

	if (!kvshm_loc_is_slot(loc) || ps >= spill_of(g)->n ||
	    spill_of(g)->s[ps].state == KVSHM_SLOT_FREE)
		return KVD_POLICY_NONE;
	return ps;
}

static uint32_t slot_parent(void *arg, uint32_t slot)
{
	const struct kvd_ground *g = arg;

	return parent_slot(g, &kvshm_slots(g->h)[slot].parent);
}

int kvd_spill_policy(struct kvd_ground *g, int eviction)
{
	return spill_of(g) ? kvd_policy_switch(&spill_of(g)->pol, eviction, slot_parent, g) : 0;
}

void kvd_spill_shared_set(struct kvd_ground *g, uint32_t slot, uint32_t state,
			  const struct kvshm_key *key, const struct kvshm_key *parent,
			  uint32_t ns_id, uint32_t tenant)
{
	struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

	if (key) {
		/* New identity: gen first, then the fields, then the state. */
		atomic_store_explicit(&e->state, KVSHM_SLOT_BUSY, memory_order_release);
		atomic_store_explicit(&e->gen, atomic_load_explicit(&e->gen, memory_order_relaxed) + 1,
				      memory_order_release);
		atomic_thread_fence(memory_order_release);
		__atomic_store_n(&e->ns_id, ns_id, __ATOMIC_RELAXED);
		__atomic_store_n(&e->tenant, tenant, __ATOMIC_RELAXED);
		kvshm_store_key(&e->key, *key);
		kvshm_store_key(&e->parent, *parent);
	}
	atomic_store_explicit(&e->state, state, memory_order_release);
	spill_of(g)->s[slot].state = (uint8_t)state;
	if (key) {
		/* A new block in the tier: under its parent's slot, if the
		 * tier holds that. */
		kvd_policy_insert(&spill_of(g)->pol, slot, parent_slot(g, parent),
				  key->lo ^ key->hi ^ ns_id);
	}
}

void kvd_spill_slot_free(struct kvd_ground *g, uint32_t slot)
{
	struct kvd_spill *sp = spill_of(g);
	struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

	atomic_store_explicit(&e->state, KVSHM_SLOT_FREE, memory_order_release);
	atomic_store_explicit(&e->gen, atomic_load_explicit(&e->gen, memory_order_relaxed) + 1,
			      memory_order_release);
	sp->s[slot].state = KVSHM_SLOT_FREE;
	kvd_policy_remove(&sp->pol, slot);
	sp->freel[sp->nfree++] = slot;
}

/* A SPILLED slot leaves the index and the tier. */
void kvd_spill_slot_forget(struct kvd_ground *g, uint32_t slot)
{
	struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

	if (!kvshm_index_remove(g->h, kvshm_load_key(&e->key), KVSHM_LOC_SLOT | slot))
		kvd_stat_add(&st_of(g)->index_entries, -1);
	kvd_stat_add(&st_of(g)->pages_spilled, -1);
	kvd_spill_slot_free(g, slot);
}

/* Is BACKING slot s still the clean copy of its page? */
bool kvd_spill_backing_live(struct kvd_ground *g, uint32_t slot)
{
	const struct sslot *s = &spill_of(g)->s[slot];
	const struct kvshm_page *p = &kvshm_pages(g->h)[s->page];

	return atomic_load_explicit(&p->gen, memory_order_relaxed) == s->pgen &&
	       atomic_load_explicit(&p->state, memory_order_relaxed) != KVSHM_PAGE_FREE;
}

void kvd_spill_backing_drop(struct kvd_ground *g, uint32_t slot)
{
	struct kvd_spill *sp = spill_of(g);

	if (sp->backing[sp->s[slot].page] == slot + 1)
		sp->backing[sp->s[slot].page] = 0;
	kvd_spill_slot_free(g, slot);
}

/* A free slot: the free list, else the one the eviction policy gives up
 * first (the pool's policy, over the slots). */
uint32_t kvd_spill_slot_get(struct kvd_ground *g)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t i;

	if (sp->nfree)
		return sp->freel[--sp->nfree];
	for (i = 0; i < 2 * sp->n; i++) {
		uint32_t k = kvd_policy_pick(&sp->pol);
		struct sslot *s;

		if (k == KVD_POLICY_NONE)
			break;
		s = &sp->s[k];
		if (s->state == KVSHM_SLOT_BUSY) {
			kvd_policy_keep(&sp->pol, k);	/* being read */
			continue;
		}
		if (s->state == KVSHM_SLOT_FREE) {
			kvd_policy_remove(&sp->pol, k);
			continue;
		}
		if (s->state == KVSHM_SLOT_BACKING && !kvd_spill_backing_live(g, k)) {
			kvd_spill_backing_drop(g, k);
			return sp->freel[--sp->nfree];
		}
		if (s->state == KVSHM_SLOT_SPILLED) {
			kvd_events_slot_gone(g, k);
			kvd_spill_slot_forget(g, k);
		} else {
			kvd_spill_backing_drop(g, k);
		}
		kvd_stat_add(&st_of(g)->spill_recycled, 1);
		return sp->freel[--sp->nfree];
	}
	return UINT32_MAX;
}
