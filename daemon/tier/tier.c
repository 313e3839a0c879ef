// SPDX-License-Identifier: MIT
/*
 * tier.c - the walk over the tiers below the pool (see tier.h), and the
 * daemon side of a restore: which tier holds each asked-for block, room
 * in the pool for them, one fetch per tier, one reply.
 *
 * A restore's reply may wait for a tier that fetches over the network;
 * the main loop never does: the request is parked on its client (which
 * sends nothing more until the reply, see server.c) and the reply goes
 * out when the last tier calls kvd_tiers_fetch_done.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/index.h"
#include "../../shm/page.h"
#include "../core/kvd.h"
#include "../util/log.h"
#include "tier.h"

#define FOR_TIERS(d, t, lv)                                                  \
	for ((lv) = 1; (lv) < KVD_TIER_MAX; (lv)++)                          \
		if (((t) = (d)->tier[(lv)]) != NULL)

void kvd_tier_add(struct kvd *d, enum kvd_tier_level level, const struct kvd_tier *t)
{
	d->tier[level] = t;
}

void kvd_tier_remove(struct kvd *d, enum kvd_tier_level level)
{
	d->tier[level] = NULL;
}

bool kvd_tiers_evicted(struct kvd *d, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	/* The farthest tier first: one that copies the page (remote) must
	 * see it before one that takes it over (spill). */
	for (lv = KVD_TIER_MAX - 1; lv >= 1; lv--)
		if ((t = d->tier[lv]) && t->put && t->put(d, page, KVD_PUT_EVICT))
			return true;
	return false;
}

void kvd_tiers_published(struct kvd *d, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->put)
			t->put(d, page, KVD_PUT_PUBLISH);
}

void kvd_tiers_flush(struct kvd *d)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->flush)
			t->flush(d);
}

uint32_t kvd_tiers_room(const struct kvd *d)
{
	const struct kvd_tier *t;
	uint32_t room = UINT32_MAX, r;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->room && (r = t->room(d)) < room)
			room = r;
	return room;
}

uint32_t kvd_tiers_pending(const struct kvd *d)
{
	const struct kvd_tier *t;
	uint32_t n = 0;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->pending)
			n += t->pending(d);
	return n;
}

bool kvd_tiers_busy(const struct kvd *d, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->busy && t->busy(d, page))
			return true;
	return false;
}

void kvd_tiers_drain(struct kvd *d)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->drain)
			t->drain(d);
}

void kvd_tiers_unindex(struct kvd *d, struct kvshm_key key, struct kvshm_key parent,
		       const uint32_t *tokens, uint32_t ns_id)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->unindex)
			t->unindex(d, key, parent, tokens, ns_id);
}

void kvd_tiers_forget_ns(struct kvd *d, uint32_t ns_id)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->forget_ns)
			t->forget_ns(d, ns_id);
}

int kvd_tiers_fd(const struct kvd *d, enum kvd_tier_level level)
{
	const struct kvd_tier *t = d->tier[level];

	return t && t->fd ? t->fd(d) : -1;
}

void kvd_tiers_reap(struct kvd *d, enum kvd_tier_level level)
{
	const struct kvd_tier *t = d->tier[level];

	if (t && t->reap)
		t->reap(d);
}

void kvd_tiers_tick(struct kvd *d)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv) {
		if (t->tick)
			t->tick(d);
		if (t->stats)
			t->stats(d);
	}
}

void kvd_tiers_close(struct kvd *d)
{
	int lv;

	/* The remote tier first: its workers may still read pool pages. */
	for (lv = KVD_TIER_MAX - 1; lv >= 1; lv--)
		if (d->tier[lv] && d->tier[lv]->close)
			d->tier[lv]->close(d);
}

/* ------------------------------------------------------------ restore */

struct kvd_restore {
	struct kvd_client *c;	/* parked on c while c->restore == this */
	uint16_t reply;
	uint32_t seq, n;
	uint32_t waiting;	/* tiers that deferred and are not done */
	int32_t status[];	/* n */
};

/* Send rq's reply if its client is still waiting for it; free rq. */
static int restore_reply(struct kvd *d, struct kvd_restore *rq)
{
	struct kvd_client *c = rq->c;
	struct kvproto_count cnt = { rq->n, 0 };
	int rc = -1;

	if (c->used && c->restore == rq) {
		c->restore = NULL;
		rc = kvd_reply(d, c, rq->reply, rq->seq, &cnt, sizeof(cnt), rq->status,
			       rq->n * (uint32_t)sizeof(int32_t));
	}
	free(rq);
	return rc;
}

void kvd_tiers_fetch_done(struct kvd *d, struct kvd_restore *rq)
{
	struct kvd_client *c = rq->c;

	if (--rq->waiting)
		return;
	if (restore_reply(d, rq) == 0)
		kvd_client_resume(d, c);
}

