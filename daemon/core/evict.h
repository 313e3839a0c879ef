/* SPDX-License-Identifier: MIT */
/*
 * evict.h - keeping free pages above the low watermark (evict.c).
 */
#ifndef KVD_EVICT_H
#define KVD_EVICT_H

#include "kvd.h"

/* Free up to `want` READY pages nobody pins; returns how many. */
/* may_wait: the caller needs the pages now and waits for spill writes;
 * without it (the tick), eviction takes only what the spill tier can
 * start writing at once. */
uint32_t kvd_evict(struct kvd *d, uint32_t want, bool may_wait);
/* Evict every READY page of namespace ns_id that nobody pins; returns how
 * many are left (pinned or writing). */
uint32_t kvd_evict_ns(struct kvd *d, uint32_t ns_id);
/* The same for the pages of namespace ns_id (UINT32_MAX: any) and tenant
 * row `tenant` (UINT32_MAX: any), spill slots included. */
uint32_t kvd_evict_where(struct kvd *d, uint32_t ns_id, uint32_t tenant);
/* Drain access rings, drop punched-out pages, then evict down to the
 * watermarks. */
void kvd_evict_tick(struct kvd *d);
/* Feed c's access ring to the policy, in the order c wrote it (before
 * its ALLOC evicts and its PUBLISH inserts, so its hits of this request
 * count before its new blocks). Bounded by KVSHM_RING. */
void kvd_evict_drain(struct kvd *d, struct kvd_client *c);
/* A reload changed `eviction`: the pool's cached pages go over to that
 * policy (kvd_policy_switch). 0 or -ENOMEM (the old one stays). */
int kvd_evict_policy(struct kvd *d, int eviction);
/* Page just became READY (published, restored, fetched): it enters the
 * eviction order, under its parent's page when the pool holds that. */
void kvd_evict_insert(struct kvd *d, uint32_t page);
/* Page just restored or fetched by a tier for a client's RESTORE/FETCH:
 * READY, and not pinned until that client has the reply and pins it, so
 * eviction passes it by for KVD_SPARE_MS (evict.c says why). */
#define KVD_SPARE_MS 2000u
void kvd_evict_spare(struct kvd *d, uint32_t page);

#endif
