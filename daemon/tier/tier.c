// SPDX-License-Identifier: MIT
/*
 * tier.c - the walk over the tiers below the pool (see tier.h). The
 * daemon side of a restore (which tier holds each asked-for block, one
 * fetch per tier, one reply) is the core's: core/restore.c.
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

bool kvd_tiers_offer_evict(struct kvd *d, uint32_t page)
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

void kvd_tiers_offer_publish(struct kvd *d, uint32_t page)
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

void kvd_tiers_forget_tenant(struct kvd *d, uint32_t ns_id, uint32_t tenant)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->forget_tenant)
			t->forget_tenant(d, ns_id, tenant);
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

/* ------------------------------------------------------------ reads */

int kvd_tiers_claim(struct kvd *d, uint32_t ns_id, uint32_t loc, bool full, struct kvd_fetch *f)
{
	const struct kvd_tier *t;
	int lv, rc;

	FOR_TIERS(d, t, lv) {
		if (!t->claim)
			continue;
		rc = t->claim(d, ns_id, loc, full, f);
		if (rc == 0)
			continue;
		return rc > 0 ? lv : rc;
	}
	return 0;
}

int kvd_tiers_fetch(struct kvd *d, enum kvd_tier_level level, struct kvd_client *c,
		    struct kvd_fetch *f, uint32_t n, struct kvd_restore *rq)
{
	return d->tier[level]->fetch(d, c, f, n, rq);
}

void kvd_tiers_fetch_done(struct kvd *d, struct kvd_restore *rq)
{
	d->tier_host->fetch_done(d, rq);
}

bool kvd_tiers_cancel(struct kvd *d, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(d, t, lv)
		if (t->cancel && t->cancel(d, page))
			return true;
	return false;
}
