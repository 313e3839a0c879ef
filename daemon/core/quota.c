// SPDX-License-Identifier: MIT
/*
 * quota.c - tenants, and the shares of the pool a tenant and a namespace
 * may hold, beside a process's max-share (alloc.c).
 *
 * A tenant is the clients of one salt: the HELLO carries it, the daemon
 * keeps it here and nowhere else (never in the segment, the log or the
 * metrics), and finds the tenant's row by it. A row is named by the
 * operator's `tenant` line of that salt, "unsalted" for the empty salt, or
 * "unnamed-ROW"; kvstat's TENANTS view and the metrics show the name.
 *
 * What a tenant (or a namespace) holds is what its share bounds: the pages
 * its clients write, the distinct pages of its own key space they pin,
 * and the pages its pinned prefixes keep (pin.c). The first and the last
 * are kept exactly as they change; pins are counted by the pin census
 * (census.c) once per pass, a page once per pass for its own tenant and
 * namespace (a stamp per page), so that eight engines pinning one system
 * prompt count it once; pages published since the pass began count until
 * the next pass has read their pins. The estimate errs high (released
 * pins count until the next pass), except for pins taken on hits since
 * the last pass, which count at most a pass late, as for max-share. So an
 * ALLOC's check is a few additions, whatever the pool, the clients or the
 * tenant's processes. Honest clients pin only blocks of their own key
 * space (shm/key.h), and a pin on another tenant's page is not counted
 * for either: a client cannot push another tenant over its share.
 *
 * Must never: write the salt anywhere but d->tenants, or let a refusal
 * name anything but the share, the counts and the tenant's name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/key.h"
#include "kvd.h"
#include "quota.h"
#include "../util/log.h"

#define RELAXED memory_order_relaxed

static struct kvd_group *tgroup(struct kvd *d, uint32_t t)
{
	return t < KVSHM_TENANTS ? &d->tgrp[t] : NULL;
}

static struct kvd_group *ngroup(struct kvd *d, uint32_t ns)
{
	return ns < KVD_MAX_NS ? &d->ngrp[ns] : NULL;
}

static uint64_t held_of(const struct kvd_group *g)
{
	return g->writing + g->pins + g->fresh + g->pinned;
}

uint32_t kvd_quota_pages(const struct kvd *d, uint32_t pct)
{
	uint32_t n = (uint32_t)((uint64_t)d->h->geo.n_pages * pct / 100);

	return n ? n : 1;
}

uint32_t kvd_quota_tenant_share(const struct kvd *d, uint32_t t)
{
	const struct kvd_tenant *r = t < KVSHM_TENANTS ? &d->tenants[t] : NULL;

	if (r && r->cfg >= 0 && d->cfg.tenants[r->cfg].share)
		return d->cfg.tenants[r->cfg].share;
	return d->cfg.tenant_share;
}

uint64_t kvd_quota_tenant_held(const struct kvd *d, uint32_t t)
{
	return t < KVSHM_TENANTS ? held_of(&d->tgrp[t]) : 0;
}

uint64_t kvd_quota_ns_held(const struct kvd *d, uint32_t ns)
{
	return ns < KVD_MAX_NS ? held_of(&d->ngrp[ns]) : 0;
}

/* ------------------------------------------------------------ the table */

/* Write row t of the segment's table (used 0 around it: readers skip it
 * meanwhile, as a namespace row being rewritten). */
static void row_write(struct kvd *d, uint32_t t)
{
	struct kvshm_tenant *row = &kvshm_tenants(d->h)[t];
	const struct kvd_tenant *r = &d->tenants[t];
	uint32_t flags = 0;

	atomic_store_explicit(&row->used, 0, memory_order_release);
	memset(row->name, 0, sizeof(row->name));
	if (r->cfg >= 0) {
		const struct kvd_tenant_cfg *tc = &d->cfg.tenants[r->cfg];

		snprintf(row->name, sizeof(row->name), "%s", tc->name);
		flags |= KVSHM_TENANT_CONFIGURED;
		if (tc->no_insert)
			flags |= KVSHM_TENANT_NO_INSERT;
	} else if (!r->salt_len) {
		snprintf(row->name, sizeof(row->name), "unsalted");
	} else {
		snprintf(row->name, sizeof(row->name), "unnamed-%u", t);
	}
	row->flags = flags;
	atomic_store_explicit(&row->share, kvd_quota_tenant_share(d, t), RELAXED);
	atomic_store_explicit(&row->used, 1, memory_order_release);
}

