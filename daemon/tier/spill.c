// SPDX-License-Identifier: MIT
/*
 * spill.c - the spill tier: pool pages evicted to NVMe slots, restored on
 * demand, found again after a restart.
 *
 * The life of a slot (daemon-private state; the shared slot table in the
 * segment shows clients only whether a slot is SPILLED):
 *
 *   FREE --(evictor picks a page)--> BUSY (header + payload writes in
 *        flight; the page stays EVICTING, unpinnable)
 *   BUSY --(both writes done)--> SPILLED: the page's index entry moves to
 *        the slot in place, the page goes FREE
 *   SPILLED --(RESTORE)--> BUSY (reads in flight into a fresh page)
 *        --(header and payload checksums good)--> BACKING: the page is
 *        READY, the index names it again, the slot keeps a clean copy
 *   BACKING --(the page is evicted again, unchanged)--> SPILLED, no I/O
 *   SPILLED / BACKING --(area full: CLOCK over slots)--> FREE
 *   any failed check --> FREE, counted, the block reported as a miss
 *
 * A write error (disk full, EIO, the directory gone) stops further spill
 * writes with one log line; eviction goes on as it would without the tier.
 * Restores block the main loop for the reads of one RESTORE (a few
 * milliseconds per hundred megabytes on NVMe); spill writes never do
 * unless an ALLOC has nothing else to wait for.
 */
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
	uint64_t len;		/* payload bytes on disk (aligned) */
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
	uint8_t *staging;	/* OPS x hdr_bytes, aligned */
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
static struct kvshm_key tok_hash(const struct kvd_spill *sp, const uint32_t *t, uint32_t bt)
{
	XXH128_hash_t h = XXH3_128bits_withSeed(t, (size_t)bt * sizeof(*t), sp->tok_seed);

	return (struct kvshm_key){ h.low64, h.high64 };
}

static struct kvshm_stats *st_of(struct kvd_ground *g)
{
	return kvshm_stats(g->h);
}

int64_t kvd_spill_slots(const struct kvd_config *cfg)
{
	uint64_t slot;

	if (!cfg->spill_dir[0])
		return 0;
	slot = kvd_slot_hdr_bytes(cfg->block_tokens) + cfg->page_size;
	if (cfg->spill_size / slot < 1) {
		kvd_err("spill-size %llu: smaller than one slot (%llu bytes: header and page-size)",
			(unsigned long long)cfg->spill_size, (unsigned long long)slot);
		return -1;
	}
	if (cfg->spill_size / slot >= KVSHM_LOC_SLOT - 2) {
		kvd_err("spill-size %llu: more than 2^31 slots; raise page-size",
			(unsigned long long)cfg->spill_size);
		return -1;
	}
	return (int64_t)(cfg->spill_size / slot);
}

/* ------------------------------------------------------------ slot table */

/* The slot of `parent`'s block when the tier holds it, else
 * KVD_POLICY_NONE. */
static uint32_t parent_slot(const struct kvd_ground *g, const struct kvshm_key *parent)
{
	uint32_t loc = kvshm_index_find(g->h, *parent), ps = loc & ~KVSHM_LOC_SLOT;

	if (!kvshm_loc_is_slot(loc) || ps >= spill_of(g)->n ||
	    spill_of(g)->s[ps].state == KVSHM_SLOT_FREE)
		return KVD_POLICY_NONE;
	return ps;
}

static uint32_t slot_parent(void *arg, uint32_t slot)
{
	const struct kvd_ground *g = arg;

	return parent_slot(g, &kvshm_slots(g->h)[slot].parent);
}

int kvd_spill_policy(struct kvd_ground *g, int eviction)
{
	return spill_of(g) ? kvd_policy_switch(&spill_of(g)->pol, eviction, slot_parent, g) : 0;
}

static void shared_set(struct kvd_ground *g, uint32_t slot, uint32_t state,
		       const struct kvshm_key *key, const struct kvshm_key *parent,
		       uint32_t ns_id, uint32_t tenant)
{
	struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

	if (key) {
		/* New identity: gen first, then the fields, then the state. */
		atomic_store_explicit(&e->state, KVSHM_SLOT_BUSY, memory_order_release);
		atomic_store_explicit(&e->gen, atomic_load_explicit(&e->gen, memory_order_relaxed) + 1,
				      memory_order_release);
		atomic_thread_fence(memory_order_release);
		__atomic_store_n(&e->ns_id, ns_id, __ATOMIC_RELAXED);
		__atomic_store_n(&e->tenant, tenant, __ATOMIC_RELAXED);
		kvshm_store_key(&e->key, *key);
		kvshm_store_key(&e->parent, *parent);
	}
	atomic_store_explicit(&e->state, state, memory_order_release);
	spill_of(g)->s[slot].state = (uint8_t)state;
	if (key) {
		/* A new block in the tier: under its parent's slot, if the
		 * tier holds that. */
		kvd_policy_insert(&spill_of(g)->pol, slot, parent_slot(g, parent),
				  key->lo ^ key->hi ^ ns_id);
	}
}

static void slot_free(struct kvd_ground *g, uint32_t slot)
{
	struct kvd_spill *sp = spill_of(g);
	struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

	atomic_store_explicit(&e->state, KVSHM_SLOT_FREE, memory_order_release);
	atomic_store_explicit(&e->gen, atomic_load_explicit(&e->gen, memory_order_relaxed) + 1,
			      memory_order_release);
	sp->s[slot].state = KVSHM_SLOT_FREE;
	kvd_policy_remove(&sp->pol, slot);
	sp->freel[sp->nfree++] = slot;
}

