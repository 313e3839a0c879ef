// SPDX-License-Identifier: MIT
/*
 * evict.c - keeping free pages above the low watermark: the mechanism.
 *
 * The policy (policy.h, chosen with `eviction`) names candidates in the
 * order it wants them gone. Candidates are marked EVICTING in a batch,
 * then every ledger is scanned once; any candidate a slot names backs off
 * to READY (the policy keeps it, as just used), the rest leave the index
 * and go to the tiers or the free list. A pinned page is therefore never
 * evicted (the Dekker handshake in ledger.h), and the cost of the scan is
 * one pass over the ledgers per batch, not per page.
 *
 * Uses reach the policy from the clients' access rings, in the order each
 * client wrote them: drained every tick, and a client's own ring before
 * its ALLOC or PUBLISH is handled. Runs on the main thread from the tick
 * and, when an ALLOC finds too few free pages, synchronously before it
 * answers.
 */
#include "../../shm/page.h"
#include "../obs/events.h"
#include "kvd.h"
#include "evict.h"
#include "pin.h"
#include "../util/log.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/index.h"
#include "../../shm/ledger.h"
#include "../tier/tier.h"

#define BATCH 256
/* Pages the tick evicts at most (4096 a tick: 200k pages/s at 20 ms). */
#define KVD_EVICT_TICK 4096u

static void back_off(uint32_t page, void *arg)
{
	struct kvd *d = arg;

	/* A page whose spill write is in flight stays EVICTING until it is
	 * done: a pin that names it now saw EVICTING (or will) and fails. */
	if (kvd_tiers_busy(&d->g, page))
		return;
	kvshm_page_evict_back_off(d->h, page);
}

/* The page of page's parent block, if the pool holds it READY in the
 * same namespace; else KVD_POLICY_NONE. */
static uint32_t pool_parent(void *arg, uint32_t page)
{
	const struct kvd *d = arg;
	const struct kvshm_page *pg = &kvshm_pages(d->h)[page];
	uint32_t parent = kvshm_index_find(d->h, pg->parent);

	if (parent >= d->h->geo.n_pages ||
	    atomic_load_explicit(&kvshm_pages(d->h)[parent].state, memory_order_relaxed) !=
		    KVSHM_PAGE_READY ||
	    kvshm_pages(d->h)[parent].ns_id != pg->ns_id ||
	    !kvshm_key_eq(kvshm_pages(d->h)[parent].key, pg->parent))
		return KVD_POLICY_NONE;
	return parent;
}

void kvd_evict_insert(struct kvd *d, uint32_t page)
{
	const struct kvshm_page *pg = &kvshm_pages(d->h)[page];

	kvd_policy_insert(&d->pol, page, pool_parent(d, page), pg->key.lo ^ pg->key.hi ^ pg->ns_id);
}

int kvd_evict_policy(struct kvd *d, int eviction)
{
	int rc = kvd_policy_switch(&d->pol, eviction, pool_parent, d);

	d->evict_quiet_until = 0;	/* a new order: try it at once */
	return rc;
}

/*
 * A page a tier placed for a restore is READY and nobody pins it until
 * its client has read the reply and pinned it: a window the eviction
 * policy cannot see. The pool is often full exactly then (a restore
 * evicts to make room for itself), and S3-FIFO, the default, takes new
 * blocks never referenced first: the tick evicted the first blocks of a
 * fetched run before the client pinned them, and the client hit nothing
 * of what the daemon had just fetched for it (kvbench --mode remote's
 * intermittent stop, docs/RELIABILITY.md). So such a page is passed by
 * until a lookup's pin of it shows in an access ring (kvd_evict_drain),
 * or for KVD_SPARE_MS, long enough for any client that is not stopped;
 * one that never pins it only delays its eviction that long. (A client
 * that names the page in its own ring ends the sparing early: the page is
 * then as evictable as any other, which a trusted client can make
 * happen anyway.) Best effort: without memory for the stamps, nothing is
 * spared.
 */