static int salt_row(const struct kvd *d, const uint8_t *salt, uint32_t len)
{
	uint32_t t;

	for (t = 0; t < KVSHM_TENANTS; t++)
		if (d->tenants[t].used && d->tenants[t].salt_len == len &&
		    (!len || !memcmp(d->tenants[t].salt, salt, len)))
			return (int)t;
	return -1;
}

/* Row t held a tenant nobody uses now: its pages belong to no tenant
 * (one pass over the page table; only when all 64 rows were taken). */
static void row_forget(struct kvd *d, uint32_t t)
{
	struct kvshm_page *pages = kvshm_pages(d->h);
	struct kvshm_tenant *row = &kvshm_tenants(d->h)[t];
	struct kvshm_slot *slots = kvshm_slots(d->h);
	uint32_t i;

	for (i = 0; i < d->h->geo.n_pages; i++)
		if (pages[i].tenant == t)
			pages[i].tenant = KVSHM_TENANT_NONE;
	for (i = 0; i < d->h->geo.n_slots; i++)
		if (slots[i].tenant == t)
			slots[i].tenant = KVSHM_TENANT_NONE;
	atomic_store_explicit(&row->used, 0, memory_order_release);
	memset((char *)row + offsetof(struct kvshm_tenant, lookups), 0,
	       sizeof(*row) - offsetof(struct kvshm_tenant, lookups));
	memset(&d->tgrp[t], 0, sizeof(d->tgrp[t]));
	memset(&d->tenants[t], 0, sizeof(d->tenants[t]));
}

/* A row for this salt: found, free, or the row of an unnamed tenant with
 * no clients and nothing pinned. -1 when none. */
static int row_get(struct kvd *d, const uint8_t *salt, uint32_t len, int cfg)
{
	int t = salt_row(d, salt, len);
	uint32_t i;

	if (t >= 0)
		return t;
	for (i = 0; i < KVSHM_TENANTS && d->tenants[i].used; i++)
		;
	if (i == KVSHM_TENANTS) {
		for (i = 0; i < KVSHM_TENANTS; i++)
			if (d->tenants[i].cfg < 0 && !d->tgrp[i].clients && !d->tgrp[i].pinned &&
			    !d->tgrp[i].writing)
				break;
		if (i == KVSHM_TENANTS)
			return -1;
		kvd_info("tenant row %u (%s) had no clients: reused", i, kvshm_tenants(d->h)[i].name);
		row_forget(d, i);
	}
	d->tenants[i].used = true;
	d->tenants[i].cfg = cfg;
	d->tenants[i].salt_len = len;
	if (len)
		memcpy(d->tenants[i].salt, salt, len);
	row_write(d, i);
	return (int)i;
}

void kvd_quota_configure(struct kvd *d)
{
	uint32_t t, i;

	for (t = 0; t < KVSHM_TENANTS; t++)
		if (d->tenants[t].used)
			d->tenants[t].cfg = -1;
	for (i = 0; i < d->cfg.n_tenants; i++) {
		const struct kvd_tenant_cfg *tc = &d->cfg.tenants[i];
		int r = salt_row(d, tc->salt, tc->salt_len);

		if (r >= 0)
			d->tenants[r].cfg = (int)i;
		else if (row_get(d, tc->salt, tc->salt_len, (int)i) < 0)
			kvd_warn("tenant %s: no free row in the tenant table (64 tenants with clients)",
				 tc->name);
	}
	for (t = 0; t < KVSHM_TENANTS; t++)
		if (d->tenants[t].used)
			row_write(d, t);
}

int kvd_quota_tenant_salt(struct kvd *d, const uint8_t *salt, uint32_t len)
{
	return row_get(d, salt, len, -1);
}

int kvd_quota_tenant_find(const struct kvd *d, const char *name)
{
	uint32_t t;

	for (t = 0; t < KVSHM_TENANTS; t++)
		if (d->tenants[t].used &&
		    !strncmp(kvshm_tenants(d->h)[t].name, name, KVSHM_TENANT_NAME))
			return (int)t;
	return -1;
}

struct kvshm_key kvd_quota_root(const struct kvd *d, uint32_t t, uint32_t ns)
{
	const struct kvd_tenant *r = &d->tenants[t < KVSHM_TENANTS ? t : 0];