/* A SPILLED slot leaves the index and the tier. */
static void slot_forget(struct kvd_ground *g, uint32_t slot)
{
	struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

	if (!kvshm_index_remove(g->h, kvshm_load_key(&e->key), KVSHM_LOC_SLOT | slot))
		kvd_stat_add(&st_of(g)->index_entries, -1);
	kvd_stat_add(&st_of(g)->pages_spilled, -1);
	slot_free(g, slot);
}

/* Is BACKING slot s still the clean copy of its page? */
static bool backing_live(struct kvd_ground *g, uint32_t slot)
{
	const struct sslot *s = &spill_of(g)->s[slot];
	const struct kvshm_page *p = &kvshm_pages(g->h)[s->page];

	return atomic_load_explicit(&p->gen, memory_order_relaxed) == s->pgen &&
	       atomic_load_explicit(&p->state, memory_order_relaxed) != KVSHM_PAGE_FREE;
}

static void backing_drop(struct kvd_ground *g, uint32_t slot)
{
	struct kvd_spill *sp = spill_of(g);

	if (sp->backing[sp->s[slot].page] == slot + 1)
		sp->backing[sp->s[slot].page] = 0;
	slot_free(g, slot);
}

/* A free slot: the free list, else the one the eviction policy gives up
 * first (the pool's policy, over the slots). */
static uint32_t slot_get(struct kvd_ground *g)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t i;

	if (sp->nfree)
		return sp->freel[--sp->nfree];
	for (i = 0; i < 2 * sp->n; i++) {
		uint32_t k = kvd_policy_pick(&sp->pol);
		struct sslot *s;

		if (k == KVD_POLICY_NONE)
			break;
		s = &sp->s[k];
		if (s->state == KVSHM_SLOT_BUSY) {
			kvd_policy_keep(&sp->pol, k);	/* being read */
			continue;
		}
		if (s->state == KVSHM_SLOT_FREE) {
			kvd_policy_remove(&sp->pol, k);
			continue;
		}
		if (s->state == KVSHM_SLOT_BACKING && !backing_live(g, k)) {
			backing_drop(g, k);
			return sp->freel[--sp->nfree];
		}
		if (s->state == KVSHM_SLOT_SPILLED) {
			kvd_events_slot_gone(g, k);
			slot_forget(g, k);
		} else {
			backing_drop(g, k);
		}
		kvd_stat_add(&st_of(g)->spill_recycled, 1);
		return sp->freel[--sp->nfree];
	}
	return UINT32_MAX;
}

/* ------------------------------------------------------------ I/O */

static off_t slot_off(const struct kvd_spill *sp, uint32_t slot)
{
	return (off_t)(KVD_SPILL_ALIGN + (uint64_t)(slot % sp->spf) * sp->slot_bytes);
}

static int slot_fd(const struct kvd_spill *sp, uint32_t slot)
{
	return sp->fds[slot / sp->spf];
}

static uint8_t *page_at(struct kvd_ground *g, uint32_t page)
{
	return (uint8_t *)g->pool->mem.base + (uint64_t)page * spill_of(g)->page_bytes;
}

/* Where op idx's payload is read or written: the pool page itself, or its
 * staging slot (cuda pool). */
static uint8_t *payload_of(struct kvd_ground *g, uint32_t idx, uint32_t page)
{
	struct kvd_spill *sp = spill_of(g);

	return sp->stage ? sp->stage + (uint64_t)idx * sp->page_bytes : page_at(g, page);
}

static uint64_t aligned(uint64_t n)
{
	return (n + KVD_SPILL_ALIGN - 1) / KVD_SPILL_ALIGN * KVD_SPILL_ALIGN;
}

static void reap_done(void *arg, uint64_t tag, int res);
static void degrade(struct kvd_ground *g, int err);

/*
 * Wait for at least one completion and handle what finished. False when
 * nothing can finish: nothing in flight, or the kernel keeps refusing the
 * submission (then the tier stops: the ops in flight are abandoned, their
 * pages stay out of use, and nothing is reaped again, so no completion
 * can touch state that was given up).
 */
static bool reap_wait(struct kvd_ground *g)
{
	struct kvd_spill *sp = spill_of(g);

	if (sp->io_dead)
		return false;
	if (kvd_sio_reap(sp->io, true, reap_done, g))
		return true;
	if (kvd_sio_inflight(sp->io)) {
		sp->io_dead = true;
		kvd_err("spill: io_uring keeps refusing submissions; the spill tier stops");
		degrade(g, -EIO);
	}
	return false;
}

/* An op, waiting for a running one to finish when all are busy. */
static struct sop *op_get(struct kvd_ground *g, uint32_t *idx)
{
	struct kvd_spill *sp = spill_of(g);

	while (!sp->io_dead && (!sp->nopfree || kvd_sio_room(sp->io) < 2))
		if (!reap_wait(g))
			break;
	if (sp->io_dead || !sp->nopfree || kvd_sio_room(sp->io) < 2)
		return NULL;
	*idx = sp->opfree[--sp->nopfree];
	memset(&sp->ops[*idx], 0, sizeof(sp->ops[*idx]));
	return &sp->ops[*idx];
}

static void op_put(struct kvd_spill *sp, uint32_t idx)
{
	sp->ops[idx].kind = OP_FREE;
	sp->opfree[sp->nopfree++] = idx;
}

