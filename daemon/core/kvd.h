/* SPDX-License-Identifier: MIT */
/*
 * kvd.h - the daemon's state, shared by its .c files (private).
 *
 * kvcached serves from one thread: an epoll loop over the listening
 * socket, the client sockets, a signalfd and a timerfd. That thread is the
 * only writer of the shared segment, which is what lets the index and page
 * table be read by clients with no lock at all. (One helper thread exists
 * for a while after start: it pre-faults pool memory and touches nothing
 * else; see pool_host.c. With --kv-events, libzmq's I/O thread moves the
 * event batches from its queues to the network; it never sees the
 * segment; see events.c.)
 *
 * Only the state lives here, with the few inline helpers that read it;
 * each module declares its functions in its own header (server.h,
 * reply.h, registry.h, alloc.h, publish.h, restore.h, evict.h, flight.h, slice.h,
 * nsstat.h, census.h, top.h, drop.h; tier.h for the tiers).
 */
#ifndef KVD_H
#define KVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "../../shm/ledger.h"
#include "../../shm/proto.h"
#include "../../shm/segment.h"
#include "../util/settings.h"
#include "../policy/policy.h"
#include "../pool/memfd.h"
#include "../pool/pool.h"
#include "../tier/tier.h"
#include "../util/clock.h"
#include "../util/ground.h"

/* Namespace rows the daemon keeps (the segment's max_ns). */
#define KVD_MAX_NS 64
/* Ledger counters folded into per-namespace statistics (nsstat.c). */
#define KVD_NS_FOLD 6

struct kvd_client {
	bool used;
	bool hello;		/* HELLO accepted, ledger mapped */
	bool lingering;		/* socket gone, process alive: pins still count */
	bool refused;		/* its HELLO was refused (counted as such) */
	int pidfd;		/* the peer process, or -1 */
	uint32_t id;		/* row in d->clients; owner id is id + 1 */
	int fd;
	pid_t pid;
	uint64_t since_ms;	/* kvd_now_ms() at accept: HELLO deadline */
	uid_t uid;
	gid_t gid;
	uint32_t ns_id;
	uint32_t bt;
	/* Its tensor-parallel part (HELLO's shard): which slice of a page it
	 * writes, of how many (slice.c), or that it only reads. */
	struct kvproto_part part;
	uint32_t writing;	/* pages this client holds WRITING (a slice of a
				 * page several ranks write counts while open) */
	/* Its key space: the root of its chains, from its namespace and the
	 * salt its HELLO carried (shm/key.h); every key it publishes is
	 * recomputed under it (publish.c). */
	struct kvshm_key root;
	bool no_insert;		/* HELLO said KVPROTO_HELLO_NO_INSERT */
	uint32_t own_share;	/* percent it asked to be held to; 0: max-share */
	uint32_t tenant;	/* row in the tenant table (quota.c) */
	char comm[16];
	struct kvd_memfd ledger;
	struct kvshm_ledger *l;	/* client-writable: bound-check all of it */
	uint32_t nslots;	/* our own record of the ledger's size */
	uint64_t ring_seen;
	uint32_t ring_last;	/* 1 + the page the last drain ended on (a run
				 * goes on from it); 0: none */
	uint64_t hit_seen;	/* hit ring records consumed */
	/* nsstat.c: this client's ledger counters already added to its
	 * namespace's statistics; drop.c: d->ticks + 1 at its last DROP. */
	uint64_t ns_seen[KVD_NS_FOLD];
	uint64_t drop_tick;
	/* The handles of one process, linked (row + 1; 0: none), so that its
	 * max-share is summed over its handles, never over every row. */
	uint32_t proc_prev, proc_next;
	/* Max-share (alloc.c), kept per handle and summed per process:
	 * census_pins, the distinct pages its ledger named when the pin
	 * census (census.c) last read it; fresh, the pages it published since
	 * that read began (an honest client holds them pinned). */
	uint32_t census_pins, census_count;
	uint64_t fresh, fresh_at_census;
	bool census_reading;	/* the census is part way through its slots */

