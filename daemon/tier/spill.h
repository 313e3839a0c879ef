/* SPDX-License-Identifier: MIT */
/*
 * spill.h - the NVMe spill tier (tier 1): evicted pages are written to
 * fixed-size slots in files under --spill-dir and read back on demand.
 * All of it runs on the daemon's main thread; the I/O itself goes through
 * spill_io.h. See spill.c for the life of a slot. The daemon reaches it
 * through the tier interface (tier.h), which kvd_spill_open registers;
 * the functions below are that interface's spill side.
 */
#ifndef KVD_SPILL_H
#define KVD_SPILL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../shm/segment.h"

struct kvd_ground;
struct kvd_config;
struct kvd_fetch;
struct kvd_restore;

/* Slots the configured spill-size holds (0 when there is no spill tier),
 * or -1 after a message when the settings do not fit. */
int64_t kvd_spill_slots(const struct kvd_config *cfg);

/*
 * Open the spill area under cfg.spill_dir (creating its files), rebuild
 * the tier-1 index from the slot headers found there (warm restart) and
 * start the I/O engine. The segment and the pool must exist. Returns 0 or
 * -1 after a log line. Does nothing when no spill directory is set.
 */
int kvd_spill_open(struct kvd_ground *g);

/* Finish the writes in flight, then close everything. */
void kvd_spill_close(struct kvd_ground *g);

/* The eventfd the main loop polls, or -1. */
int kvd_spill_fd(const struct kvd_ground *g);

/*
 * Evictor: page is EVICTING and nobody pins it. Hand it to the spill tier
 * (a clean copy already on disk, or a write queued) and return true: the
 * page becomes FREE now or when its write completes, its index entry then
 * naming the slot. False: the tier cannot take it; evict it plainly.
 */
bool kvd_spill_page(struct kvd_ground *g, uint32_t page);

/* Submit what kvd_spill_page queued. */
void kvd_spill_flush(struct kvd_ground *g);

/* Is a spill write of page in flight? (The evictor's ledger scan leaves
 * such a page EVICTING.) */
bool kvd_spill_busy(const struct kvd_ground *g, uint32_t page);

/* Spill writes that can start now without waiting; UINT32_MAX when the
 * tier takes no writes (none, or degraded): eviction need not wait. */
uint32_t kvd_spill_room(const struct kvd_ground *g);

/* Pages whose spill write is in flight (they will be free soon). */
uint32_t kvd_spill_pending(const struct kvd_ground *g);

/* Handle finished I/O (main loop, on the eventfd). */
void kvd_spill_reap(struct kvd_ground *g);

/* Wait until no spill I/O is in flight. */
void kvd_spill_drain(struct kvd_ground *g);

/*
 * Before key is published as a new page: if the index names a tier-1 slot
 * for it, or a page whose spill write is in flight, and that copy is the
 * same block (namespace, parent and tokens), take that entry out: the new
 * page replaces it. A different block under the key is left alone, and
 * the publish then finds the key taken and refuses it as a collision.
 */
void kvd_spill_unindex(struct kvd_ground *g, struct kvshm_key key, struct kvshm_key parent,
		       const uint32_t *tokens, uint32_t ns_id);

/* A page whose spill write is in flight: that write will not make a
 * slot (the page is freed when it completes). False if none. */
bool kvd_spill_cancel(struct kvd_ground *g, uint32_t page);

/* Drop every slot of namespace ns_id (its row is being reused). */
void kvd_spill_forget_ns(struct kvd_ground *g, uint32_t ns_id);
/* A reload changed `eviction`: the slots go over to that policy. 0 or
 * -ENOMEM (the old one stays). */
int kvd_spill_policy(struct kvd_ground *g, int eviction);

/*
 * A restore (tier.h): claim reserves a SPILLED slot of namespace ns_id
 * that the index names (loc) for the fetch; fetch reads the claimed slots
 * into free pages, checks them and makes them READY, and returns when
 * every read is done (0).
 */
int kvd_spill_claim(struct kvd_ground *g, uint32_t ns_id, uint32_t loc, bool full,
		    struct kvd_fetch *f);
int kvd_spill_fetch(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant, struct kvd_fetch *f,
		    uint32_t n, struct kvd_restore *rq);

#endif