int kvd_tiers_restore(struct kvd *d, struct kvd_client *c, uint16_t type, uint32_t seq,
		      const void *p, uint32_t len)
{
	const bool fetch = type == KVPROTO_FETCH;
	const uint8_t *rec;
	struct kvshm_key parent = { 0, 0 };
	struct kvd_restore *rq;
	struct kvd_fetch *f, *part;
	uint8_t *tier_of;
	uint32_t i, n, want = 0, cap, stride, got;
	const struct kvd_tier *t;
	int lv, rc;

	(void)len;
	if (fetch) {
		struct kvproto_fetch fh;

		memcpy(&fh, p, sizeof(fh));
		n = fh.n;
		parent = fh.parent;
		rec = (const uint8_t *)p + sizeof(fh);
		stride = (uint32_t)sizeof(struct kvshm_key) + c->bt * 4;
	} else {
		struct kvproto_count cnt;

		memcpy(&cnt, p, sizeof(cnt));
		n = cnt.n;
		rec = (const uint8_t *)p + sizeof(cnt);
		stride = (uint32_t)sizeof(struct kvshm_key);
	}
	/* No more than the client could pin, nor half the pool: one request
	 * must not flush everyone else's pages out (or hold the loop long). */
	cap = c->nslots > c->writing ? c->nslots - c->writing : 0;
	if (cap > d->h->geo.n_pages / 2)
		cap = d->h->geo.n_pages / 2;
	rq = calloc(1, sizeof(*rq) + n * sizeof(int32_t));
	f = calloc(n, sizeof(*f));
	part = calloc(n, sizeof(*part));
	tier_of = calloc(n, 1);
	if (!rq || !f || !part || !tier_of) {
		free(rq);
		free(f);
		free(part);
		free(tier_of);
		kvd_reply_error(d, c, seq, -ENOMEM, false, "out of memory");
		return 0;
	}
	rq->c = c;
	rq->reply = fetch ? KVPROTO_FETCH_R : KVPROTO_RESTORE_R;
	rq->seq = seq;
	rq->n = n;
	/* Which tier holds each block of this client's namespace. */
	for (i = 0; i < n; i++) {
		uint32_t loc;

		memcpy(&f[i].key, rec + (size_t)i * stride, sizeof(f[i].key));
		f[i].parent = parent;
		/* Tokens travel with FETCH only (4-byte aligned in the frame). */
		f[i].tokens = fetch ? (const uint32_t *)(const void *)(rec + (size_t)i * stride +
								      sizeof(struct kvshm_key))
				    : NULL;
		f[i].status = &rq->status[i];
		parent = f[i].key;
		rq->status[i] = -ENOENT;
		loc = kvshm_index_find(d->h, f[i].key);
		if (loc < d->h->geo.n_pages) {
			const struct kvshm_page *pg = &kvshm_pages(d->h)[loc];

			if (atomic_load(&pg->state) == KVSHM_PAGE_READY && pg->ns_id == c->ns_id &&
			    kvshm_key_eq(pg->key, f[i].key)) {
				rq->status[i] = 0;
				/* In the run: spare it from the eviction below. */
				kvshm_pages(d->h)[loc].ref = 1;
			}
			continue;
		}
		FOR_TIERS(d, t, lv) {
			if (!t->claim)
				continue;
			rc = t->claim(d, c->ns_id, loc, want == cap, &f[i]);
			if (rc == 0)
				continue;
			if (rc > 0) {
				tier_of[i] = (uint8_t)lv;
				want++;
			} else {
				rq->status[i] = rc;
			}
			break;
		}
	}
	if (want) {
		struct kvshm_free *fr = kvshm_free(d->h);

		/* Pages for them: evict (and spill) first if need be. */
		if (fr->count < want) {
			kvd_evict(d, want - fr->count, true);
			kvd_tiers_flush(d);
			kvd_tiers_drain(d);
		}
		/* The farthest tier first: its fetch runs while the nearer
		 * ones read. */
		for (lv = KVD_TIER_MAX - 1; lv >= 1; lv--) {
			if (!(t = d->tier[lv]))
				continue;
			for (i = got = 0; i < n; i++)
				if (tier_of[i] == lv)
					part[got++] = f[i];
			if (!got)
				continue;
			rq->waiting++;
			if (t->fetch(d, c, part, got, rq) == 0)
				rq->waiting--;
		}
	}
	free(f);
	free(part);
	free(tier_of);
	if (rq->waiting) {
		/* Parked: the reply goes out from kvd_tiers_fetch_done. */
		c->restore = rq;
		kvd_client_park(d, c);
		return 0;
	}
	c->restore = rq;
	return restore_reply(d, rq);
}