void kvd_evict_spare(struct kvd *d, uint32_t page)
{
	uint32_t ticks = (KVD_SPARE_MS + d->cfg.tick_ms - 1) / d->cfg.tick_ms;

	if (page >= d->h->geo.n_pages)
		return;
	if (!d->spare && !(d->spare = calloc(d->h->geo.n_pages, sizeof(*d->spare))))
		return;
	d->spare[page] = (uint32_t)d->ticks + ticks + 1;
}

static bool spared(const struct kvd *d, uint32_t page)
{
	/* Wrap-safe: spared while the stamp is ahead of the tick count. */
	return d->spare && (int32_t)(d->spare[page] - (uint32_t)d->ticks) > 0;
}

/*
 * Every client's pins against the pages just marked EVICTING: back_off
 * those a slot names. With KVSHM_F_MEMBARRIER the clients pin without a
 * fence, and membarrier(2) first makes their slot stores visible
 * (shm/ledger.h). Returns false when that barrier failed: the scan proves
 * nothing then, and the caller backs off every page it marked.
 */
static bool scan_ledgers(struct kvd *d)
{
	uint32_t i;
	int rc;

	if (d->h->flags & KVSHM_F_MEMBARRIER) {
		if ((rc = kvshm_barrier_global())) {
			/* Said at the 1st, 2nd, 4th, 8th ... failure. */
			d->barrier_failed++;
			if (!(d->barrier_failed & (d->barrier_failed - 1)))
				kvd_warn("eviction: membarrier(2) failed (%s), %llu times now; nothing is evicted while it fails",
					 strerror(-rc), (unsigned long long)d->barrier_failed);
			return false;
		}
		kvd_stat_add(&kvshm_stats(d->h)->pin_barriers, 1);
	}
	for (i = 0; i < d->cfg.max_clients; i++)
		if (kvd_pins_count(&d->clients[i]))
			kvshm_ledger_scan(d->clients[i].l, d->clients[i].nslots, d->h,
					  back_off, d);
	return true;
}

/* scan_ledgers for the pages batch[0..nb) just marked EVICTING; when it
 * proves nothing, every one of them backs off. */
static void scan_batch(struct kvd *d, const uint32_t *batch, uint32_t nb)
{
	uint32_t i;

	if (!scan_ledgers(d))
		for (i = 0; i < nb; i++)
			back_off(batch[i], d);
}

