// SPDX-License-Identifier: MIT
/*
 * pin.c - prefixes kept resident with a time to live: an operator's
 * (kvstat --pin, through admin.c) or a client's (kvc_pin: PIN, UNPIN).
 *
 * A pin is a chain of block keys in one namespace and key space. The
 * daemon holds the pages of its leading blocks that are cached (each a
 * READY page, listed, of its namespace, with its key and the parent the
 * chain gives: the lookup's own check), one count per page in
 * d->pin_held, which the evictor reads to pass a page by (evict.c). Blocks
 * not cached yet are held as they are published: each tick goes on from
 * where every pin stopped, a bounded number of index lookups in all. The
 * pages count against the pin's tenant's share (quota.c) for as long as
 * they are held; a pin stops growing at that share. When its time is up
 * the tick ends it and its pages are evictable again, like any others.
 *
 * Nothing here walks the pool: a pin costs one index lookup per block it
 * takes; a pin on a page being punched out lets go of it (evict.c).
 *
 * Must never: hold a page that is not READY and verified, or keep a hold
 * past its pin's end.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../shm/index.h"
#include "../../shm/page.h"
#include "kvd.h"
#include "pin.h"
#include "quota.h"
#include "reply.h"
#include "../util/log.h"

#define RELAXED memory_order_relaxed
/* Index lookups the tick spends extending pins, over all of them. */
#define KVD_PIN_TICK_LOOKUPS 1024u

static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The segment's row i: cleared first, written, then named (release). */
static void row_write(struct kvd *d, uint32_t i, const struct kvd_pin_want *w)
{
	struct kvshm_pinned *row = &kvshm_pinned(d->h)[i];
	const struct kvd_pin *pn = &d->pins[i];
	uint64_t now = realtime_ns();

	atomic_store_explicit(&row->id, 0, memory_order_release);
	row->ns_id = pn->ns_id;
	row->tenant = pn->tenant;
	row->blocks = pn->n;
	atomic_store_explicit(&row->resident, pn->resident, RELAXED);
	row->pid = w->pid;
	row->uid = w->uid;
	row->since_ns = now;
	row->expires_ns = now + (uint64_t)w->ttl_s * 1000000000ull;
	row->first = pn->keys[0];
	snprintf(row->label, sizeof(row->label), "%s", w->label ? w->label : "");
	atomic_store_explicit(&row->id, pn->id, memory_order_release);
}

static void stat_add(_Atomic uint64_t *v, int64_t delta)
{
	atomic_store_explicit(v, atomic_load_explicit(v, RELAXED) + (uint64_t)delta, RELAXED);
}

/* The page of block k of pin pn when it is cached and verifies, else
 * UINT32_MAX. */
static uint32_t block_page(const struct kvd *d, const struct kvd_pin *pn, uint32_t k)
{
	struct kvshm_key parent = k && !pn->flat ? pn->keys[k - 1] : pn->root;
	uint32_t loc = kvshm_index_find(d->h, pn->keys[k]);
	const struct kvshm_page *p;

	if (loc >= d->h->geo.n_pages)
		return UINT32_MAX;	/* not cached, or spilled */
	p = &kvshm_pages(d->h)[loc];
	if (atomic_load_explicit(&p->state, RELAXED) != KVSHM_PAGE_READY || p->unlisted ||
	    p->ns_id != pn->ns_id || !kvshm_key_eq(p->key, pn->keys[k]) ||
	    !kvshm_key_eq(p->parent, parent))
		return UINT32_MAX;
	return loc;
}

/* Hold pin i's blocks from where it stopped, while they are cached and its
 * tenant's share has room, spending at most *budget lookups. */
static void extend(struct kvd *d, uint32_t i, uint32_t *budget)
{
	struct kvd_pin *pn = &d->pins[i];
	uint32_t pct = kvd_quota_tenant_share(d, pn->tenant);
	uint64_t share = pct < 100 ? kvd_quota_pages(d, pct) : UINT64_MAX;
	uint32_t before = pn->resident, pg;

	while (pn->resident < pn->n && *budget) {
		(*budget)--;
		if (kvd_quota_tenant_held(d, pn->tenant) + 1 > share)
			break;
		pg = block_page(d, pn, pn->resident);
		if (pg == UINT32_MAX)
			break;
		d->pin_held[pg]++;	/* at most KVSHM_PINNED pins: no overflow */
		pn->page[pn->resident++] = pg;
		kvd_quota_pinned(d, pn->tenant, pn->ns_id, 1);
	}
	if (pn->resident != before) {
		stat_add(&kvshm_stats(d->h)->pinned_pages, (int64_t)(pn->resident - before));
		atomic_store_explicit(&kvshm_pinned(d->h)[i].resident, pn->resident, RELAXED);
	}
}

