// SPDX-License-Identifier: MIT
/*
 * alloc.c - ALLOC and ALLOC_KEYS: pages for a client to write, as many as
 * the pool, its process's max-share and its tenant's and namespace's
 * shares allow (quota.c). ALLOC_KEYS also says which block each page is
 * for, and the pages are announced in flight (single flight, flight.c).
 * Every record of a message is checked before any is applied.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/key.h"
#include "../../shm/page.h"
#include "../obs/events.h"
#include "kvd.h"
#include "alloc.h"
#include "evict.h"
#include "flight.h"
#include "quota.h"
#include "reply.h"
#include "slice.h"
#include "../util/log.h"
#include "../tier/tier.h"

uint32_t kvd_share_pages(const struct kvd *d)
{
	return kvd_quota_pages(d, d->cfg.max_share);
}

/*
 * Distinct pages c's process holds pinned or writing, over all its handles
 * (live or lingering), counted up to `share`: every page some slot of its
 * ledgers names, or its WRITING pages if more (an honest client records
 * them in its ledger too; one that wiped its ledger is still held to
 * them). Several pins of one page count once. Read only when the
 * counters below say the process may be at its share; d->mark is the
 * scratch, cleared again from the list of what was marked (the ledgers
 * may change meanwhile).
 */
static uint32_t process_count(struct kvd *d, const struct kvd_client *c, uint32_t share)
{
	const uint32_t np = d->h->geo.n_pages;
	uint64_t writing = 0;
	uint32_t s, held = 0, cap = 0, *list = NULL;
	const struct kvd_client *o = c;

	while (o->proc_prev)
		o = &d->clients[o->proc_prev - 1];
	for (; o; o = o->proc_next ? &d->clients[o->proc_next - 1] : NULL) {
		if (!kvd_pins_count(o))
			continue;
		writing += o->writing;
		if (held >= share)
			continue;
		for (s = 0; s < o->nslots && held < share; s++) {
			uint32_t p = kvshm_slot_page(atomic_load_explicit(&o->l->slot[s],
									  memory_order_relaxed));

			if (p >= np || d->mark[p])
				continue;
			if (held == cap) {
				uint32_t *nl = realloc(list, (cap ? cap * 2 : 256) * sizeof(*nl));

				if (!nl) {
					held = share;	/* cannot count: assume the worst */
					break;
				}
				list = nl;
				cap = cap ? cap * 2 : 256;
			}
			d->mark[p] = 1;
			list[held++] = p;
		}
	}
	for (s = 0; s < held && s < cap; s++)
		d->mark[list[s]] = 0;
	free(list);
	return held > writing ? held : (uint32_t)writing;
}

/*
 * Pages c's process holds pinned or writing, for max-share, when it asks
 * for n more; reads no other process's rows. Returns the per-handle
 * estimate (writing + census pins + published since) when it leaves room:
 * it errs high. Only a process near its share pays for reading its own
 * ledgers (process_count), which resets the estimate.
 */
static uint32_t process_holds(struct kvd *d, struct kvd_client *c, uint32_t share, uint32_t n)
{
	struct kvd_client *o = c, *head;
	uint64_t slots = 0, writing = 0, held = 0;
	uint32_t exact;

	while (o->proc_prev)
		o = &d->clients[o->proc_prev - 1];
	head = o;
	for (; o; o = o->proc_next ? &d->clients[o->proc_next - 1] : NULL) {
		if (!kvd_pins_count(o))
			continue;
		slots += o->nslots;
		writing += o->writing;
		held += (uint64_t)o->writing + o->census_pins + o->fresh;
	}
	if (slots + writing <= share)
		return 0;	/* cannot be over: below the share either way */
	if (held + n <= share)
		return (uint32_t)held;
	exact = process_count(d, c, share);
	for (o = head; o; o = o->proc_next ? &d->clients[o->proc_next - 1] : NULL) {
		o->census_pins = 0;
		o->fresh = o->fresh_at_census = 0;
	}
	c->census_pins = exact > writing ? exact - (uint32_t)writing : 0;
	return exact;
}

/* Of the first n claims, how many a slicing client would join (no free
 * page needed for those). */