/* Queue the header and payload I/O of op idx. */
static int op_queue(struct kvd_ground *g, uint32_t idx, bool write)
{
	struct kvd_spill *sp = spill_of(g);
	struct sop *o = &sp->ops[idx];
	int fd = slot_fd(sp, o->slot);
	off_t off = slot_off(sp, o->slot);
	int rc;

	/* tag: op index and part (0 header, 1 payload) */
	o->parts = 0;
	rc = kvd_sio_queue(sp->io, fd, write, sp->staging + (uint64_t)idx * sp->hdr_bytes,
			   sp->hdr_bytes, off, sp->nareas, (uint64_t)idx << 1);
	if (rc)
		return rc;	/* nothing queued: the caller gives the op back */
	o->parts = 1;
	if (kvd_sio_queue(sp->io, fd, write, payload_of(g, idx, o->page), o->len,
			  off + (off_t)sp->hdr_bytes, sp->stage ? 0 : o->page / sp->pages_per_area,
			  (uint64_t)idx << 1 | 1))
		o->err = -EIO;	/* the header part completes it, as failed */
	else
		o->parts = 2;
	return 0;
}

static void degrade(struct kvd_ground *g, int err)
{
	struct kvd_spill *sp = spill_of(g);

	kvd_stat_add(&st_of(g)->spill_errors, 1);
	if (!sp->writes_on)
		return;
	sp->writes_on = false;
	atomic_store_explicit(&st_of(g)->spill_enabled, 0, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->spill_path, KVSHM_SPILL_DEGRADED, memory_order_relaxed);
	kvd_err("spill: writing to %s failed: %s; no more spilling, eviction goes on without it (restores go on)",
		sp->dir, strerror(-err));
}

static void write_done(struct kvd_ground *g, uint32_t idx)
{
	struct kvd_spill *sp = spill_of(g);
	struct sop *o = &sp->ops[idx];
	struct kvshm_page *p = &kvshm_pages(g->h)[o->page];

	if (sp->page_op[o->page] == idx + 1)
		sp->page_op[o->page] = 0;
	sp->writes--;
	if (o->err && !o->cancel)
		degrade(g, o->err);
	if (o->err || o->cancel) {
		kvd_events_page_gone(g, o->page);
		kvshm_page_evict_finish(g->h, o->page);
		slot_free(g, o->slot);
		op_put(sp, idx);
		return;
	}
	shared_set(g, o->slot, KVSHM_SLOT_SPILLED, &p->key, &p->parent, p->ns_id, p->tenant);
	if (kvshm_page_evict_to_slot(g->h, o->page, o->slot)) {
		/* Not indexed any more: nothing to keep. */
		kvd_events_page_gone(g, o->page);
		kvshm_page_evict_finish(g->h, o->page);
		slot_free(g, o->slot);
	} else {
		kvd_events_spilled(g, o->page, o->slot);
		kvd_stat_add(&st_of(g)->spills, 1);
		kvd_stat_add(&st_of(g)->pages_spilled, 1);
		kvd_stat_add(&st_of(g)->spill_write_bytes, (int64_t)(sp->hdr_bytes + o->len));
	}
	op_put(sp, idx);
}