uint32_t kvd_evict(struct kvd *d, uint32_t want, bool may_wait)
{
	struct kvshm_page *pages = kvshm_pages(d->h);
	uint32_t freed = 0, picked = 0, batch[BATCH], nb, i;
	uint32_t backed = 0, limit, budget = d->pol.held;
	bool no_room = false, dry = false;

	if (!want || d->ticks < d->evict_quiet_until)
		return 0;

	/* No more picks than held pages: one that is kept goes back as just
	 * used, behind all the others, so each is tried at most once. The
	 * tick takes a bounded slice; an ALLOC that needs pages now may try
	 * them all. */
	if (!may_wait && budget > 16 * KVD_EVICT_TICK)
		budget = 16 * KVD_EVICT_TICK;
	while (freed < want && picked < budget && !dry) {
		/* Without may_wait (the tick), take no more candidates than the
		 * spill tier has writes free: the loop never waits on the disk,
		 * and the next tick or completion goes on. */
		limit = may_wait ? BATCH : kvd_tiers_room(&d->g);
		if (limit > BATCH)
			limit = BATCH;
		if (!limit) {
			no_room = true;
			break;
		}
		nb = 0;
		while (nb < limit && nb < want - freed && picked < budget) {
			uint32_t p = kvd_policy_pick(&d->pol);

			if (p == KVD_POLICY_NONE) {
				dry = true;
				break;
			}
			picked++;
			if (atomic_load_explicit(&pages[p].state, memory_order_relaxed) !=
			    KVSHM_PAGE_READY) {
				/* Not a cached block (cannot happen: every path
				 * out of READY tells the policy); forget it. */
				kvd_policy_remove(&d->pol, p);
				continue;
			}
			/* A tier still copying it (a remote put) lets it be,
			 * and so does a restore its client has yet to pin, and a
			 * pinned prefix (pin.c). */
			if (kvd_tiers_busy(&d->g, p) || spared(d, p) || (d->pin_held && d->pin_held[p]) ||
			    !kvshm_page_evict_mark(d->h, p)) {
				kvd_policy_keep(&d->pol, p);
				continue;
			}
			batch[nb++] = p;
		}
		if (!nb)
			break;
		scan_batch(d, batch, nb);
		for (i = 0; i < nb; i++) {
			if (atomic_load_explicit(&pages[batch[i]].state, memory_order_relaxed) ==
			    KVSHM_PAGE_EVICTING) {
				kvd_policy_remove(&d->pol, batch[i]);
				/* To the spill tier (free when its write is
				 * done), or plainly. */
				if (!kvd_tiers_offer_evict(&d->g, batch[i])) {
					kvd_events_page_gone(&d->g, batch[i]);
					kvshm_page_evict_finish(d->h, batch[i]);
				}
				freed++;
			} else {
				kvd_policy_keep(&d->pol, batch[i]);
				backed++;
			}
		}
		kvd_tiers_flush(&d->g);
	}
	if (freed)
		kvd_debug("evicted %u pages (wanted %u)", freed, want);
	if (backed)
		kvd_debug("eviction: %u pinned candidates backed off", backed);
	if (freed) {
		d->evict_backoff = 0;
	} else if (no_room || (picked >= budget && budget < d->pol.held)) {
		/* Spill writes are all busy, or the tick's slice ended before
		 * every held page was tried: the next tick goes on. */
	} else {
		/* Everything is pinned or being written: every held page was
		 * tried. Do not try again every tick and every ALLOC; wait
		 * (up to 16 ticks) or until pins are released. */
		d->evict_backoff = d->evict_backoff ? (d->evict_backoff < 8 ? d->evict_backoff * 2 : 16) : 1;
		d->evict_quiet_until = d->ticks + d->evict_backoff;
		d->evict_quiet_pins = atomic_load_explicit(&kvshm_stats(d->h)->pins,
							   memory_order_relaxed);
		kvd_debug("eviction: nothing evictable; next try in %u ticks", d->evict_backoff);
	}
	return freed;
}

static bool page_of(const struct kvshm_page *p, uint32_t ns_id, uint32_t tenant)
{
	return (ns_id == UINT32_MAX || __atomic_load_n(&p->ns_id, __ATOMIC_RELAXED) == ns_id) &&
	       (tenant == UINT32_MAX || __atomic_load_n(&p->tenant, __ATOMIC_RELAXED) == tenant);
}

uint32_t kvd_evict_where(struct kvd *d, uint32_t ns_id, uint32_t tenant)
{
	struct kvshm_page *pages = kvshm_pages(d->h);
	uint32_t i, left = 0;

	/* No page of it may be under a spill write; its slots go too (a row
	 * about to name another model, or an operator's drop). */
	if (tenant == UINT32_MAX)
		kvd_tiers_forget_ns(&d->g, ns_id);
	else
		kvd_tiers_forget_tenant(&d->g, ns_id, tenant);
	for (i = 0; i < d->h->geo.n_pages; i++)
		if (page_of(&pages[i], ns_id, tenant) && !kvd_tiers_busy(&d->g, i) &&
		    !(d->pin_held && d->pin_held[i]))
			kvshm_page_evict_mark(d->h, i);
	if (!scan_ledgers(d))
		for (i = 0; i < d->h->geo.n_pages; i++)
			if (page_of(&pages[i], ns_id, tenant) &&
			    atomic_load_explicit(&pages[i].state, memory_order_relaxed) ==
				    KVSHM_PAGE_EVICTING)
				back_off(i, d);
	for (i = 0; i < d->h->geo.n_pages; i++) {
		uint32_t st = atomic_load_explicit(&pages[i].state, memory_order_relaxed);

		if (!page_of(&pages[i], ns_id, tenant))
			continue;
		if (st == KVSHM_PAGE_EVICTING) {
			kvd_policy_remove(&d->pol, i);
			/* A BlockRemoved per block, never AllBlocksCleared:
			 * a router that keys by pod would clear every
			 * model of the host (docs/EVENTS.md). */
			kvd_events_page_gone(&d->g, i);
			kvshm_page_evict_finish(d->h, i);
		} else if (st != KVSHM_PAGE_FREE)
			left++;
	}
	return left;
}

