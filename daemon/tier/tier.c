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
#include "../util/log.h"
#include "tier.h"

#define FOR_TIERS(g, t, lv)                                                  \
	for ((lv) = 1; (lv) < KVD_TIER_MAX; (lv)++)                          \
		if (((t) = (g)->tier[(lv)]) != NULL)

void kvd_tier_add(struct kvd_ground *g, enum kvd_tier_level level, const struct kvd_tier *t,
		  void *state)
{
	g->tier[level] = t;
	g->tier_state[level] = state;
}

void kvd_tier_remove(struct kvd_ground *g, enum kvd_tier_level level)
{
	g->tier[level] = NULL;
	g->tier_state[level] = NULL;
}

bool kvd_tiers_offer_evict(struct kvd_ground *g, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	/* The farthest tier first: one that copies the page (remote) must
	 * see it before one that takes it over (spill). */
	for (lv = KVD_TIER_MAX - 1; lv >= 1; lv--)
		if ((t = g->tier[lv]) && t->put && t->put(g, page, KVD_PUT_EVICT))
			return true;
	return false;
}

void kvd_tiers_offer_publish(struct kvd_ground *g, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->put)
			t->put(g, page, KVD_PUT_PUBLISH);
}

void kvd_tiers_flush(struct kvd_ground *g)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->flush)
			t->flush(g);
}

uint32_t kvd_tiers_room(const struct kvd_ground *g)
{
	const struct kvd_tier *t;
	uint32_t room = UINT32_MAX, r;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->room && (r = t->room(g)) < room)
			room = r;
	return room;
}

uint32_t kvd_tiers_pending(const struct kvd_ground *g)
{
	const struct kvd_tier *t;
	uint32_t n = 0;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->pending)
			n += t->pending(g);
	return n;
}

bool kvd_tiers_busy(const struct kvd_ground *g, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->busy && t->busy(g, page))
			return true;
	return false;
}

void kvd_tiers_drain(struct kvd_ground *g)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->drain)
			t->drain(g);
}

void kvd_tiers_unindex(struct kvd_ground *g, struct kvshm_key key, struct kvshm_key parent,
		       const uint32_t *tokens, uint32_t ns_id)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->unindex)
			t->unindex(g, key, parent, tokens, ns_id);
}

void kvd_tiers_forget_ns(struct kvd_ground *g, uint32_t ns_id)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->forget_ns)
			t->forget_ns(g, ns_id);
}

void kvd_tiers_forget_tenant(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->forget_tenant)
			t->forget_tenant(g, ns_id, tenant);
}

int kvd_tiers_fd(const struct kvd_ground *g, enum kvd_tier_level level)
{
	const struct kvd_tier *t = g->tier[level];

	return t && t->fd ? t->fd(g) : -1;
}

void kvd_tiers_reap(struct kvd_ground *g, enum kvd_tier_level level)
{
	const struct kvd_tier *t = g->tier[level];

	if (t && t->reap)
		t->reap(g);
}

void kvd_tiers_tick(struct kvd_ground *g)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv) {
		if (t->tick)
			t->tick(g);
		if (t->stats)
			t->stats(g);
	}
}

void kvd_tiers_close(struct kvd_ground *g)
{
	int lv;

	/* The remote tier first: its workers may still read pool pages. */
	for (lv = KVD_TIER_MAX - 1; lv >= 1; lv--)
		if (g->tier[lv] && g->tier[lv]->close)
			g->tier[lv]->close(g);
}

/* ------------------------------------------------------------ reads */

int kvd_tiers_claim(struct kvd_ground *g, uint32_t ns_id, uint32_t loc, bool full, struct kvd_fetch *f)
{
	const struct kvd_tier *t;
	int lv, rc;

	FOR_TIERS(g, t, lv) {
		if (!t->claim)
			continue;
		rc = t->claim(g, ns_id, loc, full, f);
		if (rc == 0)
			continue;
		return rc > 0 ? lv : rc;
	}
	return 0;
}

int kvd_tiers_fetch(struct kvd_ground *g, enum kvd_tier_level level, uint32_t ns_id,
		    uint32_t tenant, struct kvd_fetch *f, uint32_t n, struct kvd_restore *rq)
{
	return g->tier[level]->fetch(g, ns_id, tenant, f, n, rq);
}

void kvd_tiers_fetch_done(struct kvd_ground *g, struct kvd_restore *rq)
{
	g->host->fetch_done(g, rq);
}

bool kvd_tiers_cancel(struct kvd_ground *g, uint32_t page)
{
	const struct kvd_tier *t;
	int lv;

	FOR_TIERS(g, t, lv)
		if (t->cancel && t->cancel(g, page))
			return true;
	return false;
}