	return kvshm_key_root(kvshm_ns(d->h)[ns].id, r->salt, r->salt_len);
}

/* ------------------------------------------------------- the accounts */

void kvd_quota_attach(struct kvd *d, struct kvd_client *c)
{
	struct kvd_group *g[2] = { tgroup(d, c->tenant), ngroup(d, c->ns_id) };
	int k;

	for (k = 0; k < 2; k++)
		if (g[k])
			g[k]->clients++;
}

void kvd_quota_detach(struct kvd *d, struct kvd_client *c)
{
	struct kvd_group *g[2] = { tgroup(d, c->tenant), ngroup(d, c->ns_id) };
	int k;

	for (k = 0; k < 2; k++) {
		if (!g[k])
			continue;
		g[k]->clients--;
		g[k]->writing -= c->writing < g[k]->writing ? c->writing : g[k]->writing;
	}
	c->tenant = KVSHM_TENANT_NONE;
}

void kvd_quota_writing(struct kvd *d, struct kvd_client *c, int64_t delta)
{
	struct kvd_group *g[2] = { tgroup(d, c->tenant), ngroup(d, c->ns_id) };
	int k;

	c->writing = (uint32_t)((int64_t)c->writing + delta);
	for (k = 0; k < 2; k++)
		if (g[k])
			g[k]->writing = (uint64_t)((int64_t)g[k]->writing + delta);
}

void kvd_quota_fresh(struct kvd *d, const struct kvd_client *c, uint32_t n)
{
	struct kvd_group *g[2] = { tgroup(d, c->tenant), ngroup(d, c->ns_id) };
	int k;

	for (k = 0; k < 2; k++)
		if (g[k])
			g[k]->fresh += n;
}

void kvd_quota_pinned(struct kvd *d, uint32_t t, uint32_t ns, int64_t delta)
{
	struct kvd_group *g[2] = { tgroup(d, t), ngroup(d, ns) };
	int k;

	for (k = 0; k < 2; k++)
		if (g[k])
			g[k]->pinned = (uint64_t)((int64_t)g[k]->pinned + delta);
}

/* ------------------------------------------------------------ the census */

void kvd_quota_census_begin(struct kvd *d)
{
	uint32_t i;

	if (!d->qstamp_t) {
		d->qstamp_t = calloc(d->h->geo.n_pages, sizeof(*d->qstamp_t));
		d->qstamp_n = calloc(d->h->geo.n_pages, sizeof(*d->qstamp_n));
	}
	for (i = 0; i < KVSHM_TENANTS; i++) {
		d->tgrp[i].count = 0;
		d->tgrp[i].fresh_at_pass = d->tgrp[i].fresh;
	}
	for (i = 0; i < KVD_MAX_NS; i++) {
		d->ngrp[i].count = 0;
		d->ngrp[i].fresh_at_pass = d->ngrp[i].fresh;
	}
}

void kvd_quota_census_page(struct kvd *d, const struct kvd_client *c, uint32_t page)
{
	const struct kvshm_page *p = &kvshm_pages(d->h)[page];
	uint32_t pass = (uint32_t)d->census_pass;

	if (!d->qstamp_t || !d->qstamp_n)
		return;	/* no memory for the stamps: nothing counted, shares err low */
	/* Only a page of its own tenant and namespace counts for them, once
	 * a pass whoever else of them pins it too. */
	if (p->tenant == c->tenant && c->tenant < KVSHM_TENANTS && d->qstamp_t[page] != pass) {
		d->qstamp_t[page] = pass;
		d->tgrp[c->tenant].count++;
	}
	if (p->ns_id == c->ns_id && c->ns_id < KVD_MAX_NS && d->qstamp_n[page] != pass) {
		d->qstamp_n[page] = pass;
		d->ngrp[c->ns_id].count++;
	}
}

static void group_end(struct kvd_group *g)
{
	g->pins = g->count;
	g->fresh -= g->fresh_at_pass < g->fresh ? g->fresh_at_pass : g->fresh;
	g->fresh_at_pass = 0;
}

void kvd_quota_census_end(struct kvd *d)
{
	uint32_t i;

	for (i = 0; i < KVSHM_TENANTS; i++)
		group_end(&d->tgrp[i]);
	for (i = 0; i < KVD_MAX_NS; i++)
		group_end(&d->ngrp[i]);
}

/* ------------------------------------------------------------ the check */

