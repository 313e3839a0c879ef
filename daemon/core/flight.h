/* SPDX-License-Identifier: MIT */
/*
 * flight.h - single flight, the daemon side (flight.c).
 */
#ifndef KVD_FLIGHT_H
#define KVD_FLIGHT_H

#include "kvd.h"

/* Is the claimed block in flight by a client other than c (and not a page
 * of ranks writing slices that c is to join), or cached? */
bool kvd_flight_taken(struct kvd *d, const struct kvd_client *c,
		      const struct kvproto_claim *cl);
/* Before a page may leave flight (publish, free, reclaim): note its
 * writer; _key notes the writer of the page the index names for key. */
void kvd_flight_note(struct kvd *d, uint32_t page);
void kvd_flight_note_key(struct kvd *d, struct kvshm_key key);
/* After the change: bump each noted writer's flight word and wake. */
void kvd_flight_wake(struct kvd *d);
/* c's connection ended while its process lives on: its announced pages
 * leave flight (they stay its own, WRITING) and their waiters wake to a
 * miss at once instead of waiting for its exit or their timeout. */
void kvd_flight_drop(struct kvd *d, const struct kvd_client *c);
/* Fold the clients' wait counters into the stats; keep a leaver's. */
void kvd_flight_fold(struct kvd *d);
void kvd_flight_retire(struct kvd *d, const struct kvd_client *c);

#endif
