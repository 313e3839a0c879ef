/* SPDX-License-Identifier: MIT */
/*
 * tier.h - the tiers below the pool, behind one small interface.
 *
 * Tier 0 is the pool (alloc.c, publish.c, evict.c). Each tier below it plugs in with
 * one struct kvd_tier of functions, registered by the tier when it opens:
 *
 *   tier 1  the spill area on local NVMe (spill.c)
 *   tier 2  a remote store shared by hosts (remote.c)
 *
 * Eviction, publish, restore, the event loop and shutdown call the
 * kvd_tiers_* helpers below, which walk the registered tiers in order, so
 * none of them names a tier. A tier in turn never names the core: what it
 * needs of it comes through g->host (struct kvd_tier_host), and it sees
 * only the ground (util/ground.h), never struct kvd. Everything here runs
 * on the daemon's main thread; a tier that does I/O elsewhere (threads, io_uring) hands its
 * completions back through the fd it gives the event loop.
 *
 * A block entering or leaving a tier is reported to the KV event stream
 * (events.h) by the tier, where it happens: the spill tier's page and
 * slot hooks, the remote tier's generic stored hook (medium REMOTE) when
 * a put is stored and the published hook when a fetched block lands in
 * the pool.
 */
#ifndef KVD_TIER_H
#define KVD_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "../../shm/segment.h"
#include "../util/ground.h"


enum kvd_tier_level {
	KVD_TIER_SPILL = 1,
	KVD_TIER_REMOTE = 2,
	KVD_TIER_MAX = 3,	/* levels are 1..KVD_TIER_MAX - 1 */
};

/* Why a page is offered to the tiers. */
enum kvd_tier_put {
	KVD_PUT_EVICT,		/* EVICTING, unpinned: its last moment in the pool */
	KVD_PUT_PUBLISH,	/* just became READY (a client published it) */
};

/* One block of a restore, as the tiers see it. */
struct kvd_fetch {
	struct kvshm_key key;
	struct kvshm_key parent;	/* the block before it in the request */
	const uint32_t *tokens;		/* the client's tokens for it; NULL when
					 * the request carried none (RESTORE) */
	uint32_t ref;			/* the tier's handle, set by claim */
	int32_t *status;		/* the outcome: 0 READY now, or -errno */
};

/* A restore in progress: its reply waits for every tier that deferred. */
struct kvd_restore;

struct kvd_tier {
	const char *name;

	/* The event loop. fd: an fd to poll for readability, or -1; reap:
	 * called when it is readable; tick: every tick (may be NULL). */
	int (*fd)(const struct kvd_ground *g);
	void (*reap)(struct kvd_ground *g);
	void (*tick)(struct kvd_ground *g);

	/*
	 * Writes. put: offer a page (see enum kvd_tier_put). For an EVICT
	 * offer, true means the tier took the page over: it frees it (now or
	 * when its write completes), and no later tier sees it; false leaves
	 * the page to the next tier or to plain eviction. For PUBLISH the
	 * result is ignored. flush: submit what put queued. room: writes the
	 * tier can start now without waiting (UINT32_MAX: eviction need not
	 * wait for it); pending: pages whose write is in flight (free soon);
	 * busy: the page must stay as it is (under a write); drain: wait for
	 * local writes in flight (never for the network). Any may be NULL.
	 */
	bool (*put)(struct kvd_ground *g, uint32_t page, enum kvd_tier_put why);
	void (*flush)(struct kvd_ground *g);
	uint32_t (*room)(const struct kvd_ground *g);
	uint32_t (*pending)(const struct kvd_ground *g);
	bool (*busy)(const struct kvd_ground *g, uint32_t page);
	void (*drain)(struct kvd_ground *g);
	/* cancel: the page's blocks are gone (a client punched it out):
	 * drop a write of it in flight; true if there was one (the tier
	 * frees the page when the cancelled write completes). */
	bool (*cancel)(struct kvd_ground *g, uint32_t page);

	/*
	 * Reads: look a run of keys up, then fetch into pages. claim is asked
	 * for each block of a restore that tier 0 does not hold, in order
	 * (loc: what the index says, kvshm_index_find); it returns 1 (the
	 * tier may have it: f->ref set, the block reserved for the fetch), 0
	 * (not this tier's), or -errno (this tier's, but not now: full says
	 * the request is at its cap; the tier counts the miss). fetch brings
	 * the claimed blocks into pool pages (free pages are there: the caller
	 * evicted first), each READY and indexed or a miss, and returns 0
	 * when every status is set, or 1 when it finishes later and will call
	 * kvd_tiers_fetch_done(g, rq).
	 */
	int (*claim)(struct kvd_ground *g, uint32_t ns_id, uint32_t loc, bool full,
		     struct kvd_fetch *f);
	int (*fetch)(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant, struct kvd_fetch *f,
		     uint32_t n, struct kvd_restore *rq);

