// SPDX-License-Identifier: MIT
/*
 * slice.c - the records of pages several tensor-parallel ranks write
 * together: who was granted which slice, which are written, when the page
 * began. See slice.h for the life of such a page; alloc.c and publish.c
 * call in here for the clients that write slices and publish.c makes the
 * page transitions of a whole page itself; the pages given up are freed
 * here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../shm/index.h"
#include "../../shm/page.h"
#include "flight.h"
#include "slice.h"

/* A page several ranks write, while it is WRITING. */
struct kvd_slices {
	uint32_t page, gen;
	uint32_t writers;		/* slices that make it whole */
	uint32_t claimed;		/* slices granted (the page's `slices`) */
	uint32_t written;		/* slices published */
	bool dropped;			/* given up: freed once none is open */
	struct kvshm_key key, parent;	/* the block it was begun for */
	uint64_t due_ms;		/* given up if not whole by then */
	/* The records not given up, oldest first (the tick's list). */
	struct kvd_slices *prev, *next;
	uint32_t who[KVSHM_MAX_WRITERS];	/* owner id granted slice s */
};

int kvd_slice_init(struct kvd *d)
{
	d->slices = calloc(d->h->geo.n_pages, sizeof(*d->slices));
	return d->slices ? 0 : -ENOMEM;
}

void kvd_slice_fini(struct kvd *d)
{
	uint32_t i;

	if (!d->slices)
		return;
	for (i = 0; i < d->h->geo.n_pages; i++)
		free(d->slices[i]);
	free(d->slices);
	d->slices = NULL;
}

static struct kvd_slices *rec_of(const struct kvd *d, uint32_t page)
{
	return page < d->h->geo.n_pages && d->slices ? d->slices[page] : NULL;
}

bool kvd_slice_is(const struct kvd *d, uint32_t page)
{
	return rec_of(d, page) != NULL;
}

static uint32_t open_slices(const struct kvd_slices *r)
{
	return r->claimed & ~r->written;
}

static void list_unlink(struct kvd *d, struct kvd_slices *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else if (d->slice_old == r)
		d->slice_old = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else if (d->slice_new == r)
		d->slice_new = r->prev;
	r->prev = r->next = NULL;
}

static void rec_free(struct kvd *d, struct kvd_slices *r)
{
	if (!r->dropped)
		list_unlink(d, r);
	d->slices[r->page] = NULL;
	free(r);
}

void kvd_slice_forget(struct kvd *d, uint32_t page)
{
	struct kvd_slices *r = rec_of(d, page);

	if (r)
		rec_free(d, r);
}

/*
 * The page cannot be whole: its announcement ends now (waiters get a
 * miss), and the page is freed once no rank holds a slice of it open (a
 * rank still writing its slice must not write into a page handed out
 * again).
 */
static void drop(struct kvd *d, struct kvd_slices *r)
{
	const struct kvshm_page *p = &kvshm_pages(d->h)[r->page];

	if (!r->dropped) {
		r->dropped = true;
		list_unlink(d, r);
		kvd_flight_note(d, r->page);
		kvshm_page_unannounce(d->h, r->page);
	}
	if (open_slices(r))
		return;
	/* Counted once, as the page goes back: beside frees and reclaims
	 * (which count pages of one writer). */
	kvd_stat_add(&kvshm_stats(d->h)->slice_dropped, 1);
	kvd_flight_note(d, r->page);
	kvshm_page_free(d->h, r->page, r->gen, p->owner);
	rec_free(d, r);
}

bool kvd_slice_joinable(const struct kvd *d, const struct kvd_client *c,
			const struct kvproto_claim *cl)
{
	uint32_t loc = kvshm_index_find(d->h, cl->key);
	const struct kvd_slices *r = rec_of(d, loc);

	return r && !r->dropped && r->writers == c->part.writers &&
	       !(r->claimed >> c->part.slice & 1) &&
	       kvshm_pages(d->h)[loc].ns_id == c->ns_id && kvshm_key_eq(r->key, cl->key) &&
	       kvshm_key_eq(r->parent, cl->parent);
}