static void read_done(struct kvd_ground *g, uint32_t idx)
{
	struct kvd_spill *sp = spill_of(g);
	struct sop *o = &sp->ops[idx];
	const uint8_t *hb = sp->staging + (uint64_t)idx * sp->hdr_bytes;
	struct kvshm_slot *e = &kvshm_slots(g->h)[o->slot];
	struct kvshm_key key = kvshm_load_key(&e->key), parent = kvshm_load_key(&e->parent);
	const struct kvshm_ns *ns = &kvshm_ns(g->h)[e->ns_id];
	uint32_t bt = g->h->geo.block_tokens;
	struct kvd_slot_hdr h;
	const char *why = NULL;
	int rc = o->err;

	sp->reads--;
	if (!rc) {
		rc = kvd_slot_hdr_check(hb, sp->hdr_bytes, bt, sp->page_bytes, &why);
		memcpy(&h, hb, sizeof(h));
		if (!rc && (!kvshm_key_eq(h.key, key) || !kvshm_key_eq(h.parent, parent) ||
			    !kvshm_key_eq(h.ns.id, ns->id)))
			rc = -EBADMSG, why = "slot holds another block than the index says";
		if (!rc && kvd_payload_check(payload_of(g, idx, o->page), h.payload_bytes) !=
			   h.payload_check)
			rc = -EBADMSG, why = "payload checksum mismatch";
		/* cuda pool: checked in staging, then into the GPU page. */
		if (!rc && sp->stage &&
		    kvd_pool_copy_in(g->pool, o->page, 1, payload_of(g, idx, o->page)))
			rc = -EIO;
		if (rc > 0)
			rc = -EBADMSG, why = "slot is empty";
	}
	if (!rc)
		rc = kvshm_page_restore(g->h, o->page, o->gen, OWNER_SPILL, o->slot, key, parent,
					(const uint32_t *)(hb + sizeof(h)));
	if (rc) {
		kvd_stat_add(&st_of(g)->restore_misses, 1);
		kvshm_page_free(g->h, o->page, o->gen, OWNER_SPILL);
		if (rc == -EBADMSG) {
			kvd_warn("spill: slot %u dropped on restore: %s; served as a miss", o->slot,
				 why);
			kvd_stat_add(&st_of(g)->spill_dropped, 1);
			kvd_events_slot_gone(g, o->slot);
			slot_forget(g, o->slot);
		} else {
			/* The copy on disk may be whole: keep it for later. */
			kvd_warn("spill: slot %u: read failed: %s; served as a miss", o->slot,
				 strerror(-rc));
			kvd_stat_add(&st_of(g)->spill_errors, 1);
			shared_set(g, o->slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
		}
		*o->status = rc == -EBADMSG ? -EBADMSG : -EIO;
	} else {
		struct sslot *s = &sp->s[o->slot];

		shared_set(g, o->slot, KVSHM_SLOT_BACKING, NULL, NULL, 0, 0);
		s->page = o->page;
		s->pgen = o->gen;
		kvd_policy_touch(&sp->pol, o->slot);
		sp->backing[o->page] = o->slot + 1;
		g->host->ready(g, o->page);
		kvd_events_restored(g, o->page, o->slot);
		kvd_stat_add(&st_of(g)->pages_spilled, -1);
		kvd_stat_add(&st_of(g)->restores, 1);
		kvd_stat_add(&st_of(g)->spill_read_bytes, (int64_t)(sp->hdr_bytes + o->len));
		*o->status = 0;
	}
	op_put(sp, idx);
}

static void reap_done(void *arg, uint64_t tag, int res)
{
	struct kvd_ground *g = arg;
	struct kvd_spill *sp = spill_of(g);
	uint32_t idx = (uint32_t)(tag >> 1);
	struct sop *o = &sp->ops[idx];
	uint64_t want = tag & 1 ? o->len : sp->hdr_bytes;

	if (res < 0 && !o->err)
		o->err = res;
	else if (res >= 0 && !o->err && (uint64_t)res != want)
		o->err = -EIO;	/* short transfer */
	if (--o->parts)
		return;
	if (o->kind == OP_WRITE)
		write_done(g, idx);
	else
		read_done(g, idx);
}

/* ------------------------------------------------------------ evictor */

bool kvd_spill_page(struct kvd_ground *g, uint32_t page)
{
	struct kvd_spill *sp = spill_of(g);
	struct kvshm_page *p = &kvshm_pages(g->h)[page];
	const struct kvshm_ns *ns;
	uint32_t slot, idx;
	struct sop *o;

	if (!sp || sp->page_op[page])
		return false;	/* (a write in flight: never a second one) */
	if (g->damaged && g->damaged[page]) {
		/* Punched out by a client: its contents are gone; evict it
		 * plainly (and any clean copy on disk stays good). */
		g->damaged[page] = 0;
		return false;
	}
	slot = sp->backing[page];
	if (slot--) {
		sp->backing[page] = 0;
		if (sp->s[slot].state == KVSHM_SLOT_BACKING && sp->s[slot].page == page &&
		    backing_live(g, slot)) {
			/* A clean copy is on disk: no write. */
			shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			if (!kvshm_page_evict_to_slot(g->h, page, slot)) {
				kvd_events_spilled(g, page, slot);
				kvd_stat_add(&st_of(g)->pages_spilled, 1);
				kvd_stat_add(&st_of(g)->spill_clean, 1);
				return true;
			}
			slot_free(g, slot);
			return false;
		}
	}
	if (!sp->writes_on || sp->io_dead)
		return false;
	o = op_get(g, &idx);
	if (!o)
		return false;
	slot = slot_get(g);
	if (slot == UINT32_MAX) {
		op_put(sp, idx);
		return false;
	}
	ns = &kvshm_ns(g->h)[p->ns_id];
	if (sp->stage && kvd_pool_copy_out(g->pool, page, 1, payload_of(g, idx, page))) {
		slot_free(g, slot);
		op_put(sp, idx);
		return false;
	}
	o->kind = OP_WRITE;
	o->page = page;
	o->slot = slot;
	o->len = aligned(ns->page_bytes);
	kvd_slot_hdr_fill(sp->staging + (uint64_t)idx * sp->hdr_bytes, sp->hdr_bytes, ++sp->seq,
			  ns, p->key, p->parent, kvshm_tokens(g->h, page), g->h->geo.block_tokens,
			  ns->page_bytes, kvd_payload_check(payload_of(g, idx, page), ns->page_bytes));
	sp->s[slot].seq = sp->seq;
	sp->s[slot].page = page;
	sp->s[slot].tok = tok_hash(sp, kvshm_tokens(g->h, page), g->h->geo.block_tokens);
	shared_set(g, slot, KVSHM_SLOT_BUSY, NULL, NULL, 0, 0);
	if (op_queue(g, idx, true)) {
		/* Cannot happen: op_get saw room for both parts. */
		shared_set(g, slot, KVSHM_SLOT_FREE, NULL, NULL, 0, 0);
		slot_free(g, slot);
		op_put(sp, idx);
		return false;
	}
	sp->page_op[page] = idx + 1;
	sp->writes++;
	return true;
}

void kvd_spill_flush(struct kvd_ground *g)
{
	/* A refused submit stays queued and is retried by the next reap. */
	if (spill_of(g) && !spill_of(g)->io_dead)
		kvd_sio_flush(spill_of(g)->io);
}

bool kvd_spill_cancel(struct kvd_ground *g, uint32_t page)
{
	struct kvd_spill *sp = spill_of(g);

	if (!sp || !sp->page_op[page])
		return false;
	sp->ops[sp->page_op[page] - 1].cancel = true;
	return true;
}

bool kvd_spill_busy(const struct kvd_ground *g, uint32_t page)
{
	return spill_of(g) && spill_of(g)->page_op[page];
}

uint32_t kvd_spill_room(const struct kvd_ground *g)
{
	const struct kvd_spill *sp = spill_of(g);

	if (!sp || !sp->writes_on || sp->io_dead)
		return UINT32_MAX;	/* eviction does not wait for the tier */
	return sp->nopfree;
}

uint32_t kvd_spill_pending(const struct kvd_ground *g)
{
	return spill_of(g) ? spill_of(g)->writes : 0;
}

void kvd_spill_reap(struct kvd_ground *g)
{
	if (spill_of(g) && !spill_of(g)->io_dead)
		kvd_sio_reap(spill_of(g)->io, false, reap_done, g);
}

void kvd_spill_drain(struct kvd_ground *g)
{
	if (!spill_of(g))
		return;
	while (kvd_sio_inflight(spill_of(g)->io))
		if (!reap_wait(g))
			break;
}

int kvd_spill_fd(const struct kvd_ground *g)
{
	return spill_of(g) ? kvd_sio_eventfd(spill_of(g)->io) : -1;
}

void kvd_spill_unindex(struct kvd_ground *g, struct kvshm_key key, struct kvshm_key parent,
		       const uint32_t *tokens, uint32_t ns_id)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t loc, bt = g->h->geo.block_tokens;

	if (!sp)
		return;
	/* Only the same block (namespace, parent, tokens) gives way; anything
	 * else is a collision, which the publish then refuses as in tier 0. */
	loc = kvshm_index_find(g->h, key);
	if (kvshm_loc_is_slot(loc)) {
		uint32_t slot = loc & ~KVSHM_LOC_SLOT;
		const struct kvshm_slot *e = &kvshm_slots(g->h)[slot];

		if (slot < sp->n && sp->s[slot].state == KVSHM_SLOT_SPILLED &&
		    e->ns_id == ns_id && kvshm_key_eq(e->parent, parent) &&
		    kvshm_key_eq(sp->s[slot].tok, tok_hash(sp, tokens, bt))) {
			kvd_events_slot_gone(g, slot);
			slot_forget(g, slot);
		}
	} else if (loc < g->h->geo.n_pages && sp->page_op[loc]) {
		const struct kvshm_page *pg = &kvshm_pages(g->h)[loc];

		if (pg->ns_id != ns_id || !kvshm_key_eq(pg->parent, parent) ||
		    memcmp(kvshm_tokens(g->h, loc), tokens, (size_t)bt * sizeof(*tokens)))
			return;
		sp->ops[sp->page_op[loc] - 1].cancel = true;
		kvd_events_page_gone(g, loc);
		if (!kvshm_index_remove(g->h, key, loc))
			kvd_stat_add(&st_of(g)->index_entries, -1);
	}
}