/* Let go of pin i's pages from block k on. */
static void shrink(struct kvd *d, uint32_t i, uint32_t k)
{
	struct kvd_pin *pn = &d->pins[i];
	uint32_t j, n = pn->resident > k ? pn->resident - k : 0;

	for (j = k; j < pn->resident; j++)
		d->pin_held[pn->page[j]]--;
	if (!n)
		return;
	pn->resident = k;
	kvd_quota_pinned(d, pn->tenant, pn->ns_id, -(int64_t)n);
	stat_add(&kvshm_stats(d->h)->pinned_pages, -(int64_t)n);
	atomic_store_explicit(&kvshm_pinned(d->h)[i].resident, pn->resident, RELAXED);
}

static void release(struct kvd *d, uint32_t i)
{
	struct kvd_pin *pn = &d->pins[i];

	shrink(d, i, 0);
	atomic_store_explicit(&kvshm_pinned(d->h)[i].id, 0, memory_order_release);
	free(pn->keys);
	free(pn->page);
	memset(pn, 0, sizeof(*pn));
	stat_add(&kvshm_stats(d->h)->pinned_prefixes, -1);
}

/* The pin of the same prefix, or -1. */
static int pin_same(const struct kvd *d, const struct kvd_pin_want *w)
{
	uint32_t i;

	for (i = 0; i < KVSHM_PINNED; i++) {
		const struct kvd_pin *pn = &d->pins[i];

		if (pn->id && pn->ns_id == w->ns_id && pn->tenant == w->tenant && pn->n == w->n &&
		    pn->flat == w->flat && kvshm_key_eq(pn->root, w->root) &&
		    !memcmp(pn->keys, w->keys, (size_t)w->n * sizeof(*w->keys)))
			return (int)i;
	}
	return -1;
}

int kvd_pin_add(struct kvd *d, const struct kvd_pin_want *w, uint32_t *id, uint32_t *resident,
		char *msg, size_t len)
{
	uint64_t until = kvd_now_ms() + (uint64_t)w->ttl_s * 1000u;
	uint32_t pct = kvd_quota_tenant_share(d, w->tenant), budget = w->n, i;
	const char *tname = w->tenant < KVSHM_TENANTS ? kvshm_tenants(d->h)[w->tenant].name : "?";
	struct kvd_pin *pn;
	int same;

	if (!d->pin_held) {
		d->pin_held = calloc(d->h->geo.n_pages, 1);
		if (!d->pin_held) {
			snprintf(msg, len, "out of memory");
			return -ENOMEM;
		}
	}
	same = pin_same(d, w);
	if (same >= 0) {
		/* Pinned again: the later end wins, the id stays. */
		pn = &d->pins[same];
		if (until > pn->expires_ms) {
			pn->expires_ms = until;
			kvshm_pinned(d->h)[same].expires_ns = realtime_ns() +
							      (uint64_t)w->ttl_s * 1000000000ull;
		}
		extend(d, (uint32_t)same, &budget);
		*id = pn->id;
		*resident = pn->resident;
		return 0;
	}
	if (pct < 100 && kvd_quota_tenant_held(d, w->tenant) >= kvd_quota_pages(d, pct)) {
		snprintf(msg, len,
			 "tenant %s holds %llu of the pool's %u pages pinned or writing, its share of %u%%: a pin counts against it",
			 tname, (unsigned long long)kvd_quota_tenant_held(d, w->tenant),
			 d->h->geo.n_pages, pct);
		return -EDQUOT;
	}
	for (i = 0; i < KVSHM_PINNED && d->pins[i].id; i++)
		;
	if (i == KVSHM_PINNED) {
		snprintf(msg, len, "%u prefixes are pinned already: unpin one (kvstat --pins lists them)",
			 KVSHM_PINNED);
		return -ENOSPC;
	}
	pn = &d->pins[i];
	pn->keys = malloc((size_t)w->n * sizeof(*pn->keys));
	pn->page = malloc((size_t)w->n * sizeof(*pn->page));
	if (!pn->keys || !pn->page) {
		free(pn->keys);
		free(pn->page);
		pn->keys = NULL;
		pn->page = NULL;
		snprintf(msg, len, "out of memory");
		return -ENOMEM;
	}
	memcpy(pn->keys, w->keys, (size_t)w->n * sizeof(*pn->keys));
	if (!++d->pin_next_id)
		d->pin_next_id = 1;
	pn->id = d->pin_next_id;
	pn->ns_id = w->ns_id;
	pn->tenant = w->tenant;
	pn->n = w->n;
	pn->flat = w->flat;
	pn->root = w->root;
	pn->resident = 0;
	pn->expires_ms = until;
	row_write(d, i, w);
	stat_add(&kvshm_stats(d->h)->pinned_prefixes, 1);
	extend(d, i, &budget);
	*id = pn->id;
	*resident = pn->resident;
	kvd_info("pin %u: %u blocks of namespace %u (%s), tenant %s, for %u s by pid %d: %u resident now",
		 pn->id, pn->n, pn->ns_id, kvshm_ns(d->h)[pn->ns_id].model, tname, w->ttl_s,
		 (int)w->pid, pn->resident);
	return 0;
}

