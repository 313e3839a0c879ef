// SPDX-License-Identifier: MIT
/*
 * publish.c - the two round trips of a request (ALLOC, PUBLISH) and its
 * release. Granted pages are recorded in our ledger at once (hold), so the
 * moment the daemon makes them READY they are already pinned for us.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"

void kvc_block_release(struct kvc_req *r, size_t i)
{
	kvc_t *c = r->c;

	if (r->slot[i] != UINT32_MAX) {
		struct kvci_thr *t = kvci_thr(c);

		kvshm_ledger_unpin(c->ledger, r->slot[i]);
		kvci_slots_give(c, t, &r->slot[i], 1);
		KVCI_COUNT(c, t, pins_held, -1);
		r->slot[i] = UINT32_MAX;
	}
	r->state[i] = KVC_B_NONE;
}

/*
 * ALLOC_KEYS for a->n blocks from hits + k0: each page is claimed for its
 * block (key and parent), so the daemon announces it in flight and others
 * can wait for it. Single flight (kvc_wait was called, and the first
 * missed block is the first asked for): -EINPROGRESS when another client
 * is writing that block now.
 */
int kvci_req_why(struct kvc_req *r, int rc, const char *msg)
{
	if (!msg || !*msg)
		return rc;
	if (!r->why)
		r->why = malloc(KVCI_WHY);
	if (r->why)
		snprintf(r->why, KVCI_WHY, "%s", msg);
	return rc;
}

const char *kvc_req_message(const struct kvc_req *r)
{
	return r && r->why ? r->why : "";
}

static int alloc_keys(struct kvc_req *r, uint32_t k0, struct kvproto_alloc *a,
		      void **reply, uint32_t *rlen)
{
	size_t len = sizeof(*a) + (size_t)a->n * sizeof(struct kvproto_claim);
	uint8_t *msg = malloc(len);
	char why[KVCI_WHY];
	kvc_t *c = r->c;
	uint32_t k;
	int rc;

	if (!msg)
		return -ENOMEM;
	a->flags = r->single && !k0 ? KVPROTO_ALLOC_SINGLE : 0;
	memcpy(msg, a, sizeof(*a));
	for (k = 0; k < a->n; k++) {
		size_t i = r->hits + k0 + k;
		struct kvproto_claim cl = { r->keys[i], kvci_parent(r, i) };

		memcpy(msg + sizeof(*a) + (size_t)k * sizeof(cl), &cl, sizeof(cl));
	}
	rc = kvc_rpc_why(c, KVPROTO_ALLOC_KEYS, msg, (uint32_t)len, KVPROTO_ALLOC_R, reply, rlen,
			 why, sizeof(why));
	free(msg);
	return kvci_req_why(r, rc, why);
}

/*
 * The daemon refused a single-flight ALLOC_KEYS: since our lookup another
 * client began writing the first missed block, or published it. Pin what
 * is published, note the run in flight, and go back to the looked-up
 * stage for kvc_wait. When neither is there for us (a block published and
 * evicted at once, or one whose tokens differ from ours), single flight
 * ends for this request: false, and the caller allocates as usual.
 */
static bool race_lost(struct kvc_req *r)
{
	size_t from = r->hits;
	bool missed;

	r->hits = (uint32_t)kvci_pin_run(r, from, &missed);
	if (r->hits > from)
		kvshm_ledger_hit(r->c->ledger, r->keys[0], (uint64_t)(r->hits - from) * r->c->bt,
				 r->label);
	r->t3 = r->hits < r->n ? kvci_inflight_run(r, r->hits) : 0;
	r->single = r->hits > from || r->t3;
	if (!r->single)
		return false;
	r->stage = 1;
	kvci_count(r);
	return true;
}

/* The errno kvc_req_short_reason gives for ALLOC_R's count.pad. */
static int short_reason(uint32_t why)
{
	switch (why) {
	case KVPROTO_SHORT_SHARE: return -EDQUOT;
	case KVPROTO_SHORT_SLOTS:
	case KVPROTO_SHORT_POOL: return -ENOSPC;
	case KVPROTO_SHORT_TAKEN: return -EBUSY;
	default: return -EIO;	/* a daemon that does not say */
	}
}

int kvc_req_short_reason(const struct kvc_req *r)
{
	return r ? r->short_err : -EINVAL;
}

/* Up to fcap pages of those the handle asked for ahead, for r's blocks
 * after its hits: how many r took (0 or more), or -errno. */
static int alloc_ahead(struct kvc_req *r, uint32_t fcap)
{
	kvc_t *c = r->c;
	uint32_t want = (uint32_t)(r->n - r->hits), k;
	struct kvproto_pg *pgs;
	uint32_t *slots;
	int rc;

	if ((rc = kvc_usable(c)))
		return rc;
	if (want > c->ahead_cap)
		want = c->ahead_cap;
	if (want > fcap)
		want = fcap;
	pgs = malloc(want * sizeof(*pgs));
	slots = malloc(want * sizeof(*slots));
	if (!pgs || !slots) {
		free(pgs);
		free(slots);
		return -ENOMEM;
	}
	rc = kvci_ahead_take(c, want, pgs, slots);
	for (k = 0; rc > 0 && k < (uint32_t)rc; k++) {
		size_t i = r->hits + k;

		r->page[i] = pgs[k].page;
		r->gen[i] = pgs[k].gen;
		r->state[i] = KVC_B_WRITING;
		r->slot[i] = slots[k];
	}
	free(pgs);
	free(slots);
	return rc;
}