/* Drop the slots of namespace ns_id and tenant (UINT32_MAX: any). */
static void forget_where(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t i;

	if (!sp)
		return;
	kvd_spill_drain(g);
	for (i = 0; i < sp->n; i++) {
		if ((ns_id != UINT32_MAX && kvshm_slots(g->h)[i].ns_id != ns_id) ||
		    (tenant != UINT32_MAX && kvshm_slots(g->h)[i].tenant != tenant))
			continue;
		if (sp->s[i].state == KVSHM_SLOT_SPILLED) {
			kvd_events_slot_gone(g, i);
			slot_forget(g, i);
		} else if (sp->s[i].state == KVSHM_SLOT_BACKING)
			backing_drop(g, i);
	}
}

void kvd_spill_forget_ns(struct kvd_ground *g, uint32_t ns_id)
{
	forget_where(g, ns_id, UINT32_MAX);
}

static void spill_forget_tenant(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant)
{
	forget_where(g, ns_id, tenant);
}

/* ------------------------------------------------------------ restore */

int kvd_spill_claim(struct kvd_ground *g, uint32_t ns_id, uint32_t loc, bool full,
		    struct kvd_fetch *f)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t slot = loc & ~KVSHM_LOC_SLOT;

	/* A tier-1 block of this client's namespace? */
	if (!sp || !kvshm_loc_is_slot(loc) || slot >= sp->n ||
	    sp->s[slot].state != KVSHM_SLOT_SPILLED || kvshm_slots(g->h)[slot].ns_id != ns_id)
		return 0;
	if (full || sp->io_dead) {
		kvd_stat_add(&st_of(g)->restore_misses, 1);
		return -ENOSPC;
	}
	shared_set(g, slot, KVSHM_SLOT_BUSY, NULL, NULL, 0, 0);
	f->ref = slot;
	return 1;
}

