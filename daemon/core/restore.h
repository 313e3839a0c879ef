/* SPDX-License-Identifier: MIT */
/*
 * restore.h - RESTORE and FETCH: blocks from the tiers into the pool
 * (restore.c).
 */
#ifndef KVD_RESTORE_H
#define KVD_RESTORE_H

#include "reply.h"

/*
 * RESTORE (keys only) or FETCH (parent, keys and tokens) from client c:
 * bring the blocks the tiers hold into pool pages and reply with one
 * status per block, now or, when a tier deferred, once it is done (the
 * client's further frames wait meanwhile). Returns 0, or -1 if c is
 * closing.
 */
kvd_frame_fn kvd_restore;
/* The core's side of the tier interface (d->tier_host). */
extern const struct kvd_tier_host kvd_core_tier_host;

#endif
