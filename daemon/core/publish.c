// SPDX-License-Identifier: MIT
/*
 * publish.c - PUBLISH and FREE: the end of a WRITING page, made READY and
 * indexed under its key, or given back. A client may name only pages it
 * was handed (WRITING, owned by it, at the generation it was given); every
 * record of a message is checked before any is applied, duplicates within
 * the message included, so a lying client is refused and disconnected
 * with the index exactly as it was. Whatever ends an announcement here
 * wakes that writer's waiters (flight.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/key.h"
#include "../../shm/page.h"
#include "../obs/events.h"
#include "kvd.h"
#include "publish.h"
#include "evict.h"
#include "flight.h"
#include "quota.h"
#include "reply.h"
#include "slice.h"
#include "../util/log.h"
#include "../tier/tier.h"

/*
 * Does c hold the page a record names (its first bytes a struct
 * kvproto_pg; with key, a PUBLISH record's key)? WRITING, its own, at that
 * generation; for a client writing slices, a slice of it granted and not
 * published (or held on a page given up since: a miss, not a lie), for
 * the block it was granted for (slice.c).
 */
static bool holds(const struct kvd *d, const struct kvd_client *c, const uint8_t *rec,
		  bool key)
{
	const struct kvshm_page *pages = kvshm_pages(d->h);
	struct kvproto_pub pub;

	memcpy(&pub, rec, key ? sizeof(pub) : sizeof(struct kvproto_pg));
	if (pub.page >= d->h->geo.n_pages || d->mark[pub.page])
		return false;
	if (kvd_slicing(c))
		return kvd_slice_check(d, c, pub.page, pub.gen, key ? &pub.key : NULL) >= 0;
	return atomic_load(&pages[pub.page].state) == KVSHM_PAGE_WRITING &&
	       !kvd_slice_is(d, pub.page) &&	/* several ranks': slice.c's */
	       pages[pub.page].owner == kvd_owner(c) &&
	       atomic_load(&pages[pub.page].gen) == pub.gen;
}

/* Check every record of a PUBLISH (key) or FREE with holds(); mark pages
 * to catch repeats. */
static int check_pages(struct kvd *d, struct kvd_client *c, const uint8_t *rec,
		       uint32_t n, size_t stride, bool key, uint32_t *bad)
{
	uint32_t i, k;
	int rc = 0;

	for (i = 0; i < n; i++) {
		struct kvproto_pg pg;

		memcpy(&pg, rec + i * stride, sizeof(pg));
		if (!holds(d, c, rec + i * stride, key)) {
			*bad = pg.page;
			rc = -1;
			break;
		}
		d->mark[pg.page] = 1;
	}
	for (k = 0; k < i; k++) {
		struct kvproto_pg pg;

		memcpy(&pg, rec + k * stride, sizeof(pg));
		d->mark[pg.page] = 0;
	}
	return rc;
}

/*
 * Can the daemon recompute the keys of namespace ns_id from their parent,
 * tokens and extra-keys digest? Yes for both kinds today: a TOKENS
 * namespace chains its keys over its tokens, and an ENGINE namespace's key
 * is the block key over the root and the digest it stores as tokens
 * (kvshm_key_engine, extra digest zero). A kind whose keys cannot be
 * recomputed answers false here; its publishes are then checked for
 * pages and generations only.
 */
static bool keys_verifiable(const struct kvd *d, uint32_t ns_id)
{
	(void)d;
	(void)ns_id;
	return true;
}

/*
 * Every record's key is the key of its own block: XXH3 over its parent
 * key, its tokens and the extra-keys digest, as the client computed the
 * chain. A key that is not would take another prompt's block (squatting:
 * that prompt's lookups then miss it while the squatter holds a pin).
 * Returns 0, or -1 with *bad the first record that lies.
 */
static int check_keys(const struct kvd *d, const struct kvd_client *c, const uint8_t *rec,
		      uint32_t n, size_t stride, uint32_t *bad)
{
	uint32_t tokens[KVSHM_MAX_BLOCK_TOKENS], i;
	struct kvproto_pub pub;
	struct kvshm_key k;

	if (!keys_verifiable(d, c->ns_id))
		return 0;
	for (i = 0; i < n; i++) {
		memcpy(&pub, rec + i * stride, sizeof(pub));
		memcpy(tokens, rec + i * stride + sizeof(pub), (size_t)c->bt * 4);
		/* In the client's own key space: a chain that starts at another
		 * namespace's or salt's root gives a key of ours, never theirs. */
		k = kvshm_key_block(c->root, pub.parent, tokens, c->bt, pub.extra);
		if (k.lo != pub.key.lo || k.hi != pub.key.hi) {
			*bad = i;
			return -1;
		}
	}
	return 0;
}

