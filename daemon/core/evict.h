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
/* Drain access rings, drop punched-out pages, then evict down to the
 * watermarks. */
void kvd_evict_tick(struct kvd *d);

#endif