uint32_t kvd_evict_ns(struct kvd *d, uint32_t ns_id)
{
	return kvd_evict_where(d, ns_id, UINT32_MAX);
}

static void drain_touch(struct kvd *d, uint32_t page)
{
	kvd_policy_touch(&d->pol, page);
	/* Pinned by a lookup since: a restored page needs no sparing any
	 * more (the pin, and then the policy, keep it). */
	if (d->spare && page < d->h->geo.n_pages)
		d->spare[page] = 0;
}

/* Whether run entry e is one a client may write: no stray bits, a count
 * of at most KVSHM_RING_RUN_MAX. */
static bool run_ok(uint32_t e)
{
	return !(e & ~(KVSHM_RING_RUN | KVSHM_RING_UP | KVSHM_RING_COUNT)) &&
	       (e & KVSHM_RING_COUNT) <= KVSHM_RING_RUN_MAX;
}

/* The pages ring entry e names (a page: 1; a run: its count, 0 if
 * malformed). */
static uint32_t entry_pages(uint32_t e)
{
	if (!(e & KVSHM_RING_RUN))
		return 1;
	return run_ok(e) ? e & KVSHM_RING_COUNT : 0;
}

void kvd_evict_drain(struct kvd *d, struct kvd_client *c)
{
	const uint32_t np = d->h->geo.n_pages;
	uint32_t last, budget = KVSHM_RING_DRAIN, sum = 0;
	uint64_t head, k, from;

	if (!kvd_live(c))
		return;
	/* Client-written: any head, any entry. At most the last KVSHM_RING
	 * entries are read, and at most KVSHM_RING_DRAIN pages taken from
	 * them, the newest (a hit run is written deepest block first: its
	 * blocks nearest the root come last, and must not be what a budget
	 * cuts off); a page out of range or holding no block is ignored by
	 * the policy, and so is a run whose first page is unknown (not read
	 * by this drain or the one before, or out of range) or malformed. */
	head = atomic_load_explicit(&c->l->ring_head, memory_order_acquire);
	from = head - c->ring_seen > KVSHM_RING ? head - KVSHM_RING : c->ring_seen;
	for (k = head; k > from; k--) {
		uint32_t p = entry_pages(atomic_load_explicit(
			&c->l->ring[(k - 1) & (KVSHM_RING - 1)], memory_order_relaxed));

		if (sum + p >= budget)
			break;
		sum += p;
	}
	/* A run cut from its page starts nowhere: the page goes too (the
	 * sum stopped one short of the budget for it). */
	if (k > from && k < head &&
	    atomic_load_explicit(&c->l->ring[k & (KVSHM_RING - 1)], memory_order_relaxed) &
		    KVSHM_RING_RUN)
		k--;
	last = k == c->ring_seen ? c->ring_last - 1 : UINT32_MAX;	/* 0: none */
	for (; k < head && budget; k++) {
		uint32_t e = atomic_load_explicit(&c->l->ring[k & (KVSHM_RING - 1)],
						  memory_order_relaxed), n;

		if (!(e & KVSHM_RING_RUN)) {
			drain_touch(d, e);
			last = e;
			budget--;
			continue;
		}
		if (last >= np || !run_ok(e)) {
			last = UINT32_MAX;
			continue;
		}
		n = e & KVSHM_RING_COUNT;
		for (; n && budget; n--, budget--) {
			last += e & KVSHM_RING_UP ? 1 : (uint32_t)-1;
			if (last >= np)
				break;
			drain_touch(d, last);
		}
	}
	c->ring_seen = head;
	c->ring_last = k == head ? last + 1 : 0;	/* UINT32_MAX: 0 */
}

static void drain_rings(struct kvd *d)
{
	uint32_t i;

	for (i = 0; i < d->cfg.max_clients; i++)
		kvd_evict_drain(d, &d->clients[i]);
}

