/* SPDX-License-Identifier: MIT */
/*
 * nsstat.h - statistics per namespace, and resetting them (nsstat.c).
 */
#ifndef KVD_NSSTAT_H
#define KVD_NSSTAT_H

#include "reply.h"

/* Per-namespace statistics, and resetting all the counters. */
/* On the tick: fold the live clients' new ledger counts into their
 * namespaces' statistics and count their clients. */
void kvd_nsstat_tick(struct kvd *d);
/* A client leaves: fold what it counted since the last tick. */
void kvd_nsstat_retire(struct kvd *d, struct kvd_client *c);
/* Zero row ns_id's statistics (before the row is written for a
 * namespace). */
void kvd_nsstat_clear(struct kvd *d, uint32_t ns_id);
/* Zero every counter: daemon-wide, per namespace, the top-prefix sketch. */
void kvd_stats_reset(struct kvd *d);
/* RESET from c (before HELLO): reset if c is root or the daemon's own
 * user, else refuse. Always ends c's connection: returns -1. */
kvd_frame_fn kvd_nsstat_reset_req;

#endif