int kvd_spill_fetch(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant, struct kvd_fetch *f,
		    uint32_t n, struct kvd_restore *rq)
{
	struct kvd_spill *sp = spill_of(g);
	uint64_t t0, bytes = 0;
	uint32_t i;

	(void)ns_id;
	(void)tenant;
	(void)rq;
	t0 = kvd_now_ns();
	for (i = 0; i < n; i++) {
		uint32_t slot = f[i].ref, idx;
		struct sop *o;

		o = op_get(g, &idx);
		if (!o) {
			shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			*f[i].status = -EIO;
			kvd_stat_add(&st_of(g)->restore_misses, 1);
			continue;
		}
		if (kvshm_page_alloc(g->h, OWNER_SPILL, kvshm_slots(g->h)[slot].ns_id,
				     &o->page, &o->gen)) {
			op_put(sp, idx);
			shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			*f[i].status = -ENOSPC;
			kvd_stat_add(&st_of(g)->restore_misses, 1);
			continue;
		}
		/* A page for the daemon, not handed to a client; its block
		 * stays in its tenant's key space. */
		kvshm_page_set_tenant(g->h, o->page, kvshm_slots(g->h)[slot].tenant);
		kvd_stat_add(&st_of(g)->allocs, -1);
		o->kind = OP_READ;
		o->slot = slot;
		o->len = aligned(kvshm_ns(g->h)[kvshm_slots(g->h)[slot].ns_id].page_bytes);
		o->status = f[i].status;
		if (op_queue(g, idx, false)) {
			/* Cannot happen: op_get saw room for both parts. */
			kvshm_page_free(g->h, o->page, o->gen, OWNER_SPILL);
			op_put(sp, idx);
			shared_set(g, slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
			*f[i].status = -EIO;
			kvd_stat_add(&st_of(g)->restore_misses, 1);
			continue;
		}
		bytes += o->len;
		sp->reads++;
		kvd_spill_flush(g);
	}
	while (sp->reads)
		if (!reap_wait(g))
			break;	/* the tier stopped; statuses say -EIO */
	if (bytes) {
		uint64_t dt = kvd_now_ns() - t0, bps, old;

		bps = dt ? (uint64_t)((double)bytes * 1e9 / (double)dt) : 0;
		old = atomic_load_explicit(&st_of(g)->spill_read_bps, memory_order_relaxed);
		atomic_store_explicit(&st_of(g)->spill_read_bps, old ? (old * 3 + bps) / 4 : bps,
				      memory_order_relaxed);
	}
	return 0;
}

/* ------------------------------------------------------------ open */

/* Write file f's area header, with the clean flag as given. */
static int area_write(struct kvd_spill *sp, uint32_t f, uint32_t bt, bool clean)
{
	uint32_t slots = f + 1 < sp->nfiles ? sp->spf : sp->n - f * sp->spf;

	memset(sp->staging, 0, KVD_SPILL_ALIGN);
	kvd_area_hdr_fill((struct kvd_area_hdr *)sp->staging, bt, sp->hdr_bytes, sp->page_bytes,
			  slots, clean);
	return pwrite(sp->fds[f], sp->staging, KVD_SPILL_ALIGN, 0) == (ssize_t)KVD_SPILL_ALIGN ? 0
												: -1;
}

/* Open file f: 1 when it holds slots of a previous run (*unclean set if
 * that run did not shut down cleanly), 0 when it starts empty, -1. */
static int open_file(struct kvd_ground *g, uint32_t f, uint32_t slots, bool *direct, bool *unclean)
{
	struct kvd_spill *sp = spill_of(g);
	char path[PATH_MAX + 32];
	const char *why = NULL;
	struct stat stt;
	int fd, rc = -1;

	snprintf(path, sizeof(path), "%s/kvcached-spill-%03u.slots", sp->dir, f);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | (*direct ? O_DIRECT : 0), 0600);
	if (fd < 0 && errno == EINVAL && *direct) {
		kvd_warn("spill: %s: the filesystem refuses O_DIRECT; using the page cache", sp->dir);
		*direct = false;
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	}
	if (fd < 0) {
		kvd_err("spill: cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	sp->fds[f] = fd;
	/* Two daemons on one spill area would overwrite each other's slots. */
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		kvd_err("spill: %s: %s", path, errno == EWOULDBLOCK ?
			"in use by another kvcached (each daemon needs its own spill-dir)" :
			strerror(errno));
		return -1;
	}
	memset(sp->staging, 0, KVD_SPILL_ALIGN);
	if (fstat(fd, &stt) == 0 && stt.st_size >= (off_t)KVD_SPILL_ALIGN &&
	    pread(fd, sp->staging, KVD_SPILL_ALIGN, 0) == (ssize_t)KVD_SPILL_ALIGN) {
		if (!kvd_area_hdr_check(sp->staging, KVD_SPILL_ALIGN, g->h->geo.block_tokens,
					sp->hdr_bytes, sp->page_bytes, slots, &why)) {
			rc = 1;	/* warm */
			if (!((struct kvd_area_hdr *)sp->staging)->clean)
				*unclean = true;
		} else {
			kvd_warn("spill: %s: %s; starting it empty", path, why);
		}
	}
	if (rc < 0 && ftruncate(fd, 0)) {
		kvd_err("spill: cannot truncate %s: %s", path, strerror(errno));
		return -1;
	}
	errno = 0;
	if (area_write(sp, f, g->h->geo.block_tokens, false)) {
		kvd_err("spill: cannot write %s: %s", path, strerror(errno ? errno : EIO));
		return -1;
	}
	/*
	 * Reserve the file's blocks now: an O_DIRECT write that extends a
	 * file (or allocates its blocks) cannot complete asynchronously on
	 * ext4 or XFS, io_uring punts it to a worker and the spill rate
	 * halves. Where that fails (no room, a file-size limit, no
	 * fallocate), slots get their blocks as they are written and a full
	 * disk shows up as a failed write.
	 */
	{
		off_t want = (off_t)(KVD_SPILL_ALIGN + (uint64_t)slots * sp->slot_bytes);
		int e = posix_fallocate(fd, 0, want);

		if (e)
			kvd_warn("spill: cannot reserve %lld bytes for %s (%s); its blocks are taken as slots are written",
				 (long long)want, path, strerror(e));
	}
	return rc < 0 ? 0 : 1;
}

/* Rebuild the tier-1 entries of file f from its slot headers. */
static void warm_file(struct kvd_ground *g, uint32_t f, uint32_t *good, uint32_t *bad,
		      uint32_t *norow)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t first = f * sp->spf, last = first + sp->spf, slot;
	uint32_t bt = g->h->geo.block_tokens;

	if (last > sp->n)
		last = sp->n;
	for (slot = first; slot < last; slot++) {
		struct kvd_slot_hdr h;
		const char *why = NULL;
		ssize_t got;
		uint32_t have;
		int rc, ns;

		got = pread(sp->fds[f], sp->staging, sp->hdr_bytes, slot_off(sp, slot));
		if (got <= 0)
			break;	/* past the end: the rest was never written */
		if (!((const uint64_t *)sp->staging)[0])
			continue;	/* never written (reserved, reads as zeros) */
		if ((uint64_t)got < sp->hdr_bytes)
			memset(sp->staging + got, 0, sp->hdr_bytes - (uint64_t)got);
		rc = kvd_slot_hdr_check(sp->staging, sp->hdr_bytes, bt, sp->page_bytes, &why);
		if (rc == 1)
			continue;
		if (rc) {
			kvd_debug("spill: slot %u: %s: dropped", slot, why);
			(*bad)++;
			continue;
		}
		memcpy(&h, sp->staging, sizeof(h));
		ns = g->host->ns(g, &h.ns, false);
		if (ns < 0) {
			(*norow)++;
			continue;
		}
		have = kvshm_index_find(g->h, h.key);
		if (kvshm_loc_is_slot(have)) {
			/* Two copies of a block: the newer one stays. */
			if (sp->s[have & ~KVSHM_LOC_SLOT].seq > h.seq)
				continue;
			kvd_events_slot_gone(g, have & ~KVSHM_LOC_SLOT);
			slot_forget(g, have & ~KVSHM_LOC_SLOT);
		}
		if (kvshm_index_insert(g->h, h.key, KVSHM_LOC_SLOT | slot)) {
			(*bad)++;
			continue;
		}
		kvd_stat_add(&st_of(g)->index_entries, 1);
		kvd_stat_add(&st_of(g)->pages_spilled, 1);
		/* Whose salt it was is not on disk: no tenant until restored. */
		shared_set(g, slot, KVSHM_SLOT_SPILLED, &h.key, &h.parent, (uint32_t)ns,
			   KVSHM_TENANT_NONE);
		kvd_events_slot_found(g, slot, (const uint32_t *)(sp->staging + sizeof(h)));
		sp->s[slot].seq = h.seq;
		sp->s[slot].tok = tok_hash(sp, (const uint32_t *)(sp->staging + sizeof(h)), bt);
		if (h.seq > sp->seq)
			sp->seq = h.seq;
		(*good)++;
	}
}