bool kvd_quota_no_insert(const struct kvd *d, const struct kvd_client *c)
{
	const struct kvd_tenant *r = c->tenant < KVSHM_TENANTS ? &d->tenants[c->tenant] : NULL;

	return c->no_insert || (r && r->cfg >= 0 && d->cfg.tenants[r->cfg].no_insert);
}

/* One share: room left of `share` pages for a group holding `held`. */
static int share_room(uint32_t pct, uint32_t share, uint64_t held, uint32_t *n, bool *cut)
{
	if (pct >= 100)
		return 0;	/* a share of the whole pool is no cap: the pool is */
	if (held >= share)
		return -EDQUOT;
	if (*n > share - held) {
		*n = (uint32_t)(share - held);
		*cut = true;
	}
	return 0;
}

int kvd_quota_check(struct kvd *d, struct kvd_client *c, uint32_t *n, bool *cut, char *msg,
		    size_t len)
{
	struct kvshm_stats *st = kvshm_stats(d->h);
	uint32_t t = c->tenant, pct;
	uint64_t held;

	if (t < KVSHM_TENANTS) {
		struct kvshm_tenant *row = &kvshm_tenants(d->h)[t];

		pct = kvd_quota_tenant_share(d, t);
		held = held_of(&d->tgrp[t]);
		if (share_room(pct, kvd_quota_pages(d, pct), held, n, cut)) {
			snprintf(msg, len,
				 "tenant %s holds %llu of the pool's %u pages pinned or writing, its share of %u%% (%s)",
				 row->name, (unsigned long long)held, d->h->geo.n_pages, pct,
				 d->tenants[t].cfg >= 0 && d->cfg.tenants[d->tenants[t].cfg].share
					 ? "its tenant line's share=" : "tenant-share");
			atomic_store_explicit(&row->refused,
					      atomic_load_explicit(&row->refused, RELAXED) + 1, RELAXED);
			atomic_store_explicit(&st->tenant_refused,
					      atomic_load_explicit(&st->tenant_refused, RELAXED) + 1,
					      RELAXED);
			return -EDQUOT;
		}
	}
	if (c->ns_id < KVD_MAX_NS && c->ns_id < d->h->geo.max_ns) {
		struct kvshm_ns_stats *ns = &kvshm_ns_stats(d->h)[c->ns_id];

		pct = d->cfg.namespace_share;
		held = held_of(&d->ngrp[c->ns_id]);
		if (share_room(pct, kvd_quota_pages(d, pct), held, n, cut)) {
			snprintf(msg, len,
				 "namespace %u (%s) holds %llu of the pool's %u pages pinned or writing, its share of %u%% (namespace-share)",
				 c->ns_id, kvshm_ns(d->h)[c->ns_id].model, (unsigned long long)held,
				 d->h->geo.n_pages, pct);
			atomic_store_explicit(&ns->refused,
					      atomic_load_explicit(&ns->refused, RELAXED) + 1, RELAXED);
			atomic_store_explicit(&st->namespace_refused,
					      atomic_load_explicit(&st->namespace_refused, RELAXED) + 1,
					      RELAXED);
			if (t < KVSHM_TENANTS) {
				struct kvshm_tenant *row = &kvshm_tenants(d->h)[t];

				atomic_store_explicit(&row->refused,
						      atomic_load_explicit(&row->refused, RELAXED) + 1,
						      RELAXED);
			}
			return -EDQUOT;
		}
	}
	return 0;
}

void kvd_quota_tick(struct kvd *d)
{
	uint32_t i;

	for (i = 0; i < KVSHM_TENANTS; i++) {
		struct kvshm_tenant *row = &kvshm_tenants(d->h)[i];

		if (!d->tenants[i].used)
			continue;
		atomic_store_explicit(&row->held, held_of(&d->tgrp[i]), RELAXED);
		atomic_store_explicit(&row->pinned, d->tgrp[i].pinned, RELAXED);
		atomic_store_explicit(&row->clients, d->tgrp[i].clients, RELAXED);
		atomic_store_explicit(&row->share, kvd_quota_tenant_share(d, i), RELAXED);
	}
	for (i = 0; i < KVD_MAX_NS && i < d->h->geo.max_ns; i++)
		atomic_store_explicit(&kvshm_ns_stats(d->h)[i].held, held_of(&d->ngrp[i]), RELAXED);
}