	/* Framing: one message at a time is read into `in`. */
	uint8_t *in;
	uint32_t in_len, in_cap;
	/* Replies not yet accepted by the socket. */
	uint8_t *out;
	uint32_t out_len, out_off, out_cap;
	/* A restore whose reply waits for a tier (restore.c): nothing more
	 * is read from the client until it is sent. */
	struct kvd_restore *restore;

	/* Ended by a handler (kvd_client_close): the event loop drops it
	 * once the handler returns, for close_why (or as a BYE). */
	bool closing;
	bool close_bye;
	struct kvd_client *close_next;	/* d->closing list */
	char close_why[400];
};

/*
 * What a tenant or a namespace holds of the pool, as its share counts it
 * (quota.c): writing + pins + fresh + pinned, each kept as it changes, so
 * an ALLOC's check costs the same whatever the pool or the clients.
 */
struct kvd_group {
	uint64_t writing;	/* WRITING pages of its clients */
	uint64_t pins;		/* distinct pages of its own its clients pinned,
				 * as the last census pass found them */
	uint64_t count;		/* ... found by the pass under way so far */
	uint64_t fresh;		/* pages its clients published since */
	uint64_t fresh_at_pass;	/* fresh when the pass under way began */
	uint64_t pinned;	/* pages its pinned prefixes hold (pin.c) */
	uint32_t clients;	/* attached (live or lingering) */
};

/* A prefix kept resident with a time to live (pin.c); row i is the
 * segment's struct kvshm_pinned i. */
struct kvd_pin {
	uint32_t id;		/* 0: free */
	uint32_t ns_id, tenant;
	uint32_t n;		/* blocks */
	uint32_t resident;	/* blocks 0..resident-1 held, pages in page[] */
	bool flat;		/* engine keys: every parent is the root */
	struct kvshm_key root;	/* the key space's root: block 0's parent */
	struct kvshm_key *keys;	/* n */
	uint32_t *page;		/* n; the first `resident` hold pages */
	uint64_t expires_ms;	/* kvd_now_ms() */
};

/* A tenant row's daemon side: the salt (never in the segment). */
struct kvd_tenant {
	bool used;
	int cfg;		/* its line in cfg.tenants, or -1 */
	uint32_t salt_len;
	uint8_t salt[KVPROTO_MAX_SALT];
};

#define KVD_FLIGHT_WAKE 32	/* writers woken one by one per message */
#define KVD_WAIT_STATS 5	/* waits, served, timed out, lost, tokens */

struct kvd {
	struct kvd_config cfg;
	struct kvd_memfd seg;
	struct kvshm_header *h;
	struct kvd_pool pool;
	int lfd, epfd, sigfd, tfd;
	bool made_sock_dir;	/* server.c created the socket's folder */
	bool stop;

	struct kvd_client *clients;	/* cfg.max_clients rows */
	uint32_t n_clients;
	uint8_t *mark;			/* n_pages scratch for message checks */
	uint32_t *spare;		/* n_pages: a restored page is not evicted
					 * before tick spare[page] (evict.c), NULL
					 * until the first restore */
	struct kvd_policy pol;		/* pool pages' eviction order (policy.h) */
	/* Pages several tensor-parallel ranks write (slice.c): a record per
	 * such page while WRITING (n_pages pointers), and the records not
	 * given up, oldest first, for the tick's timeout. */
	struct kvd_slices **slices;
	struct kvd_slices *slice_old, *slice_new;
	uint32_t low_pages, high_pages;

	uint64_t ticks;
	/* Eviction backs off after a pass that freed nothing (all pinned or
	 * writing): no pass before tick evict_quiet_until, unless the pin
	 * census sees pins fall below evict_quiet_pins. */
	uint64_t evict_quiet_until;
	uint64_t evict_quiet_pins;
	uint32_t evict_backoff;
	uint64_t barrier_failed;	/* membarrier failures (logged at powers of 2) */
	uint64_t watchdog_usec;		/* 0: no systemd watchdog */
	uint64_t watchdog_last;		/* CLOCK_MONOTONIC usec of the last ping */