/*
 * Publish one page whole, for its owner (the client, or the rank that
 * began a page several ranks wrote): into the index and the eviction
 * order, offered to the tiers, announced to KV events. Returns the status
 * of the record.
 */
static int publish_page(struct kvd *d, struct kvd_client *c, const struct kvproto_pub *pub,
			const uint32_t *tokens, uint32_t owner, struct kvproto_pub_r *res)
{
	int st;

	/* Waiters for this block (ours or another writer's) wake after. */
	kvd_flight_note(d, pub->page);
	kvd_flight_note_key(d, pub->key);
	if (d->g.damaged && d->g.damaged[pub->page]) {
		/* A client punched this page out while it was being
		 * written: its KV is gone, never to be indexed. */
		d->g.damaged[pub->page] = 0;
		kvshm_page_free(d->h, pub->page, pub->gen, owner);
		return -EIO;
	}
	/* A tier-1 copy of the block gives way to the new page. */
	kvd_tiers_unindex(&d->g, pub->key, pub->parent, tokens, c->ns_id);
	st = kvshm_page_publish(d->h, pub->page, pub->gen, owner, pub->key, pub->parent, tokens,
				&res->page, &res->gen);
	kvd_events_published(&d->g, pub->page, st);
	if (st == KVSHM_PUBLISHED) {
		/* Into the eviction order (behind its parent, the block
		 * before it: policy.h). */
		kvd_evict_insert(d, pub->page);
		kvd_tiers_offer_publish(&d->g, pub->page);
	}
	return st;
}

/*
 * A slicing client's record: its slice is in (KVPROTO_PUB_SLICE: the page
 * stays its, pinned, READY once the last slice is), or it was the last
 * and the page is published whole; -ESTALE for a page given up since its
 * grant, -EIO for one punched out meanwhile (given up now).
 */
static int publish_slice(struct kvd *d, struct kvd_client *c, const struct kvproto_pub *pub,
			 const uint32_t *tokens, struct kvproto_pub_r *res)
{
	uint32_t owner;
	int st;

	if (kvd_slice_check(d, c, pub->page, pub->gen, &pub->key)) {
		kvd_slice_release(d, c, pub->page);
		return -ESTALE;
	}
	if (d->g.damaged && d->g.damaged[pub->page]) {
		kvd_slice_release(d, c, pub->page);
		return -EIO;
	}
	if (!kvd_slice_written(d, c, pub->page)) {
		res->page = pub->page;
		res->gen = pub->gen;
		return KVPROTO_PUB_SLICE;
	}
	owner = kvshm_pages(d->h)[pub->page].owner;
	st = publish_page(d, c, pub, tokens, owner, res);
	kvd_slice_forget(d, pub->page);
	return st;
}

