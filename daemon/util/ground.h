/* SPDX-License-Identifier: MIT */
/*
 * ground.h - the ground-floor context: what the lower floors (the tiers,
 * KV events, the pools, the policies) may see of the daemon. Never the
 * whole daemon (struct kvd, core/kvd.h): the settings, the segment, the
 * pool, what a tier may ask of the core (its host), the registered tiers
 * with each one's own state, and the event stream.
 *
 * The core embeds one (struct kvd's g) and binds it to its own settings,
 * segment and pool (kvd_ground_bind); a callback the core answers gets
 * the ground back and finds the daemon around it. Everything here is the
 * main thread's.
 */
#ifndef KVD_GROUND_H
#define KVD_GROUND_H

#include <stdatomic.h>
#include <stdint.h>

#include "settings.h"

struct kvshm_header;
struct kvd_pool;
struct kvd_tier;
struct kvd_tier_host;
struct kvd_events;

/* Tier levels kept here: tier.h's KVD_TIER_MAX (checked there). */
#define KVD_GROUND_TIERS 3

struct kvd_ground {
	const struct kvd_config *cfg;	/* the settings, reloads included */
	struct kvshm_header *h;		/* the segment (the main thread writes it) */
	struct kvd_pool *pool;		/* the pool's memory */
	/* n_pages: punched out by a client (core/evict.c), NULL until the
	 * first hole; a tier evicts such a page plainly and clears it. */
	uint8_t *damaged;
	/* What a tier may ask of the core (core/restore.c's). */
	const struct kvd_tier_host *host;
	/* The tiers below the pool, by level (tier.c): each one's functions
	 * and its own state, as it registered them; NULL: none. */
	const struct kvd_tier *tier[KVD_GROUND_TIERS];
	void *tier_state[KVD_GROUND_TIERS];
	struct kvd_events *events;	/* KV events (obs/events.c), or NULL */
};

/* Single-writer stat update (relaxed; see kvshm_stats). */
static inline void kvd_stat_add(_Atomic uint64_t *c, int64_t v)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)v,
			      memory_order_relaxed);
}

#endif