/* Free the punched pages batch[0..nb) marked EVICTING, but those a
 * client pins: one ledger scan (and one membarrier) for all of them. */
static void holes_free(struct kvd *d, const uint32_t *batch, uint32_t nb)
{
	struct kvshm_page *pages = kvshm_pages(d->h);
	uint32_t i;

	if (!nb)
		return;
	scan_batch(d, batch, nb);
	for (i = 0; i < nb; i++) {
		uint32_t p = batch[i];

		if (atomic_load_explicit(&pages[p].state, memory_order_relaxed) ==
		    KVSHM_PAGE_EVICTING) {
			kvd_policy_remove(&d->pol, p);
			kvshm_page_evict_finish(d->h, p);
			d->g.damaged[p] = 0;
		}
	}
}

/*
 * Pool pages a client punched out (kvd_pool_holes has backed them with
 * zeroed memory again): their blocks are gone. A READY page leaves the
 * index at once, so no lookup hits it again, and is freed unless pinned
 * (then the evictor frees it later; it is never spilled). A page being
 * spilled has that write cancelled. A WRITING page is marked, and its
 * publish is refused (publish.c). Readers that had it pinned may have read
 * zeros: that, a client that may write the pool can always do.
 */
static void on_holes(uint32_t first, uint32_t n, void *arg)
{
	struct kvd *d = arg;
	struct kvshm_page *pages = kvshm_pages(d->h);
	uint32_t p, batch[BATCH], nb = 0;

	if (!d->g.damaged) {
		d->g.damaged = calloc(d->h->geo.n_pages, 1);
		if (!d->g.damaged)
			return;
	}
	for (p = first; p < first + n && p < d->h->geo.n_pages; p++) {
		uint32_t st = atomic_load_explicit(&pages[p].state, memory_order_relaxed);

		if (st == KVSHM_PAGE_FREE)
			continue;
		kvd_stat_add(&kvshm_stats(d->h)->pool_holes, 1);
		d->g.damaged[p] = 1;
		if (st == KVSHM_PAGE_WRITING)
			continue;
		kvd_pin_page_gone(d, p);	/* a pinned prefix ends before it */
		kvd_events_page_gone(&d->g, p);
		if (!kvshm_page_unlist(d->h, p))
			kvd_stat_add(&kvshm_stats(d->h)->index_entries, -1);
		if (kvd_tiers_cancel(&d->g, p))
			continue;
		/* A tier still copying it (a remote put) must not see it freed
		 * and reused under its copy: the evictor frees it after. */
		if (kvd_tiers_busy(&d->g, p))
			continue;
		if (kvshm_page_evict_mark(d->h, p)) {
			batch[nb++] = p;
			if (nb == BATCH) {
				holes_free(d, batch, nb);
				nb = 0;
			}
		}
	}
	holes_free(d, batch, nb);
	kvd_warn("pool: pages %u..%u were punched out by a client (fallocate / MADV_REMOVE); their blocks are dropped",
		 first, first + n - 1);
}

void kvd_evict_tick(struct kvd *d)
{
	/* One fstat per tick says whether the pool lacks a page; only then
	 * a slice of it per tick is scanned to find where (see Trust in
	 * ARCHITECTURE.md for how long a hole can go unseen): 256 MiB of
	 * 4 KiB pages, whose page table mincore walks entry by entry
	 * (~0.25 ms), or 2 GiB of 2 MiB pages. */
	kvd_pool_holes(&d->pool, kvd_pool_hole_slice(&d->pool), on_holes, d);
	/* Pages being spilled are as good as free: they will be soon. */
	uint32_t free_now = kvshm_free(d->h)->count + kvd_tiers_pending(&d->g);

	drain_rings(d);
	/* A bounded slice per tick: the watermarks are a share of the pool,
	 * and evicting all of the gap at once made one tick's work grow with
	 * it (an ALLOC that needs pages evicts what it needs itself). */
	if (free_now < d->low_pages)
		kvd_evict(d, d->high_pages - free_now < KVD_EVICT_TICK ?
			  d->high_pages - free_now : KVD_EVICT_TICK, false);
}