	/* Counters of clients that have left, folded into the totals. */
	uint64_t gone_lookups, gone_hits, gone_misses, gone_pinfail;
	uint64_t gone_lookup_tokens, gone_hit_tokens;

	/* Single flight (flight.c): writers (owner ids) whose waiters to
	 * wake once the message being handled is done; all of them when
	 * more were noted than fit. Wait counters of clients that left. */
	uint32_t flight_wake[KVD_FLIGHT_WAKE];
	uint32_t n_flight_wake;
	bool flight_wake_all;
	uint64_t gone_waits[KVD_WAIT_STATS];
	/* The pin census (census.c): a bounded slice of ledger slots per tick,
	 * resuming at (census_row, census_slot); one pass is numbered
	 * census_pass, and census_stamp[page] = pass << 32 | (row + 1) of the
	 * last handle that named the page in it. */
	uint64_t *census_stamp;
	uint64_t census_pass, census_pass_tick;
	uint32_t census_row, census_slot;
	uint64_t census_pins, census_pinned;

	/* Tenants and shares (quota.c): the tenant rows' salts, what each
	 * tenant and namespace holds, and per page the census pass that last
	 * counted it for its own tenant (qstamp_t) and namespace (qstamp_n). */
	struct kvd_tenant tenants[KVSHM_TENANTS];
	struct kvd_group tgrp[KVSHM_TENANTS];
	struct kvd_group ngrp[KVD_MAX_NS];
	uint32_t *qstamp_t, *qstamp_n;
	/* Pinned prefixes (pin.c) and, per page, how many of them hold it
	 * (NULL until the first pin): the evictor passes a held page by. */
	struct kvd_pin pins[KVSHM_PINNED];
	uint8_t *pin_held;
	uint32_t pin_next_id;

	/* Clients marked closing, in the order they were (reply.c); the
	 * event loop drops them (kvd_server_drop_closing). */
	struct kvd_client *closing, *closing_tail;
	/* What the lower floors see (util/ground.h): the settings, the
	 * segment and the pool above (kvd_ground_bind), pages punched out
	 * (evict.c), what the tiers may call in the core (restore.c's
	 * kvd_core_tier_host; main.c sets it), the tiers, KV events. */
	struct kvd_ground g;
	/* SIGHUP: main.c's reload (reload.c), and the command line it reads
	 * the settings from again. */
	void (*reload)(struct kvd *d);
	int argc;
	char **argv;
};

/* epoll tags: fixed sources, then one per client socket and pidfd. */
enum {
	KVD_EV_LISTEN = 1,
	KVD_EV_SIGNAL,
	KVD_EV_TIMER,
	KVD_EV_TIER,			/* + tier level (< KVD_TIER_MAX) */
	KVD_EV_EVENTS = KVD_EV_TIER + KVD_TIER_MAX,
	KVD_EV_CLIENT = 16,		/* + client id (max-clients <= 4096) */
	KVD_EV_PIDFD = 16 + 8192,	/* + client id */
};

/* A client whose socket is open (not lingering). */
static inline bool kvd_live(const struct kvd_client *c)
{
	return c->used && c->hello && !c->lingering;
}

/* A client whose ledger the evictor must honour: live or lingering. */
static inline bool kvd_pins_count(const struct kvd_client *c)
{
	return c->used && c->hello;
}

/* Owner id of a client's WRITING pages in the page table. */
static inline uint32_t kvd_owner(const struct kvd_client *c)
{
	return c->id + 1;
}

/* The daemon around its ground: what a callback the core answers for the
 * lower floors (struct kvd_tier_host) gets back. */
static inline struct kvd *kvd_of(struct kvd_ground *g)
{
	return (struct kvd *)((char *)g - offsetof(struct kvd, g));
}

/* Point the ground at d's settings, segment and pool (once d->h is set). */
static inline void kvd_ground_bind(struct kvd *d)
{
	d->g.cfg = &d->cfg;
	d->g.h = d->h;
	d->g.pool = &d->pool;
}


#endif
