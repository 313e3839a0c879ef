// SPDX-License-Identifier: MIT
/*
 * flight.c - the daemon side of single-flight prefill: which blocks are
 * being written right now, and waking the clients that wait for them.
 *
 * A client's ALLOC_KEYS says which block each granted page is for; the
 * page is then announced (shm/page.h, kvshm_page_announce): the index
 * names it under the block's key while it is still WRITING. Another
 * client's lookup finds the block in flight and may sleep until it is
 * published, with FUTEX_WAIT on the writer's client-row `flight` word
 * (read-only mapping of the segment: a shared futex keyed by the memfd's
 * inode and offset, so the daemon's writable mapping of the same word
 * wakes it). The daemon keeps no list of waiters and does nothing per
 * waiter or per tick: after every message that may end announcements
 * (PUBLISH, FREE, a client's pages reclaimed) it bumps the word of each
 * writer concerned and issues one FUTEX_WAKE per writer. The wake costs a
 * system call of a bounded, kernel-side duration whether anyone sleeps or
 * not; no client controls how long it takes.
 *
 * Order, for the waiter's check-then-sleep: the page leaves flight first
 * (shm/page.c), the word changes after (release), the wake comes last. A
 * waiter reads the word, then checks its page is still in flight, then
 * sleeps on the value it read: either it saw the page leave flight, or the
 * word it sleeps on is about to change and the wake comes after it
 * queued, or FUTEX_WAIT sees the new value and returns at once.
 *
 * Must never: wake before the page state changed, or trust the counters a
 * ledger holds for anything but display.
 */
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../shm/index.h"
#include "../../shm/page.h"
#include "kvd.h"
#include "flight.h"

#define RELAXED memory_order_relaxed

bool kvd_flight_taken(struct kvd *d, const struct kvd_client *c,
		      const struct kvproto_claim *cl)
{
	uint32_t loc = kvshm_index_find(d->h, cl->key), owner;
	const struct kvshm_page *p;

	if (loc >= d->h->geo.n_pages)
		return false;
	/* A page of ranks writing slices that waits for this client's own
	 * slice is not taken: its ALLOC joins it (slice.c). */
	if (kvshm_page_inflight(d->h, loc, c->ns_id, cl->key, cl->parent, kvd_owner(c),
				c->part.writers, c->part.slice, &owner))
		return true;
	/* Published since the caller's lookup: it can pin it (the tokens,
	 * which a claim does not carry, are the client's to verify). */
	p = &kvshm_pages(d->h)[loc];
	return atomic_load(&p->state) == KVSHM_PAGE_READY && p->ns_id == c->ns_id &&
	       kvshm_key_eq(p->key, cl->key) && kvshm_key_eq(p->parent, cl->parent);
}

void kvd_flight_note(struct kvd *d, uint32_t page)
{
	const struct kvshm_page *p;
	uint32_t owner, i;

	if (page >= d->h->geo.n_pages)
		return;
	p = &kvshm_pages(d->h)[page];
	if (!atomic_load_explicit(&p->flight, RELAXED))
		return;
	owner = p->owner;
	if (!owner || owner > d->h->geo.max_clients)
		return;
	for (i = 0; i < d->n_flight_wake; i++)
		if (d->flight_wake[i] == owner)
			return;
	if (d->n_flight_wake < KVD_FLIGHT_WAKE)
		d->flight_wake[d->n_flight_wake++] = owner;
	else
		d->flight_wake_all = true;
}

void kvd_flight_note_key(struct kvd *d, struct kvshm_key key)
{
	kvd_flight_note(d, kvshm_index_find(d->h, key));
}

static void wake_owner(struct kvd *d, uint32_t owner)
{
	_Atomic uint32_t *w = kvshm_flight_word(d->h, owner);

	atomic_store_explicit(w, atomic_load_explicit(w, RELAXED) + 1, memory_order_release);
	/* Shared (not FUTEX_PRIVATE): the sleepers are other processes. */
	syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void kvd_flight_wake(struct kvd *d)
{
	uint32_t i;

	if (d->flight_wake_all) {
		for (i = 1; i <= d->h->geo.max_clients; i++)
			wake_owner(d, i);
	} else {
		for (i = 0; i < d->n_flight_wake; i++)
			wake_owner(d, d->flight_wake[i]);
	}
	d->n_flight_wake = 0;
	d->flight_wake_all = false;
}

/* The ledger's wait counters, in the order of struct kvd's gone_waits. */
static void ledger_waits(const struct kvshm_ledger *l, uint64_t v[KVD_WAIT_STATS])
{
	v[0] = atomic_load_explicit(&l->waits, RELAXED);
	v[1] = atomic_load_explicit(&l->wait_served, RELAXED);
	v[2] = atomic_load_explicit(&l->wait_timeouts, RELAXED);
	v[3] = atomic_load_explicit(&l->wait_lost, RELAXED);
	v[4] = atomic_load_explicit(&l->wait_tokens, RELAXED);
}

void kvd_flight_retire(struct kvd *d, const struct kvd_client *c)
{
	uint64_t v[KVD_WAIT_STATS];
	int k;

	ledger_waits(c->l, v);
	for (k = 0; k < KVD_WAIT_STATS; k++)
		d->gone_waits[k] += v[k];
}

void kvd_flight_fold(struct kvd *d)
{
	struct kvshm_stats *st = kvshm_stats(d->h);
	_Atomic uint64_t *out[KVD_WAIT_STATS] = { &st->waits, &st->wait_served,
						  &st->wait_timeouts, &st->wait_lost,
						  &st->wait_tokens };
	uint64_t sum[KVD_WAIT_STATS], v[KVD_WAIT_STATS];
	uint32_t i;
	int k;

	memcpy(sum, d->gone_waits, sizeof(sum));
	for (i = 0; i < d->cfg.max_clients; i++) {
		if (!kvd_live(&d->clients[i]))
			continue;
		ledger_waits(d->clients[i].l, v);
		for (k = 0; k < KVD_WAIT_STATS; k++)
			sum[k] += v[k];
	}
	for (k = 0; k < KVD_WAIT_STATS; k++)
		atomic_store_explicit(out[k], sum[k], RELAXED);
}

void kvd_flight_drop(struct kvd *d, const struct kvd_client *c)
{
	const struct kvshm_page *pages = kvshm_pages(d->h);
	uint32_t i, owner = kvd_owner(c), n = 0;

	if (!c->writing)
		return;
	for (i = 0; i < d->h->geo.n_pages; i++) {
		if (pages[i].owner != owner || !atomic_load_explicit(&pages[i].flight, RELAXED) ||
		    atomic_load_explicit(&pages[i].state, RELAXED) != KVSHM_PAGE_WRITING)
			continue;
		kvd_flight_note(d, i);	/* while it is still in flight */
		kvshm_page_unannounce(d->h, i);
		n++;
	}
	if (n)
		kvd_flight_wake(d);
}