static uint32_t joinable(const struct kvd *d, const struct kvd_client *c, const uint8_t *claims,
			 uint32_t n)
{
	uint32_t k, j = 0;

	for (k = 0; claims && kvd_slicing(c) && k < n; k++) {
		struct kvproto_claim cl;

		memcpy(&cl, claims + (size_t)k * sizeof(cl), sizeof(cl));
		j += kvd_slice_joinable(d, c, &cl);
	}
	return j;
}

/* A client that may not be granted pages at all: answered with why
 * (true), or false. */
static bool alloc_refused(struct kvd *d, struct kvd_client *c, uint32_t seq,
			  const uint8_t *claims)
{
	if (kvd_quota_no_insert(d, c)) {
		struct kvshm_tenant *row = c->tenant < KVSHM_TENANTS
						   ? &kvshm_tenants(d->h)[c->tenant] : NULL;

		kvd_stat_add(&kvshm_stats(d->h)->no_insert_refused, 1);
		if (row)
			kvd_stat_add(&row->no_insert_refused, 1);
		if (c->no_insert)
			kvd_reply_error(d, c, seq, -EROFS, false,
					"this client said no-insert (KVC_OPEN_NO_INSERT) at HELLO: it reads the cache and never publishes");
		else
			kvd_reply_error(d, c, seq, -EROFS, false,
					"tenant %s is no-insert in kvcached's config: its clients read the cache and never publish",
					row ? row->name : "?");
		return true;
	}
	if (!c->part.writes) {
		kvd_reply_error(d, c, seq, -EPERM, false,
				"this rank reads the KV of its heads, which another rank of its engine writes (replicated heads, or an MLA latent): it publishes nothing");
		return true;
	}
	if (kvd_slicing(c) && !claims) {
		kvd_reply_error(d, c, seq, -EINVAL, false,
				"a rank that writes its slice of pages several ranks write asks for them with the blocks' keys (ALLOC_KEYS), not with ALLOC");
		return true;
	}
	return false;
}

/*
 * Grant up to `asked` pages. With claims (ALLOC_KEYS), page k is announced
 * in flight as the block of claim k (shm/page.h), unless that block is in
 * the index already or the client holds max-announced pages WRITING. A
 * client that writes slices of pages several ranks write (slice.h) gets
 * for each claim the page another rank began for the block, or a fresh
 * one, announced; the grant stops at the first block it can have neither.
 */
