// SPDX-License-Identifier: MIT
/*
 * restore.c - RESTORE and FETCH, the daemon side of a restore: which tier
 * holds each asked-for block (tier.h, kvd_tiers_claim), room in the pool
 * for them, one fetch per tier, one reply.
 *
 * A restore's reply may wait for a tier that fetches over the network;
 * the main loop never does: the request is parked on its client (which
 * sends nothing more until the reply, see server.c) and the reply goes
 * out when the last tier says it is done (kvd_tiers_fetch_done, which
 * reaches restore_done through the ground's host, the core's side of the tier
 * interface, set here).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/index.h"
#include "../../shm/page.h"
#include "../tier/tier.h"
#include "kvd.h"
#include "evict.h"
#include "ns.h"
#include "reply.h"
#include "restore.h"

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

static void restore_done(struct kvd *d, struct kvd_restore *rq)
{
	struct kvd_client *c = rq->c;

	if (--rq->waiting)
		return;
	if (restore_reply(d, rq) == 0)
		kvd_client_resume(d, c);
}

/* The blocks tier_of gives a tier (want of the n in f): room in the pool
 * for them, then one fetch per tier, the farthest first; rq->waiting
 * counts the tiers that finish later. part: scratch for n blocks. */
static void restore_fetch(struct kvd *d, struct kvd_client *c, struct kvd_restore *rq,
			  const struct kvd_fetch *f, struct kvd_fetch *part, const uint8_t *tier_of,
			  uint32_t n, uint32_t want)
{
	struct kvshm_free *fr = kvshm_free(d->h);
	uint32_t i, got;
	int lv;

	/* Pages for them: evict (and spill) first if need be. */
	if (fr->count < want) {
		kvd_evict(d, want - fr->count, true);
		kvd_tiers_flush(&d->g);
		kvd_tiers_drain(&d->g);
	}
	/* The farthest tier first: its fetch runs while the nearer
	 * ones read. */
	for (lv = KVD_TIER_MAX - 1; lv >= 1; lv--) {
		for (i = got = 0; i < n; i++)
			if (tier_of[i] == lv)
				part[got++] = f[i];
		if (!got)
			continue;
		rq->waiting++;
		if (kvd_tiers_fetch(&d->g, (enum kvd_tier_level)lv, c->ns_id, c->tenant, part,
				    got, rq) == 0)
			rq->waiting--;
	}
}

int kvd_restore(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		const void *p)
{
	const bool fetch = hdr->type == KVPROTO_FETCH;
	/* An engine-keyed namespace's blocks are not chained: each one's
	 * parent is the namespace root, which a FETCH names (the client's
	 * root: the salt is in it). */
	const bool flat = kvshm_ns(d->h)[c->ns_id].kind == KVSHM_NS_ENGINE;
	const uint32_t seq = hdr->seq;
	const uint8_t *rec;
	struct kvshm_key parent = { 0, 0 };
	struct kvd_restore *rq;
	struct kvd_fetch *f, *part;
	uint8_t *tier_of;
	uint32_t i, n, want = 0, cap, stride;
	int rc;

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
		if (!flat)
			parent = f[i].key;
		rq->status[i] = -ENOENT;
		loc = kvshm_index_find(d->h, f[i].key);
		if (loc < d->h->geo.n_pages) {
			const struct kvshm_page *pg = &kvshm_pages(d->h)[loc];

			if (atomic_load(&pg->state) == KVSHM_PAGE_READY && pg->ns_id == c->ns_id &&
			    kvshm_key_eq(pg->key, f[i].key)) {
				rq->status[i] = 0;
				/* In the run: spare it from the eviction below,
				 * and until the client has pinned it. */
				kvd_policy_touch(&d->pol, loc);
				kvd_evict_spare(d, loc);
			}
			continue;
		}
		rc = kvd_tiers_claim(&d->g, c->ns_id, loc, want == cap, &f[i]);
		if (rc > 0) {
			tier_of[i] = (uint8_t)rc;
			want++;
		} else if (rc < 0) {
			rq->status[i] = rc;
		}
	}
	if (want)
		restore_fetch(d, c, rq, f, part, tier_of, n, want);
	free(f);
	free(part);
	free(tier_of);
	if (rq->waiting) {
		/* Parked: the reply goes out from restore_done. */
		c->restore = rq;
		kvd_client_park(d, c);
		return 0;
	}
	c->restore = rq;
	return restore_reply(d, rq);
}

/* A tier placed page for a restore: in the eviction order, and spared
 * until its client has pinned it. */
static void host_ready(struct kvd_ground *g, uint32_t page)
{
	struct kvd *d = kvd_of(g);

	kvd_evict_insert(d, page);
	kvd_evict_spare(d, page);
}

static int host_ns(struct kvd_ground *g, const struct kvshm_ns *want, bool may_reclaim)
{
	return kvd_ns_get(kvd_of(g), want, may_reclaim);
}

static void host_fetch_done(struct kvd_ground *g, struct kvd_restore *rq)
{
	restore_done(kvd_of(g), rq);
}

const struct kvd_tier_host kvd_core_tier_host = {
	.ns = host_ns,
	.fetch_done = host_fetch_done,
	.ready = host_ready,
};