int kvd_pin_remove(struct kvd *d, uint32_t id, uint32_t tenant, uint32_t ns_id)
{
	uint32_t i;

	for (i = 0; id && i < KVSHM_PINNED; i++) {
		const struct kvd_pin *pn = &d->pins[i];

		if (pn->id != id)
			continue;
		if ((tenant != UINT32_MAX && pn->tenant != tenant) ||
		    (ns_id != UINT32_MAX && pn->ns_id != ns_id))
			return -ENOENT;
		kvd_info("pin %u: ended (%u blocks were resident)", id, pn->resident);
		release(d, i);
		return 0;
	}
	return -ENOENT;
}

uint32_t kvd_pin_forget(struct kvd *d, uint32_t ns_id, uint32_t tenant)
{
	uint32_t i, n = 0;

	for (i = 0; i < KVSHM_PINNED; i++) {
		const struct kvd_pin *pn = &d->pins[i];

		if (!pn->id || (ns_id != UINT32_MAX && pn->ns_id != ns_id) ||
		    (tenant != UINT32_MAX && pn->tenant != tenant))
			continue;
		release(d, i);
		n++;
	}
	return n;
}

bool kvd_pin_ns_held(const struct kvd *d, uint32_t ns_id)
{
	uint32_t i;

	for (i = 0; i < KVSHM_PINNED; i++)
		if (d->pins[i].id && d->pins[i].ns_id == ns_id)
			return true;
	return false;
}

void kvd_pin_page_gone(struct kvd *d, uint32_t page)
{
	uint32_t i, k;

	if (!d->pin_held || page >= d->h->geo.n_pages || !d->pin_held[page])
		return;
	for (i = 0; i < KVSHM_PINNED; i++)
		for (k = 0; d->pins[i].id && k < d->pins[i].resident; k++)
			if (d->pins[i].page[k] == page) {
				shrink(d, i, k);	/* the blocks after it are out of reach */
				break;
			}
}

void kvd_pin_tick(struct kvd *d)
{
	uint32_t budget = KVD_PIN_TICK_LOOKUPS, i;
	uint64_t now = kvd_now_ms();

	for (i = 0; i < KVSHM_PINNED; i++) {
		struct kvd_pin *pn = &d->pins[i];

		if (!pn->id)
			continue;
		if (now >= pn->expires_ms) {
			kvd_info("pin %u: its time to live ran out (%u of %u blocks were resident)",
				 pn->id, pn->resident, pn->n);
			stat_add(&kvshm_stats(d->h)->pins_expired, 1);
			release(d, i);
			continue;
		}
		if (pn->resident < pn->n && budget)
			extend(d, i, &budget);
	}
}

/* ------------------------------------------------------ a client's own */

int kvd_pin_req(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		const void *p)
{
	struct kvproto_pin q;
	struct kvproto_pin_r r = { 0 };
	struct kvd_pin_want w;
	struct kvshm_key *keys;
	char msg[400];
	int rc;

	memcpy(&q, p, sizeof(q));
	keys = malloc((size_t)q.n * sizeof(*keys));
	if (!keys) {
		kvd_reply_error(d, c, hdr->seq, -ENOMEM, false, "out of memory");
		return 0;
	}
	memcpy(keys, (const uint8_t *)p + sizeof(q), (size_t)q.n * sizeof(*keys));
	memset(&w, 0, sizeof(w));
	w.ns_id = c->ns_id;
	w.tenant = c->tenant;
	/* Its own key space: block 0's parent is its own root, so a client
	 * pins blocks of its own tenant and namespace only. */
	w.root = c->root;
	w.keys = keys;
	w.n = q.n;
	w.flat = q.flags & KVPROTO_PIN_FLAT;
	w.ttl_s = q.ttl_s;
	w.label = q.label;
	w.pid = c->pid;
	w.uid = c->uid;
	rc = kvd_pin_add(d, &w, &r.id, &r.resident, msg, sizeof(msg));
	free(keys);
	if (rc) {
		kvd_reply_error(d, c, hdr->seq, rc, false, "%s", msg);
		return c->used && !c->lingering ? 0 : -1;
	}
	r.blocks = q.n;
	return kvd_reply(d, c, KVPROTO_PIN_R, hdr->seq, &r, sizeof(r), NULL, 0);
}

int kvd_unpin_req(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		  const void *p)
{
	struct kvproto_unpin q;

	memcpy(&q, p, sizeof(q));
	if (kvd_pin_remove(d, q.id, c->tenant, c->ns_id)) {
		kvd_reply_error(d, c, hdr->seq, -ENOENT, false,
				"UNPIN: no pin %u of this client's tenant and namespace", q.id);
		return c->used && !c->lingering ? 0 : -1;
	}
	return kvd_reply(d, c, KVPROTO_UNPIN_R, hdr->seq, &q, sizeof(q), NULL, 0);
}
