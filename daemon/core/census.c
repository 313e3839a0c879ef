// SPDX-License-Identifier: MIT
/*
 * census.c - the pin census: which pages the clients' ledgers pin, read a
 * bounded slice of ledger slots per tick, resuming where it stopped. Its
 * totals feed the stats (pages_pinned, pins), eviction's back-off when
 * everything left is pinned, and each handle's pin count for max-share.
 * Distinct pages are told by a stamp per page (pass << 32 | row + 1), so
 * nothing is cleared between passes. Ledger slots are client-written:
 * a slot naming no page is skipped.
 */
#include <stdlib.h>

#include "kvd.h"
#include "census.h"
#include "quota.h"

uint32_t kvd_ledger_pins(const struct kvd *d, const struct kvd_client *c)
{
	uint32_t s, n = 0;

	if (!kvd_pins_count(c))
		return 0;
	for (s = 0; s < c->nslots; s++)
		n += kvshm_slot_page(atomic_load_explicit(&c->l->slot[s], memory_order_relaxed)) <
		     d->h->geo.n_pages;
	return n;
}

bool kvd_client_holds(const struct kvd *d, const struct kvd_client *c)
{
	return c->writing || kvd_ledger_pins(d, c);
}

/* Start reading row i's slots in this pass. */
static void census_begin(struct kvd_client *c)
{
	c->census_reading = true;
	c->census_count = 0;
	c->fresh_at_census = c->fresh;
}

/* Row i's slots are read: what it pins now replaces what it published
 * since the read began (those pins were in what was read, or are still
 * counted as fresh). */
static void census_end(struct kvd_client *c)
{
	c->census_reading = false;
	c->census_pins = c->census_count;
	c->fresh -= c->fresh_at_census < c->fresh ? c->fresh_at_census : c->fresh;
}

void kvd_pin_census(struct kvd *d)
{
	const struct kvshm_page *pages = kvshm_pages(d->h);
	const uint32_t np = d->h->geo.n_pages;
	uint32_t budget = KVD_CENSUS_SLICE;

	if (!d->census_stamp) {
		d->census_stamp = calloc(np, sizeof(*d->census_stamp));
		if (!d->census_stamp)
			return;
	}
	if (d->census_row == 0 && d->census_slot == 0) {
		/* Between passes: a new one at most every 5 ticks. */
		if (d->census_pass && d->ticks - d->census_pass_tick < 5)
			return;
		d->census_pass++;
		d->census_pass_tick = d->ticks;
		d->census_pins = d->census_pinned = 0;
		kvd_quota_census_begin(d);
	}
	while (budget && d->census_row < d->cfg.max_clients) {
		struct kvd_client *c = &d->clients[d->census_row];
		uint64_t tag = d->census_pass << 32 | (d->census_row + 1);

		budget--;
		if (!kvd_pins_count(c)) {
			d->census_row++;
			d->census_slot = 0;
			continue;
		}
		if (d->census_slot == 0 || !c->census_reading) {
			d->census_slot = 0;	/* a new client took the row */
			census_begin(c);
		}
		for (; budget && d->census_slot < c->nslots; d->census_slot++, budget--) {
			uint32_t p = kvshm_slot_page(atomic_load_explicit(
				&c->l->slot[d->census_slot], memory_order_relaxed));
			uint64_t old;
			uint32_t st;

			if (p >= np)
				continue;
			d->census_pins++;
			old = d->census_stamp[p];
			st = atomic_load_explicit(&pages[p].state, memory_order_relaxed);
			if (old >> 32 != d->census_pass && st == KVSHM_PAGE_READY)
				d->census_pinned++;	/* the first handle naming it */
			/* The first time in this handle; its WRITING pages are
			 * counted apart (c->writing), not here. */
			if (old != tag && st != KVSHM_PAGE_WRITING)
				c->census_count++;
			if (st != KVSHM_PAGE_WRITING)	/* its tenant's, its namespace's */
				kvd_quota_census_page(d, c, p);
			d->census_stamp[p] = tag;
		}
		if (d->census_slot < c->nslots)
			return;	/* the next tick goes on in this row */
		census_end(c);
		d->census_row++;
		d->census_slot = 0;
	}
	if (d->census_row < d->cfg.max_clients)
		return;
	d->census_row = 0;
	d->census_slot = 0;
	kvd_quota_census_end(d);
	if (d->census_pins < d->evict_quiet_pins)
		d->evict_quiet_until = 0;	/* pins were released: evict again */
	atomic_store_explicit(&kvshm_stats(d->h)->pages_pinned, d->census_pinned,
			      memory_order_relaxed);
	atomic_store_explicit(&kvshm_stats(d->h)->pins, d->census_pins, memory_order_relaxed);
}