static bool spill_put(struct kvd_ground *g, uint32_t page, enum kvd_tier_put why)
{
	/* Tier 1 takes evicted pages only. */
	return why == KVD_PUT_EVICT && kvd_spill_page(g, page);
}

static const struct kvd_tier spill_tier = {
	.name = "spill",
	.fd = kvd_spill_fd,
	.reap = kvd_spill_reap,
	.put = spill_put,
	.flush = kvd_spill_flush,
	.room = kvd_spill_room,
	.pending = kvd_spill_pending,
	.busy = kvd_spill_busy,
	.drain = kvd_spill_drain,
	.cancel = kvd_spill_cancel,
	.claim = kvd_spill_claim,
	.fetch = kvd_spill_fetch,
	.unindex = kvd_spill_unindex,
	.forget_ns = kvd_spill_forget_ns,
	.forget_tenant = spill_forget_tenant,
	.close = kvd_spill_close,
};

/* mkdir -p, mode 0700 for what it creates. */
static int mkdir_p(const char *dir)
{
	char tmp[PATH_MAX], *s;

	snprintf(tmp, sizeof(tmp), "%s", dir);
	for (s = tmp + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(tmp, 0700) && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdir(tmp, 0700) && errno != EEXIST ? -1 : 0;
}

int kvd_spill_open(struct kvd_ground *g)
{
	static const char *const kinds[] = { "auto", "io_uring", "worker threads",
					     "inline I/O (tests)" };
	struct kvd_spill *sp;
	struct iovec *iov;
	uint32_t i, good = 0, bad = 0, norow = 0, pages = g->h->geo.n_pages;
	bool direct = true, unclean = false;
	int rc;

	if (!g->h->geo.n_slots)
		return 0;
	/* A file-size limit must become EFBIG, not a dead daemon. */
	signal(SIGXFSZ, SIG_IGN);
	sp = calloc(1, sizeof(*sp));
	if (!sp)
		goto nomem;
	if (getrandom(&sp->tok_seed, sizeof(sp->tok_seed), 0) != sizeof(sp->tok_seed))
		sp->tok_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	/* Registered at once: a failed open is undone by kvd_tiers_close. */
	kvd_tier_add(g, KVD_TIER_SPILL, &spill_tier, sp);
	snprintf(sp->dir, sizeof(sp->dir), "%s", g->cfg->spill_dir);
	if (mkdir_p(sp->dir)) {
		kvd_err("spill: cannot create %s: %s", sp->dir, strerror(errno));
		return -1;
	}
	sp->n = g->h->geo.n_slots;
	sp->hdr_bytes = kvd_slot_hdr_bytes(g->h->geo.block_tokens);
	sp->page_bytes = g->h->geo.page_bytes;
	sp->slot_bytes = sp->hdr_bytes + sp->page_bytes;
	sp->spf = (uint32_t)(FILE_BYTES / sp->slot_bytes);
	if (!sp->spf)
		sp->spf = 1;
	if (sp->spf > sp->n)
		sp->spf = sp->n;
	sp->nfiles = (sp->n + sp->spf - 1) / sp->spf;
	sp->fds = malloc(sp->nfiles * sizeof(int));
	for (i = 0; sp->fds && i < sp->nfiles; i++)
		sp->fds[i] = -1;
	sp->s = calloc(sp->n, sizeof(*sp->s));
	sp->freel = malloc(sp->n * sizeof(uint32_t));
	sp->page_op = calloc(pages, sizeof(uint32_t));
	sp->backing = calloc(pages, sizeof(uint32_t));
	if (!sp->fds || !sp->s || !sp->freel || !sp->page_op || !sp->backing ||
	    kvd_policy_open(&sp->pol, g->cfg->eviction, sp->n) ||
	    posix_memalign((void **)&sp->staging, KVD_SPILL_ALIGN, OPS * sp->hdr_bytes))
		goto nomem;
	for (i = 0; i < OPS; i++)
		sp->opfree[sp->nopfree++] = OPS - 1 - i;

	/* Files, and what a previous run left in them. */
	for (i = 0; i < sp->nfiles; i++) {
		uint32_t slots = i + 1 < sp->nfiles ? sp->spf : sp->n - i * sp->spf;

		rc = open_file(g, i, slots, &direct, &unclean);
		if (rc < 0)
			return -1;
		if (rc == 1)
			warm_file(g, i, &good, &bad, &norow);
	}
	sp->nfree = 0;	/* warm_file's slot_forget listed some: list afresh */
	for (i = sp->n; i-- > 0;)
		if (sp->s[i].state == KVSHM_SLOT_FREE)
			sp->freel[sp->nfree++] = i;
	if (good || bad || norow)
		kvd_info("spill: warm restart%s: %u spilled blocks found in %s, %u slots dropped (bad header or checksum)%s",
			 unclean ? " after an unclean stop" : "", good, sp->dir, bad + norow,
			 norow ? ", some for want of a namespace row" : "");
	atomic_store_explicit(&st_of(g)->spill_dropped, bad + norow, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->spill_warm, good, memory_order_relaxed);

	/* The I/O engine, with the pool (in areas of at most 1 GiB) and the
	 * header staging registered; a cuda pool's pages cannot be the target
	 * of O_DIRECT, so a pinned host staging ring of OPS pages stands in
	 * for it (ARCHITECTURE.md §13). */
	sp->pages_per_area = (uint32_t)(POOL_AREA / sp->page_bytes);
	if (!sp->pages_per_area)
		sp->pages_per_area = 1;
	sp->nareas = g->h->pool_kind == KVSHM_POOL_HOST ?
		     (pages + sp->pages_per_area - 1) / sp->pages_per_area : 1;
	iov = calloc(sp->nareas + 1, sizeof(*iov));
	if (!iov)
		goto nomem;
	if (g->h->pool_kind != KVSHM_POOL_HOST) {
		if (posix_memalign((void **)&sp->stage, KVD_SPILL_ALIGN, OPS * sp->page_bytes)) {
			free(iov);
			goto nomem;
		}
		if (kvd_pool_pin_host(g->pool, sp->stage, OPS * sp->page_bytes))
			kvd_warn("spill: cannot page-lock the %llu-byte staging ring (LimitMEMLOCK?); copies to and from the GPU go slower",
				 (unsigned long long)(OPS * sp->page_bytes));
		iov[0].iov_base = sp->stage;
		iov[0].iov_len = OPS * sp->page_bytes;
	}
	for (i = 0; !sp->stage && i < sp->nareas; i++) {
		uint32_t first = i * sp->pages_per_area;
		uint32_t k = pages - first < sp->pages_per_area ? pages - first : sp->pages_per_area;

		iov[i].iov_base = page_at(g, first);
		iov[i].iov_len = (uint64_t)k * sp->page_bytes;
	}
	iov[sp->nareas].iov_base = sp->staging;
	iov[sp->nareas].iov_len = OPS * sp->hdr_bytes;
	rc = kvd_sio_open(&sp->io, (enum kvd_sio_kind)g->cfg->spill_io, 2 * OPS, iov,
			  sp->nareas + 1, &sp->kind);
	free(iov);
	if (rc)
		return -1;
	sp->writes_on = true;
	atomic_store_explicit(&st_of(g)->spill_enabled, 1, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->spill_slots, sp->n, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->spill_path,
			      sp->kind == KVD_SIO_URING ? KVSHM_SPILL_URING : KVSHM_SPILL_THREADS,
			      memory_order_relaxed);
	kvd_info("spill: %u slots of %llu bytes in %u files under %s, %s, %s",
		 sp->n, (unsigned long long)sp->slot_bytes, sp->nfiles, sp->dir,
		 kinds[sp->kind], direct ? "O_DIRECT" : "buffered");
	return 0;
nomem:
	kvd_err("spill: out of memory");
	return -1;
}

void kvd_spill_close(struct kvd_ground *g)
{
	struct kvd_spill *sp = spill_of(g);
	uint32_t i;

	if (!sp)
		return;
	if (sp->io) {
		kvd_spill_drain(g);
		kvd_sio_close(sp->io);
	}
	for (i = 0; sp->fds && i < sp->nfiles; i++) {
		if (sp->fds[i] < 0)
			continue;
		if (sp->io && sp->staging && area_write(sp, i, g->h->geo.block_tokens, true))
			kvd_warn("spill: cannot mark file %u clean: %s", i, strerror(errno));
		close(sp->fds[i]);
	}
	free(sp->fds);
	free(sp->s);
	free(sp->freel);
	kvd_policy_close(&sp->pol);
	free(sp->page_op);
	free(sp->backing);
	free(sp->staging);
	if (sp->stage) {
		kvd_pool_unpin_host(g->pool, sp->stage);
		free(sp->stage);
	}
	free(sp);
	kvd_tier_remove(g, KVD_TIER_SPILL);
}
