// SPDX-License-Identifier: MIT
/*
 * flight_wait.c - single-flight prefill, the client side: the run of blocks
 * after the hits that other clients are writing right now
 * (kvc_req_inflight), and waiting for them (kvc_wait) instead of
 * computing them a second time.
 *
 * Which blocks are in flight is flight_scan.c's question; waiting for them
 * is this file's.
 *
 * A writer's pages are announced by the daemon when it grants them
 * (ALLOC_KEYS): the index names each page under its block's key while it
 * is still WRITING (shm/page.h). A waiter sleeps with FUTEX_WAIT on the
 * writer's client-row `flight` word in the read-only segment mapping; the
 * daemon bumps that word and wakes it when the writer publishes, frees
 * its pages, or dies (daemon/core/flight.c). Then the waiter pins what was
 * published, as a lookup would, and goes on to the next block.
 *
 * While it sleeps the waiter holds no lock of the handle (other threads
 * go on with their requests), no pin slot and no page for the blocks it
 * waits for: a writer that dies leaves it a miss, never a hang, and the
 * timeout of the request's first wait bounds all its waits together. A
 * daemon that dies wakes nobody, so the sleep is cut in slices of about
 * a tick, after each of which the socket says whether the daemon hung up
 * (-ENOTCONN).
 */
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "client_int.h"
#include "../shm/index.h"
#include "../shm/page.h"

size_t kvc_req_inflight(const struct kvc_req *r)
{
	return r && r->stage == 1 ? r->t3 : 0;
}

static void deadline_in(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static bool before(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static bool passed(const struct timespec *deadline)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return !before(&now, deadline);
}

/*
 * Sleep while *w == val, until the absolute CLOCK_MONOTONIC deadline. A
 * shared futex (no FUTEX_PRIVATE_FLAG): the waker is the daemon, through
 * its own mapping of the segment. Any return (woken, value changed, a
 * signal, the deadline) sends the caller back to look at the page.
 */
static void sleep_on(const _Atomic uint32_t *w, uint32_t val, const struct timespec *deadline)
{
	syscall(SYS_futex, w, FUTEX_WAIT_BITSET, val, deadline, NULL, FUTEX_BITSET_MATCH_ANY);
}

/*
 * A daemon that dies (SIGKILL, a crash) wakes nobody: its segment stays
 * mapped here with the writer's pages still marked in flight. So a wait
 * sleeps in slices of KVCI_WAIT_SLICE_MS (about a daemon tick) and, after
 * each, asks the socket whether the daemon hung up: one poll() with no
 * timeout, a few system calls a slice, nothing per block. When another
 * thread holds the socket for a round trip, that round trip finds out
 * itself. Returns true when the handle is dead (now or before).
 */
static bool daemon_gone(kvc_t *c)
{
	if (!pthread_mutex_trylock(&c->io_lock)) {
		struct pollfd p = { .fd = c->fd, .events = POLLRDHUP };

		if (c->fd >= 0 && poll(&p, 1, 0) > 0 &&
		    (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)))
			kvci_mark_dead(c);
		pthread_mutex_unlock(&c->io_lock);
	}
	return kvc_usable(c) != 0;
}

/* The earlier of the deadline and one slice from now. */
static void slice_end(const struct timespec *deadline, struct timespec *ts)
{
	deadline_in(ts, KVCI_WAIT_SLICE_MS);
	if (before(deadline, ts))
		*ts = *deadline;
}

enum wait_end { WAIT_SERVED, WAIT_TIMEOUT, WAIT_LOST };

int kvc_wait(struct kvc_req *r, int timeout_ms)
{
	const struct kvshm_header *h;
	struct kvshm_ledger *l;
	struct timespec deadline, until;
	size_t from, run, seen, i;
	bool gone = false;
	enum wait_end end;
	kvc_t *c;
	int rc;

	if (!r || r->stage != 1 || timeout_ms < 0)
		return -EINVAL;
	c = r->c;
	if ((rc = kvc_usable(c)))
		return rc;
	h = c->seg;
	l = c->ledger;
	from = r->hits;
	run = r->t3;
	/* The block we last saw in flight: gone unpublished means lost. */
	seen = run ? from : SIZE_MAX;
	deadline_in(&deadline, timeout_ms);
	/* The request's first wait sets its deadline; no later one passes it
	 * (a writer that frees and announces again and again cannot keep a
	 * caller's kvc_wait / kvc_alloc loop going). */
	if (!r->wait_armed) {
		r->wait_armed = true;
		r->wait_until = deadline;
	} else if (before(&r->wait_until, &deadline)) {
		deadline = r->wait_until;
	}
	for (;;) {
		_Atomic uint32_t *w;
		uint32_t owner, again, f;
		bool missed;

		/* What was published meanwhile is a hit now. */
		i = kvci_pin_run(r, r->hits, &missed);
		r->hits = (uint32_t)i;
		if (i >= r->n || !missed) {
			end = WAIT_SERVED;	/* all hit, or out of pin slots */
			break;
		}
		if (!kvci_block_inflight(r, i, &owner)) {
			/* Neither cached nor in flight: the writer we waited
			 * for released it unpublished, or died. */
			end = seen == i ? WAIT_LOST : WAIT_SERVED;
			break;
		}
		seen = i;
		/* The word first, then the page still in flight: the daemon
		 * ends the flight before it bumps the word. */
		w = kvshm_flight_word(h, owner);
		f = atomic_load_explicit(w, memory_order_acquire);
		if (!kvci_block_inflight(r, i, &again) || again != owner)
			continue;
		if (passed(&deadline)) {
			end = WAIT_TIMEOUT;
			break;
		}
		slice_end(&deadline, &until);
		sleep_on(w, f, &until);
		if (daemon_gone(c)) {
			gone = true;
			end = WAIT_LOST;
			break;
		}
	}
	if (r->hits > from) {
		kvshm_ledger_hit(l, r->keys[0], (uint64_t)(r->hits - from) * c->bt, r->label);
		r->t1 = 0;	/* spilled blocks, if any, are hits or misses now */
	}
	if (run || seen != SIZE_MAX) {
		_Atomic uint64_t *out = end == WAIT_SERVED ? &l->wait_served :
					end == WAIT_TIMEOUT ? &l->wait_timeouts : &l->wait_lost;

		atomic_fetch_add_explicit(&l->waits, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(out, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&l->wait_tokens, (uint64_t)(r->hits - from) * c->bt,
					  memory_order_relaxed);
	}
	/* Single flight from here on, unless the caller gave up waiting:
	 * its kvc_alloc then refuses to compute a block someone else began
	 * writing since (-EINPROGRESS), so that it waits for that one too. */
	r->single = timeout_ms > 0 && end != WAIT_TIMEOUT && !passed(&deadline);
	r->t3 = 0;
	kvci_count(r);
	return gone ? -ENOTCONN : (int)r->hits;
}