int kvc_alloc(struct kvc_req *r)
{
	struct kvproto_alloc a = { 0, 0 };
	struct kvproto_count cnt;
	struct kvproto_pg pg;
	uint32_t rlen, got, k, k0 = 0, fcap;
	struct kvci_thr *t;
	void *reply;
	kvc_t *c;
	int rc;

	if (!r || r->stage > 1)
		return -EINVAL;
	c = r->c;
	kvci_settle(r);
	r->stage = 2;
	r->short_err = 0;
	if (r->hits >= r->n)
		return 0;
	if (c->no_insert) {
		r->short_err = -EROFS;
		return kvci_req_why(r, -EROFS,
				    "this handle was opened with KVC_OPEN_NO_INSERT: it reads the cache and never publishes");
	}
	if (!c->part.writes) {	/* another rank of its engine writes its heads */
		r->short_err = -EPERM;
		return 0;
	}
	/* No more than one PUBLISH frame can carry. */
	fcap = (uint32_t)((KVPROTO_MAX_LEN - sizeof(struct kvproto_count)) /
			  (sizeof(struct kvproto_pub) + (uint64_t)c->bt * 4));
	if (c->ahead_cap) {
		/* Pages asked for ahead, after the last publish: no round trip. */
		rc = alloc_ahead(r, fcap);
		if (rc < 0)
			return rc;
		k0 = (uint32_t)rc;
		if (r->hits + k0 >= r->n)
			return (int)k0;
	}
	a.n = (uint32_t)(r->n - r->hits - k0);
	/* Every granted page needs a pin slot; ask for no more than we have. */
	t = kvci_thr(c);
	if (a.n > kvci_slots_free(c, t)) {
		a.n = kvci_slots_free(c, t);
		r->short_err = -ENOSPC;
	}
	/* ...and, with those taken ahead, no more than one frame carries. */
	if (a.n > KVPROTO_MAX_COUNT || k0 + a.n > fcap) {
		if (a.n > KVPROTO_MAX_COUNT)
			a.n = KVPROTO_MAX_COUNT;
		if (k0 + a.n > fcap)
			a.n = fcap > k0 ? fcap - k0 : 0;
		r->short_err = -EMSGSIZE;
	}
	if (!a.n)
		return (int)k0;
	rc = alloc_keys(r, k0, &a, &reply, &rlen);
	if (rc == -EINPROGRESS && race_lost(r))
		return rc;
	if (rc == -EINPROGRESS)	/* nothing there for us after all */
		rc = alloc_keys(r, k0, &a, &reply, &rlen);
	if (rc) {
		r->short_err = rc;
		return k0 ? (int)k0 : rc;
	}
	memcpy(&cnt, reply, sizeof(cnt));
	got = rlen == sizeof(cnt) ? 0 : cnt.n;
	if (got > a.n) {
		free(reply);
		return -EPROTO;
	}
	if (got < a.n)
		r->short_err = short_reason(cnt.pad);
	for (k = 0; k < got; k++) {
		size_t i = r->hits + k0 + k;
		uint32_t s;

		memcpy(&pg, (char *)reply + sizeof(cnt) + k * sizeof(pg), sizeof(pg));
		if (pg.page >= c->n_pages) {
			/* Not a page of this pool: trust nothing after it. The
			 * daemon reclaims what we did not record when we hang up. */
			free(reply);
			return -EPROTO;
		}
		if (!kvci_slots_take(c, t, &s, 1))
			s = UINT32_MAX;
		r->page[i] = pg.page;
		r->gen[i] = pg.gen;
		r->state[i] = KVC_B_WRITING;
		r->slot[i] = s;
		if (s != UINT32_MAX) {
			kvshm_ledger_hold(c->ledger, s, pg.page, pg.gen);
			KVCI_COUNT(c, t, pins_held, 1);
		}
	}
	free(reply);
	return (int)(k0 + got);
}