int kvd_publish(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
		const void *p)
{
	const uint32_t seq = hdr->seq;
	size_t stride = sizeof(struct kvproto_pub) + (size_t)c->bt * 4;
	const uint8_t *rec = (const uint8_t *)p + sizeof(struct kvproto_count);
	struct kvproto_count cnt;
	struct kvproto_pub_r *res;
	uint32_t i, bad = 0, collisions = 0;
	int rc;

	memcpy(&cnt, p, sizeof(cnt));
	if (check_pages(d, c, rec, cnt.n, stride, true, &bad)) {
		kvd_reply_error(d, c, seq, -EINVAL, true,
				kvd_slicing(c)
				? "PUBLISH names page %u, of which it holds no slice at that generation for that block"
				: "PUBLISH names page %u, which it does not hold WRITING at that generation",
				bad);
		return -1;
	}
	if (check_keys(d, c, rec, cnt.n, stride, &bad)) {
		kvd_reply_error(d, c, seq, -EINVAL, true,
				"PUBLISH record %u: its key is not the key of its parent, tokens and extra keys (XXH3); a block is published under its own key only",
				bad);
		return -1;
	}
	res = calloc(cnt.n, sizeof(*res));
	if (!res) {
		kvd_reply_error(d, c, seq, -ENOMEM, false, "out of memory");
		return 0;
	}
	/* Its hits of this request are older than its new blocks. */
	kvd_evict_drain(d, c);
	for (i = 0; i < cnt.n; i++) {
		struct kvproto_pub pub;
		uint32_t tokens[KVSHM_MAX_BLOCK_TOKENS];
		int st;

		memcpy(&pub, rec + i * stride, sizeof(pub));
		memcpy(tokens, rec + i * stride + sizeof(pub), (size_t)c->bt * 4);
		st = kvd_slicing(c) ? publish_slice(d, c, &pub, tokens, &res[i])
				    : publish_page(d, c, &pub, tokens, kvd_owner(c), &res[i]);
		res[i].status = st;
		/* Its page, the winner's or its slice's: pinned now. */
		if (st >= 0) {
			c->fresh++;
			kvd_quota_fresh(d, c, 1);
		}
		/* Published, shared, refused or a slice in: the page (or its
		 * slice) is no longer ours to write. */
		kvd_quota_writing(d, c, -1);
		collisions += st == -EEXIST;
	}
	kvd_flight_wake(d);
	if (collisions)	/* one line per message, not per block */
		kvd_warn("client %u (pid %d): %u key collisions refused; the index keeps the first blocks",
			 c->id, (int)c->pid, collisions);
	rc = kvd_reply(d, c, KVPROTO_PUBLISH_R, seq, &cnt, sizeof(cnt), res,
		       cnt.n * (uint32_t)sizeof(*res));
	free(res);
	return rc;
}

int kvd_free(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
	     const void *p)
{
	const uint32_t seq = hdr->seq;
	const uint8_t *rec = (const uint8_t *)p + sizeof(struct kvproto_count);
	const size_t stride = sizeof(struct kvproto_pg);
	struct kvproto_count cnt;
	uint32_t i, bad = 0;

	memcpy(&cnt, p, sizeof(cnt));
	if (check_pages(d, c, rec, cnt.n, stride, false, &bad)) {
		kvd_reply_error(d, c, seq, -EINVAL, true,
				"FREE names page %u, which it does not hold WRITING at that generation",
				bad);
		return -1;
	}
	for (i = 0; i < cnt.n; i++) {
		struct kvproto_pg pg;

		memcpy(&pg, rec + i * stride, sizeof(pg));
		if (kvd_slicing(c)) {	/* the page can no longer be whole */
			kvd_slice_release(d, c, pg.page);	/* counted as dropped */
			continue;
		}
		kvd_flight_note(d, pg.page);
		kvshm_page_free(d->h, pg.page, pg.gen, kvd_owner(c));
	}
	kvd_flight_wake(d);	/* their waiters get a miss at once */
	kvd_quota_writing(d, c, -(int64_t)cnt.n);
	if (!kvd_slicing(c))
		kvd_stat_add(&kvshm_stats(d->h)->frees, cnt.n);
	return kvd_reply(d, c, KVPROTO_FREE_R, seq, &cnt, sizeof(cnt), NULL, 0);
}

uint32_t kvd_reclaim(struct kvd *d, const struct kvd_client *c)
{
	struct kvshm_page *pages = kvshm_pages(d->h);
	uint32_t i, n = 0, found = 0, owner = kvd_owner(c);

	/* c->writing counts its WRITING pages and open slices exactly (every
	 * path that grants or ends one updates it): a client that leaves
	 * holding none, the common case, costs no pass over the page table,
	 * and the pass ends at the last of them. */
	for (i = 0; i < d->h->geo.n_pages && found < c->writing; i++) {
		if (atomic_load(&pages[i].state) != KVSHM_PAGE_WRITING)
			continue;
		if (kvd_slice_is(d, i)) {
			/* A page several ranks write: its slice never comes
			 * (the page is counted as dropped when it goes). */
			if (kvd_slice_holds(d, c, i)) {
				found++;
				kvd_slice_release(d, c, i);
			}
			continue;
		}
		if (pages[i].owner != owner)
			continue;
		found++;
		kvd_flight_note(d, i);
		if (!kvshm_page_free(d->h, i, atomic_load(&pages[i].gen), owner))
			n++;
	}
	/* A writer that died: whoever waits for its blocks gets a miss now. */
	kvd_flight_wake(d);
	kvd_stat_add(&kvshm_stats(d->h)->reclaimed, n);
	return n;
}