uint32_t kvd_slice_grant(struct kvd *d, struct kvd_client *c, const struct kvproto_claim *cl,
			 bool announce, struct kvproto_pg *out)
{
	const uint32_t s = c->part.slice;
	struct kvd_slices *r;

	if (kvd_slice_joinable(d, c, cl)) {
		r = d->slices[kvshm_index_find(d->h, cl->key)];
		r->claimed |= 1u << s;
		r->who[s] = kvd_owner(c);
		kvshm_page_slices(d->h, r->page, r->writers, r->claimed);
		kvd_stat_add(&kvshm_stats(d->h)->slice_joins, 1);
		out->page = r->page;
		out->gen = r->gen;
		return 0;
	}
	/* Cached, in flight by other writers, or our slice taken: a page of
	 * our own would never be whole (nobody else could find it). */
	if (kvshm_index_find(d->h, cl->key) != UINT32_MAX)
		return KVPROTO_SHORT_TAKEN;
	if (!announce)
		return KVPROTO_SHORT_POOL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return KVPROTO_SHORT_POOL;
	if (kvshm_page_alloc(d->h, kvd_owner(c), c->ns_id, &r->page, &r->gen)) {
		free(r);
		return KVPROTO_SHORT_POOL;
	}
	kvshm_page_set_tenant(d->h, r->page, c->tenant);
	if (d->g.damaged)	/* a hole found earlier was about its old use */
		d->g.damaged[r->page] = 0;
	r->writers = c->part.writers;
	r->claimed = 1u << s;
	r->who[s] = kvd_owner(c);
	r->key = cl->key;
	r->parent = cl->parent;
	r->due_ms = kvd_now_ms() + d->cfg.slice_timeout_ms;
	/* Slices first: a lookup that sees the page in flight sees them. */
	kvshm_page_slices(d->h, r->page, r->writers, r->claimed);
	if (kvshm_page_announce(d->h, r->page, r->gen, kvd_owner(c), cl->key, cl->parent)) {
		/* No room in the key's probe window: nobody could join it. */
		kvshm_page_free(d->h, r->page, r->gen, kvd_owner(c));
		free(r);
		return KVPROTO_SHORT_POOL;
	}
	d->slices[r->page] = r;
	r->prev = d->slice_new;
	if (d->slice_new)
		d->slice_new->next = r;
	else
		d->slice_old = r;
	d->slice_new = r;
	out->page = r->page;
	out->gen = r->gen;
	return 0;
}

int kvd_slice_check(const struct kvd *d, const struct kvd_client *c, uint32_t page,
		    uint32_t gen, const struct kvshm_key *key)
{
	const struct kvd_slices *r = rec_of(d, page);
	const uint32_t s = c->part.slice;

	if (!r || r->gen != gen || r->who[s] != kvd_owner(c) || !(open_slices(r) >> s & 1))
		return -1;
	if (key && !kvshm_key_eq(*key, r->key))
		return -1;	/* a slice is published as the block it was granted for */
	return r->dropped ? 1 : 0;
}

bool kvd_slice_written(struct kvd *d, const struct kvd_client *c, uint32_t page)
{
	struct kvd_slices *r = d->slices[page];

	r->written |= 1u << c->part.slice;
	return r->written == (r->writers >= 32 ? UINT32_MAX : (1u << r->writers) - 1);
}

void kvd_slice_release(struct kvd *d, const struct kvd_client *c, uint32_t page)
{
	struct kvd_slices *r = rec_of(d, page);
	const uint32_t s = c->part.slice;

	if (!r || r->who[s] != kvd_owner(c) || !(open_slices(r) >> s & 1))
		return;
	/* Its slice will never come: no longer open, never written. */
	r->claimed &= ~(1u << s);
	r->who[s] = 0;
	drop(d, r);
}

uint32_t kvd_slice_open(const struct kvd *d, uint32_t page, uint32_t *owners)
{
	const struct kvd_slices *r = rec_of(d, page);
	uint32_t s, n = 0;

	for (s = 0; r && s < r->writers; s++)
		if (open_slices(r) >> s & 1)
			owners[n++] = r->who[s];
	return n;
}

bool kvd_slice_holds(const struct kvd *d, const struct kvd_client *c, uint32_t page)
{
	const struct kvd_slices *r = rec_of(d, page);

	return r && r->who[c->part.slice] == kvd_owner(c) && (open_slices(r) >> c->part.slice & 1);
}

void kvd_slice_tick(struct kvd *d)
{
	uint64_t now;

	if (!d->slice_old)
		return;
	now = kvd_now_ms();
	/* Oldest first: the first not due ends the look (records are made
	 * in order with the same timeout). */
	while (d->slice_old && d->slice_old->due_ms <= now)
		drop(d, d->slice_old);
	kvd_flight_wake(d);
}
