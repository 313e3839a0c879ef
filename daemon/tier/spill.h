/* SPDX-License-Identifier: MIT */
/*
 * spill.h - the NVMe spill tier (tier 1): evicted pages are written to
 * fixed-size slots in files under --spill-dir and read back on demand.
 * All of it runs on the daemon's main thread; the I/O itself goes through
 * spill_io.h. See spill.c for the life of a slot. The daemon reaches it
 * through the tier interface (tier.h), which kvd_spill_open registers;
 * the tier's own functions are private (spill_int.h).
 */
#ifndef KVD_SPILL_H
#define KVD_SPILL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../shm/segment.h"

struct kvd_ground;
struct kvd_config;

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

/* A reload changed `eviction`: the slots go over to that policy. 0 or
 * -ENOMEM (the old one stays). */
int kvd_spill_policy(struct kvd_ground *g, int eviction);

#endif