static int alloc_pages(struct kvd *d, struct kvd_client *c, uint32_t seq, uint32_t asked,
		       const uint8_t *claims)
{
	struct kvshm_free *fr = kvshm_free(d->h);
	struct kvproto_count cnt = { 0, 0 };
	struct kvproto_pg *out;
	uint32_t n = asked, room, k, fresh;
	int rc;

	if (alloc_refused(d, c, seq, claims))
		return c->used && !c->lingering ? 0 : -1;
	/* Each WRITING page needs one of the client's pin slots. */
	room = c->nslots > c->writing ? c->nslots - c->writing : 0;
	if (n > room) {
		n = room;
		cnt.pad = KVPROTO_SHORT_SLOTS;
	}
	/* And the process's share of the pool, so no process starves the
	 * others of pages (the client may ask for less than max-share). */
	if (n) {
		uint32_t pct = c->own_share && c->own_share < d->cfg.max_share ? c->own_share
									    : d->cfg.max_share;
		uint32_t share = kvd_quota_pages(d, pct), held = process_holds(d, c, share, n);

		if (held >= share) {
			kvd_stat_add(&kvshm_stats(d->h)->share_refused, 1);
			if (c->tenant < KVSHM_TENANTS)
				kvd_stat_add(&kvshm_tenants(d->h)[c->tenant].refused, 1);
			kvd_reply_error(d, c, seq, -EDQUOT, false,
					"this process holds %u of the pool's %u pages pinned or writing, its max-share of %u%%%s",
					held, d->h->geo.n_pages, pct,
					pct < d->cfg.max_share ? " (as its client asked)" : "");
			return c->used && !c->lingering ? 0 : -1;
		}
		if (n > share - held) {
			n = share - held;
			/* A share of the whole pool is no cap: the pool is. */
			cnt.pad = share < d->h->geo.n_pages ? KVPROTO_SHORT_SHARE
							    : KVPROTO_SHORT_POOL;
		}
	}
	/* And its tenant's and namespace's shares. */
	if (n) {
		char msg[400];
		bool cut = false;

		if (kvd_quota_check(d, c, &n, &cut, msg, sizeof(msg))) {
			kvd_reply_error(d, c, seq, -EDQUOT, false, "%s", msg);
			return c->used && !c->lingering ? 0 : -1;
		}
		if (cut)
			cnt.pad = KVPROTO_SHORT_SHARE;
	}
	/* Its hits so far reach the policy before anything is evicted. */
	kvd_evict_drain(d, c);
	fresh = n - joinable(d, c, claims, n);
	if (fresh && fr->count < fresh + d->low_pages) {
		uint32_t coming = fr->count + kvd_tiers_pending(&d->g);

		if (coming < fresh + d->low_pages)
			kvd_evict(d, fresh + d->low_pages - coming, true);
		/* Evicted pages being spilled are free once written. */
		if (fr->count < fresh)
			kvd_tiers_drain(&d->g);
	}
	out = malloc(sizeof(*out) * (n ? n : 1));
	if (!out) {
		kvd_reply_error(d, c, seq, -ENOMEM, false, "out of memory");
		return 0;
	}
	for (k = 0; k < n; k++) {
		struct kvproto_claim cl;
		/* Announced only within max-announced: c->writing (pages it
		 * holds WRITING, announced or not) bounds its announcements. */
		bool announce = claims && c->writing + k < d->cfg.max_announced;

		if (claims)
			memcpy(&cl, claims + (size_t)k * sizeof(cl), sizeof(cl));
		if (kvd_slicing(c)) {
			uint32_t why = kvd_slice_grant(d, c, &cl, announce, &out[k]);

			if (why) {
				cnt.pad = why;
				break;
			}
			continue;
		}
		if (kvshm_page_alloc(d->h, kvd_owner(c), c->ns_id, &out[k].page, &out[k].gen)) {
			cnt.pad = KVPROTO_SHORT_POOL;
			break;
		}
		kvshm_page_set_tenant(d->h, out[k].page, c->tenant);
		if (d->g.damaged)	/* a hole found earlier was about its old use */
			d->g.damaged[out[k].page] = 0;
		if (announce)
			kvshm_page_announce(d->h, out[k].page, out[k].gen, kvd_owner(c), cl.key,
					    cl.parent);
	}
	kvd_quota_writing(d, c, k);
	if (k < asked)
		kvd_stat_add(&kvshm_stats(d->h)->alloc_short, 1);
	cnt.n = k;
	rc = kvd_reply(d, c, KVPROTO_ALLOC_R, seq, &cnt, sizeof(cnt), out, k * sizeof(*out));
	free(out);
	return rc;
}

int kvd_alloc(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
	      const void *p)
{
	const uint32_t seq = hdr->seq;
	struct kvproto_alloc a;

	memcpy(&a, p, sizeof(a));
	return alloc_pages(d, c, seq, a.n, NULL);
}

int kvd_alloc_keys(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		   const void *p)
{
	const uint32_t seq = hdr->seq;
	const uint8_t *claims = (const uint8_t *)p + sizeof(struct kvproto_alloc);
	struct kvproto_alloc a;
	struct kvproto_claim first;

	memcpy(&a, p, sizeof(a));
	memcpy(&first, claims, sizeof(first));
	/* Someone else began writing the first block (or published it)
	 * since the caller's lookup: it would rather wait for it (or pin
	 * it) than compute it too. */
	if ((a.flags & KVPROTO_ALLOC_SINGLE) && kvd_flight_taken(d, c, &first)) {
		kvd_reply_error(d, c, seq, -EINPROGRESS, false,
				"the first block is being written by another client, or cached");
		return c->used && !c->lingering ? 0 : -1;
	}
	return alloc_pages(d, c, seq, a.n, claims);
}
