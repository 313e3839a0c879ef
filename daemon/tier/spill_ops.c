// SPDX-License-Identifier: MIT
/*
 * spill_ops.c - the spill tier's slot reads and writes in flight (OPS
 * at once): queued to the I/O engine (spill_io.h), completed by the main
 * thread when it reaps, and the tier stopped for writes on an error.
 */
#include "spill_int.h"

off_t kvd_spill_slot_off(const struct kvd_spill *sp, uint32_t slot)
{
	return (off_t)(KVD_SPILL_ALIGN + (uint64_t)(slot % sp->spf) * sp->slot_bytes);
}

static int slot_fd(const struct kvd_spill *sp, uint32_t slot)
{
	return sp->fds[slot / sp->spf];
}

uint8_t *kvd_spill_page_at(struct kvd_ground *g, uint32_t page)
{
	return (uint8_t *)g->pool->mem.base + (uint64_t)page * spill_of(g)->page_bytes;
}

/* Where op idx's payload is read or written: the pool page itself, or its
 * staging slot (cuda pool). */
uint8_t *kvd_spill_payload_of(struct kvd_ground *g, uint32_t idx, uint32_t page)
{
	struct kvd_spill *sp = spill_of(g);

	return sp->stage ? sp->stage + (uint64_t)idx * sp->page_bytes : kvd_spill_page_at(g, page);
}

uint64_t kvd_spill_aligned(uint64_t n)
{
	return (n + KVD_SPILL_ALIGN - 1) / KVD_SPILL_ALIGN * KVD_SPILL_ALIGN;
}

static void degrade(struct kvd_ground *g, int err);

/*
 * Wait for at least one completion and handle what finished. False when
 * nothing can finish: nothing in flight, or the kernel keeps refusing the
 * submission (then the tier stops: the ops in flight are abandoned, their
 * pages stay out of use, and nothing is reaped again, so no completion
 * can touch state that was given up).
 */
bool kvd_spill_reap_wait(struct kvd_ground *g)
{
	struct kvd_spill *sp = spill_of(g);

	if (sp->io_dead)
		return false;
	if (kvd_sio_reap(sp->io, true, kvd_spill_reap_done, g))
		return true;
	if (kvd_sio_inflight(sp->io)) {
		sp->io_dead = true;
		kvd_err("spill: io_uring keeps refusing submissions; the spill tier stops");
		degrade(g, -EIO);
	}
	return false;
}

/* An op, waiting for a running one to finish when all are busy. */
struct sop *kvd_spill_op_get(struct kvd_ground *g, uint32_t *idx)
{
	struct kvd_spill *sp = spill_of(g);

	while (!sp->io_dead && (!sp->nopfree || kvd_sio_room(sp->io) < 2))
		if (!kvd_spill_reap_wait(g))
			break;
	if (sp->io_dead || !sp->nopfree || kvd_sio_room(sp->io) < 2)
		return NULL;
	*idx = sp->opfree[--sp->nopfree];
	memset(&sp->ops[*idx], 0, sizeof(sp->ops[*idx]));
	return &sp->ops[*idx];
}

void kvd_spill_op_put(struct kvd_spill *sp, uint32_t idx)
{
	sp->ops[idx].kind = OP_FREE;
	sp->opfree[sp->nopfree++] = idx;
}

/* Queue the header and payload I/O of op idx. */
int kvd_spill_op_queue(struct kvd_ground *g, uint32_t idx, bool write)
{
	struct kvd_spill *sp = spill_of(g);
	struct sop *o = &sp->ops[idx];
	int fd = slot_fd(sp, o->slot);
	off_t off = kvd_spill_slot_off(sp, o->slot);
	int rc;

	/* tag: op index and part (0 header, 1 payload) */
	o->parts = 0;
	rc = kvd_sio_queue(sp->io, fd, write, sp->staging + (uint64_t)idx * sp->hdr_bytes,
			   sp->hdr_bytes, off, sp->nareas, (uint64_t)idx << 1);
	if (rc)
		return rc;	/* nothing queued: the caller gives the op back */
	o->parts = 1;
	if (kvd_sio_queue(sp->io, fd, write, kvd_spill_payload_of(g, idx, o->page), o->len,
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
		kvd_spill_slot_free(g, o->slot);
		kvd_spill_op_put(sp, idx);
		return;
	}
	kvd_spill_shared_set(g, o->slot, KVSHM_SLOT_SPILLED, &p->key, &p->parent, p->ns_id, p->tenant);
	if (kvshm_page_evict_to_slot(g->h, o->page, o->slot)) {
		/* Not indexed any more: nothing to keep. */
		kvd_events_page_gone(g, o->page);
		kvshm_page_evict_finish(g->h, o->page);
		kvd_spill_slot_free(g, o->slot);
	} else {
		kvd_events_spilled(g, o->page, o->slot);
		kvd_stat_add(&st_of(g)->spills, 1);
		kvd_stat_add(&st_of(g)->pages_spilled, 1);
		kvd_stat_add(&st_of(g)->spill_write_bytes, (int64_t)(sp->hdr_bytes + o->len));
	}
	kvd_spill_op_put(sp, idx);
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
		if (!rc && kvd_payload_check(kvd_spill_payload_of(g, idx, o->page), h.payload_bytes) !=
			   h.payload_check)
			rc = -EBADMSG, why = "payload checksum mismatch";
		/* cuda pool: checked in staging, then into the GPU page. */
		if (!rc && sp->stage &&
		    kvd_pool_copy_in(g->pool, o->page, 1, kvd_spill_payload_of(g, idx, o->page)))
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
			kvd_spill_slot_forget(g, o->slot);
		} else {
			/* The copy on disk may be whole: keep it for later. */
			kvd_warn("spill: slot %u: read failed: %s; served as a miss", o->slot,
				 strerror(-rc));
			kvd_stat_add(&st_of(g)->spill_errors, 1);
			kvd_spill_shared_set(g, o->slot, KVSHM_SLOT_SPILLED, NULL, NULL, 0, 0);
		}
		*o->status = rc == -EBADMSG ? -EBADMSG : -EIO;
	} else {
		struct sslot *s = &sp->s[o->slot];

		kvd_spill_shared_set(g, o->slot, KVSHM_SLOT_BACKING, NULL, NULL, 0, 0);
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
	kvd_spill_op_put(sp, idx);
}

void kvd_spill_reap_done(void *arg, uint64_t tag, int res)
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