int kvc_publish(struct kvc_req *r)
{
	size_t rec = sizeof(struct kvproto_pub), i, n = 0, done = 0;
	struct kvproto_count cnt = { 0, 0 };
	uint32_t rlen, bt, k;
	void *reply;
	char *msg;
	kvc_t *c;
	int rc;

	if (!r || r->stage != 2)
		return -EINVAL;
	c = r->c;
	bt = c->bt;
	for (i = 0; i < r->n; i++)
		n += r->state[i] == KVC_B_WRITING;
	if (!n)
		return -EINVAL;
	rec += (size_t)bt * 4;
	msg = malloc(sizeof(cnt) + n * rec);
	if (!msg)
		return -ENOMEM;
	cnt.n = (uint32_t)n;
	memcpy(msg, &cnt, sizeof(cnt));
	for (i = 0, k = 0; i < r->n; i++) {
		struct kvproto_pub p;

		if (r->state[i] != KVC_B_WRITING)
			continue;
		p.page = r->page[i];
		p.gen = r->gen[i];
		KVC_TSAN_RELEASE(c->pool + (uint64_t)p.page * c->slot_bytes);
		p.key = r->keys[i];
		p.parent = kvci_parent(r, i);
		p.extra = r->extra;
		memcpy(msg + sizeof(cnt) + k * rec, &p, sizeof(p));
		memcpy(msg + sizeof(cnt) + k * rec + sizeof(p), r->tokens + i * bt, bt * 4);
		k++;
	}
	{
		char why[KVCI_WHY];

		rc = kvc_rpc_why(c, KVPROTO_PUBLISH, msg, (uint32_t)(sizeof(cnt) + n * rec),
				 KVPROTO_PUBLISH_R, &reply, &rlen, why, sizeof(why));
		kvci_req_why(r, rc, why);
	}
	free(msg);
	if (rc)
		return rc;
	memcpy(&cnt, reply, sizeof(cnt));
	if (cnt.n != n) {
		free(reply);
		return -EPROTO;
	}
	r->stage = 3;
	for (i = 0, k = 0; i < r->n; i++) {
		struct kvproto_pub_r pr;

		if (r->state[i] != KVC_B_WRITING)
			continue;
		memcpy(&pr, (char *)reply + sizeof(cnt) + k++ * sizeof(pr), sizeof(pr));
		if ((pr.status == 0 || pr.status == KVPROTO_PUB_SLICE) &&
		    r->slot[i] != UINT32_MAX) {
			/* Our held slot now pins the READY page, or the page
			 * our slice is in, READY once the last slice is. */
			r->state[i] = KVC_B_PINNED;
			if (pr.status == 0)
				KVCI_COUNT(c, kvci_thr(c), published, 1);
		} else if (pr.status == 1 && pr.page < c->n_pages && r->slot[i] != UINT32_MAX &&
			   kvshm_ledger_pin(c->ledger, r->slot[i], c->seg, pr.page, pr.gen)) {
			/* Lost the race to an identical block: use the winner's. */
			r->page[i] = pr.page;
			r->gen[i] = pr.gen;
			r->state[i] = KVC_B_PINNED;
		} else {
			/* Refused, or the winner was evicted before we pinned it. */
			kvc_block_release(r, i);
		}
	}
	free(reply);
	/* Alloc-ahead: the next request's pages, while the engine goes on. */
	kvci_ahead_ask(c, (uint32_t)n);
	for (i = 0; i < r->n; i++)
		done += r->state[i] == KVC_B_PINNED;
	return (int)done;
}

void kvc_req_free(struct kvc_req *r)
{
	struct kvproto_count cnt = { 0, 0 };
	struct kvproto_pg *pg = NULL;
	size_t i, n = 0, n_slots = 0;

	if (!r)
		return;
	if (r->state && kvc_usable(r->c) != -ECHILD)
		kvci_settle(r);
	/* In a child of fork() the ledger slots are the parent's: only free
	 * our memory. */
	if (r->state && kvc_usable(r->c) != -ECHILD) {
		for (i = 0; i < r->n; i++)
			n += r->state[i] == KVC_B_WRITING;
		if (n)
			pg = malloc(sizeof(cnt) + n * sizeof(*pg));
		if (pg) {
			uint32_t rlen, k = 0;
			void *reply = NULL;

			for (i = 0; i < r->n; i++) {
				if (r->state[i] != KVC_B_WRITING)
					continue;
				((struct kvproto_pg *)((char *)pg + sizeof(cnt)))[k].page = r->page[i];
				((struct kvproto_pg *)((char *)pg + sizeof(cnt)))[k].gen = r->gen[i];
				k++;
			}
			cnt.n = k;
			memcpy(pg, &cnt, sizeof(cnt));
			/* If this fails the daemon reclaims them when we hang up. */
			kvc_rpc(r->c, KVPROTO_FREE, pg, (uint32_t)(sizeof(cnt) + n * sizeof(*pg)),
				KVPROTO_FREE_R, &reply, &rlen);
			free(reply);
			free(pg);
		}
		/* Unpin everything, then return the slots in one lock round. */
		for (i = 0; i < r->n; i++) {
			if (r->slot[i] != UINT32_MAX) {
				kvshm_ledger_unpin(r->c->ledger, r->slot[i]);
				r->slot[n_slots++] = r->slot[i];
			}
		}
		if (n_slots) {
			struct kvci_thr *t = kvci_thr(r->c);

			kvci_slots_give(r->c, t, r->slot, (uint32_t)n_slots);
			KVCI_COUNT(r->c, t, pins_held, -(uint64_t)n_slots);
		}
	}
	free(r->why);
	free(r);	/* the per-block arrays live in the same allocation */
}
