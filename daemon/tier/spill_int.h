/* SPDX-License-Identifier: MIT */
/*
 * spill_int.h - the spill tier's state, shared by its files (private):
 * spill.c (the tier's functions: evict, restore, forget), spill_table.c
 * (the slot table), spill_ops.c (slot reads and writes in flight) and
 * spill_open.c (the area's files, the warm restart, open and close).
 */
#ifndef KVD_SPILL_INT_H
#define KVD_SPILL_INT_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../shm/index.h"
#include "../../shm/page.h"
#include "../obs/events.h"
#include "../pool/pool.h"
#include "../policy/policy.h"
#include "../util/clock.h"
#include "../util/log.h"
#include "spill.h"
#include "../../fmt/spill_slot.h"
#include "spill_io.h"
#include "tier.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#define OPS 32			/* slots being written or read at once */
#define FILE_BYTES (1ull << 30)	/* slots per file: about 1 GiB of them */
#define POOL_AREA (1ull << 30)	/* io_uring registers at most 1 GiB a buffer */
#define OWNER_SPILL UINT32_MAX	/* page owner while a restore fills it */

enum { OP_FREE, OP_WRITE, OP_READ };

struct sslot {
	uint8_t state;		/* enum kvshm_slot_state */
	uint32_t page;		/* BUSY: the page; BACKING: the page it backs */
	uint32_t pgen;		/* BACKING: that page's gen */
	uint64_t seq;		/* write order, from the header */
	struct kvshm_key tok;	/* keyed hash of the block's tokens */
};

struct sop {
	uint8_t kind;
	uint8_t parts;		/* I/Os still in flight */
	bool cancel;		/* the page's entry went to a newer page */
	int err;		/* first failed part */
	uint32_t page, gen, slot;
	uint64_t len;		/* payload bytes on disk (kvd_spill_aligned) */
	int32_t *status;	/* restore: where the outcome goes */
};

struct kvd_spill {
	int *fds;
	uint32_t nfiles, spf;	/* files, slots per file */
	uint32_t n;		/* slots */
	uint64_t hdr_bytes, page_bytes, slot_bytes;
	struct sslot *s;
	uint32_t *freel, nfree;
	struct kvd_policy pol;	/* which slot is recycled first (policy.h) */
	uint32_t *page_op;	/* page -> op + 1 while its write is in flight */
	uint32_t *backing;	/* page -> slot + 1 of its clean copy */
	struct kvd_sio *io;
	enum kvd_sio_kind kind;
	bool writes_on;
	struct sop ops[OPS];
	uint32_t opfree[OPS], nopfree;
	uint8_t *staging;	/* OPS x hdr_bytes, kvd_spill_aligned */
	uint64_t seq;
	uint32_t pages_per_area;
	unsigned nareas;	/* pool areas; staging is area nareas */
	/* cuda pool: payloads go through this pinned host ring (OPS pages),
	 * registered area 0; NULL on a host pool (the pool is registered). */
	uint8_t *stage;
	uint32_t writes, reads;	/* ops in flight by kind */
	bool io_dead;		/* io_uring stopped taking submissions: the
				 * ops in flight are abandoned, never reaped */
	char dir[PATH_MAX];
	uint64_t tok_seed;	/* secret per run: see tok_hash */
};

/* The tier's state, as it registered it (NULL: not open). */
static inline struct kvd_spill *spill_of(const struct kvd_ground *g)
{
	return kvd_tier_state(g, KVD_TIER_SPILL);
}

/*
 * The tokens of a spilled block live on disk only; to tell a publish of
 * the same block from a forgery under its key without reading the disk,
 * each slot keeps a 128-bit hash of its tokens, seeded with a secret of
 * this run that no client knows (so none can aim at a collision).
 */
static inline struct kvshm_key tok_hash(const struct kvd_spill *sp, const uint32_t *t, uint32_t bt)
{
	XXH128_hash_t h = XXH3_128bits_withSeed(t, (size_t)bt * sizeof(*t), sp->tok_seed);

	return (struct kvshm_key){ h.low64, h.high64 };
}

static inline struct kvshm_stats *st_of(struct kvd_ground *g)
{
	return kvshm_stats(g->h);
}

/* The tier's functions (its struct kvd_tier, spill_open.c). */
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

/* spill_table.c */
void kvd_spill_shared_set(struct kvd_ground *g, uint32_t slot, uint32_t state,
			  const struct kvshm_key *key, const struct kvshm_key *parent,
			  uint32_t ns_id, uint32_t tenant);
void kvd_spill_slot_free(struct kvd_ground *g, uint32_t slot);
void kvd_spill_slot_forget(struct kvd_ground *g, uint32_t slot);
bool kvd_spill_backing_live(struct kvd_ground *g, uint32_t slot);
void kvd_spill_backing_drop(struct kvd_ground *g, uint32_t slot);
uint32_t kvd_spill_slot_get(struct kvd_ground *g);

/* spill_ops.c */
off_t kvd_spill_slot_off(const struct kvd_spill *sp, uint32_t slot);
uint8_t *kvd_spill_page_at(struct kvd_ground *g, uint32_t page);
uint8_t *kvd_spill_payload_of(struct kvd_ground *g, uint32_t idx, uint32_t page);
uint64_t kvd_spill_aligned(uint64_t n);
bool kvd_spill_reap_wait(struct kvd_ground *g);
struct sop *kvd_spill_op_get(struct kvd_ground *g, uint32_t *idx);
void kvd_spill_op_put(struct kvd_spill *sp, uint32_t idx);
int kvd_spill_op_queue(struct kvd_ground *g, uint32_t idx, bool write);
void kvd_spill_reap_done(void *arg, uint64_t tag, int res);

/* spill.c */
void kvd_spill_forget_tenant(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant);

#endif
