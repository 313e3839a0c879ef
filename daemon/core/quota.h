/* SPDX-License-Identifier: MIT */
/*
 * quota.h - tenants and the shares of the pool a tenant and a namespace
 * may hold (quota.c).
 */
#ifndef KVD_QUOTA_H
#define KVD_QUOTA_H

#include "kvd.h"

/* HELLO accepted: c (its tenant row and namespace set) joins its tenant's
 * and its namespace's accounts. */
void kvd_quota_attach(struct kvd *d, struct kvd_client *c);
/* c leaves (released): out of its tenant's and namespace's accounts. */
void kvd_quota_detach(struct kvd *d, struct kvd_client *c);

/* c's WRITING pages change by delta (granted, published, freed). */
void kvd_quota_writing(struct kvd *d, struct kvd_client *c, int64_t delta);
/* c published n pages, held by its pins since (counted until the census
 * reads its ledger again). */
void kvd_quota_fresh(struct kvd *d, const struct kvd_client *c, uint32_t n);
/* Pages held by pinned prefixes (pin.c) of tenant t, namespace ns: delta. */
void kvd_quota_pinned(struct kvd *d, uint32_t t, uint32_t ns, int64_t delta);

/* The pin census (census.c): a pass begins; c's ledger names `page`
 * (not WRITING); the pass ends. */
void kvd_quota_census_begin(struct kvd *d);
void kvd_quota_census_page(struct kvd *d, const struct kvd_client *c, uint32_t page);
void kvd_quota_census_end(struct kvd *d);

/* Pages of the pool a share of pct percent is (at least 1). */
uint32_t kvd_quota_pages(const struct kvd *d, uint32_t pct);
/* Tenant row t's share (percent): its line's share=, else tenant-share. */
uint32_t kvd_quota_tenant_share(const struct kvd *d, uint32_t t);
/* Pages tenant t (namespace ns) holds as its share counts them. */
uint64_t kvd_quota_tenant_held(const struct kvd *d, uint32_t t);
uint64_t kvd_quota_ns_held(const struct kvd *d, uint32_t ns);

/*
 * May c's ALLOC of *n pages go on as far as its tenant's and namespace's
 * shares go? 0, with *n cut to the room left (and *cut set when it was);
 * or -EDQUOT with msg naming the share, the refusal counted for the
 * tenant (or namespace) and daemon-wide.
 */
int kvd_quota_check(struct kvd *d, struct kvd_client *c, uint32_t *n, bool *cut, char *msg,
		    size_t len);

/* Is c no-insert: its HELLO said so, or its tenant's line does? */
bool kvd_quota_no_insert(const struct kvd *d, const struct kvd_client *c);

/* The tenant row of this salt (the configured tenant of that salt,
 * "unsalted" for none, else a row of its own, "unnamed-ROW"), added when
 * new; -1 when every row is taken by tenants with clients, pins or
 * writing pages. */
int kvd_quota_tenant_salt(struct kvd *d, const uint8_t *salt, uint32_t len);
/* The tenant row named `name`, or -1. */
int kvd_quota_tenant_find(const struct kvd *d, const char *name);
/* The root of tenant row t's key space in namespace row ns (its salt). */
struct kvshm_key kvd_quota_root(const struct kvd *d, uint32_t t, uint32_t ns);

/* (Re)apply the config's tenant lines to the table: rows for every named
 * tenant (also before any of its clients attach), names, shares and
 * no-insert; a row whose line is gone becomes unnamed. At start and at a
 * reload. */
void kvd_quota_configure(struct kvd *d);
/* Per tick: the tenants' and namespaces' gauges into the segment. */
void kvd_quota_tick(struct kvd *d);

#endif