	/* Forget. unindex: key is about to be published as a new page; any
	 * copy this tier indexes for the same block (namespace, parent and
	 * tokens) gives way. forget_ns:
	 * namespace ns_id's row is being reused; drop its blocks.
	 * forget_tenant: an operator drops a tenant's blocks of namespace
	 * ns_id (UINT32_MAX: of every one); may be NULL. */
	void (*unindex)(struct kvd_ground *g, struct kvshm_key key, struct kvshm_key parent,
			const uint32_t *tokens, uint32_t ns_id);
	void (*forget_ns)(struct kvd_ground *g, uint32_t ns_id);
	void (*forget_tenant)(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant);

	/* Stats: bring the tier's rows of the segment's stats up to date
	 * (every tick; counters kept off the main thread are folded here,
	 * since only the main thread writes the segment). May be NULL. */
	void (*stats)(struct kvd_ground *g);

	/* Finish what is in flight, close, unregister. */
	void (*close)(struct kvd_ground *g);
};

_Static_assert(KVD_TIER_MAX == KVD_GROUND_TIERS, "ground.h keeps KVD_TIER_MAX tiers");

/* Register / unregister tier `level` with its own state (the tier's open
 * and close do it); the tier finds its state again with kvd_tier_state. */
void kvd_tier_add(struct kvd_ground *g, enum kvd_tier_level level, const struct kvd_tier *t,
		  void *state);
void kvd_tier_remove(struct kvd_ground *g, enum kvd_tier_level level);

/* Tier level's state as it registered it, or NULL when it is not open. */
static inline void *kvd_tier_state(const struct kvd_ground *g, enum kvd_tier_level level)
{
	return g->tier_state[level];
}

/* The evictor: page is EVICTING and unpinned. True: a tier took it. */
bool kvd_tiers_offer_evict(struct kvd_ground *g, uint32_t page);
/* publish.c: page was just published READY. */
void kvd_tiers_offer_publish(struct kvd_ground *g, uint32_t page);
void kvd_tiers_flush(struct kvd_ground *g);
uint32_t kvd_tiers_room(const struct kvd_ground *g);
uint32_t kvd_tiers_pending(const struct kvd_ground *g);
bool kvd_tiers_busy(const struct kvd_ground *g, uint32_t page);
void kvd_tiers_drain(struct kvd_ground *g);
void kvd_tiers_unindex(struct kvd_ground *g, struct kvshm_key key, struct kvshm_key parent,
		       const uint32_t *tokens, uint32_t ns_id);
void kvd_tiers_forget_ns(struct kvd_ground *g, uint32_t ns_id);
void kvd_tiers_forget_tenant(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant);

/* The event loop: tier level's fd (or -1), its completions, the tick. */
int kvd_tiers_fd(const struct kvd_ground *g, enum kvd_tier_level level);
void kvd_tiers_reap(struct kvd_ground *g, enum kvd_tier_level level);
void kvd_tiers_tick(struct kvd_ground *g);

/* Close every tier, lowest last. */
void kvd_tiers_close(struct kvd_ground *g);

/*
 * Reads, for the core's restore (core/restore.c). claim: the first tier
 * that claims block f (see claim above): its level, 0 when none does, or
 * that tier's -errno. fetch: tier level's fetch of the n blocks it
 * claimed (0: done, 1: it calls kvd_tiers_fetch_done(g, rq) later).
 */
int kvd_tiers_claim(struct kvd_ground *g, uint32_t ns_id, uint32_t loc, bool full, struct kvd_fetch *f);
int kvd_tiers_fetch(struct kvd_ground *g, enum kvd_tier_level level, uint32_t ns_id,
		    uint32_t tenant, struct kvd_fetch *f, uint32_t n, struct kvd_restore *rq);

/* A tier that deferred its part of rq is done (its statuses are set). */
void kvd_tiers_fetch_done(struct kvd_ground *g, struct kvd_restore *rq);

/* A punched-out page: cancel a tier's write of it (true: one did). */
bool kvd_tiers_cancel(struct kvd_ground *g, uint32_t page);

/*
 * What a tier may ask of the core, handed to the tiers as g->host (set
 * before any tier opens): ns finds or adds a namespace row, as
 * HELLO does (a warm restart's blocks name theirs; may_reclaim false);
 * fetch_done finishes a restore whose tiers are all done; ready tells
 * the eviction policy that a page the tier filled is READY now (restored
 * from a slot, fetched from a server).
 */
struct kvd_tier_host {
	int (*ns)(struct kvd_ground *g, const struct kvshm_ns *want, bool may_reclaim);
	void (*fetch_done)(struct kvd_ground *g, struct kvd_restore *rq);
	void (*ready)(struct kvd_ground *g, uint32_t page);
};

#endif
