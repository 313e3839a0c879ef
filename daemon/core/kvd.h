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
 */
#ifndef KVD_H
#define KVD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "../../shm/ledger.h"
#include "../../shm/proto.h"
#include "../../shm/segment.h"
#include "../config.h"
#include "../pool/memfd.h"
#include "../pool/pool.h"
#include "../tier/tier.h"

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
	uint32_t writing;	/* pages this client holds WRITING */
	char comm[16];
	struct kvd_memfd ledger;
	struct kvshm_ledger *l;	/* client-writable: bound-check all of it */
	uint32_t nslots;	/* our own record of the ledger's size */
	uint64_t ring_seen;
	uint64_t hit_seen;	/* hit ring records consumed */
	/* nsstat.c: this client's ledger counters already added to its
	 * namespace's statistics; drop.c: d->ticks + 1 at its last DROP. */
	uint64_t ns_seen[KVD_NS_FOLD];
	uint64_t drop_tick;

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
	uint8_t *damaged;		/* n_pages: punched out by a client (evict.c),
					 * NULL until the first hole */
	uint32_t hand;			/* CLOCK hand */
	uint32_t low_pages, high_pages;

	uint64_t ticks;
	/* Eviction backs off after a pass that freed nothing (all pinned or
	 * writing): no pass before tick evict_quiet_until, unless the pin
	 * census sees pins fall below evict_quiet_pins. */
	uint64_t evict_quiet_until;
	uint64_t evict_quiet_pins;
	uint32_t evict_backoff;
	struct kvd_metrics *metrics;	/* /metrics server, or NULL */
	struct kvd_spill *spill;	/* spill tier (spill.c), or NULL */
	struct kvd_remote *remote;	/* remote tier (remote.c), or NULL */
	const struct kvd_tier *tier[KVD_TIER_MAX];	/* by level; NULL: none */
	struct kvd_events *events;	/* KV events (events.c), or NULL */
	uint64_t watchdog_usec;		/* 0: no systemd watchdog */
	uint64_t watchdog_last;		/* CLOCK_MONOTONIC usec of the last ping */

	/* Counters of clients that have left, folded into the totals. */
	uint64_t gone_lookups, gone_hits, gone_misses, gone_pinfail;
	uint64_t gone_lookup_tokens, gone_hit_tokens;

	/* nsstat.c: the sweep counting each namespace's READY pages, a
	 * slice of the page table per tick: where it is, counts so far. */
	uint32_t ns_sweep_at;
	uint32_t ns_sweep_pages[KVD_MAX_NS];
	/* Single flight (flight.c): writers (owner ids) whose waiters to
	 * wake once the message being handled is done; all of them when
	 * more were noted than fit. Wait counters of clients that left. */
	uint32_t flight_wake[KVD_FLIGHT_WAKE];
	uint32_t n_flight_wake;
	bool flight_wake_all;
	uint64_t gone_waits[KVD_WAIT_STATS];

	/* Clients marked closing, in the order they were (reply.c); the
	 * event loop drops them (kvd_server_drop_closing). */
	struct kvd_client *closing, *closing_tail;
	/* What the tiers may call in the core (restore.c sets it). */
	const struct kvd_tier_host *tier_host;
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

/* CLOCK_MONOTONIC in milliseconds. */
static inline uint64_t kvd_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Single-writer stat update (relaxed; see kvshm_stats). */
static inline void kvd_stat_add(_Atomic uint64_t *c, int64_t v)
{
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)v,
			      memory_order_relaxed);
}

/*
 * A frame's handler: the handler column of the frame table
 * (KVPROTO_FRAMES, shm/proto.h), run by the dispatch (server.c) on a
 * frame kvproto_decode passed: hdr, then its hdr->len payload bytes at p.
 * Returns 0, or -1 when c is closing or done (nothing more is read).
 */
typedef int kvd_frame_fn(struct kvd *d, struct kvd_client *c, const struct kvproto_hdr *hdr,
			 const void *p);

/* server.c */
/* Before anything is allocated: the socket path fits, and no live daemon
 * serves it. 0 or -1 (logged). */
int kvd_server_precheck(const struct kvd *d);
int kvd_server_open(struct kvd *d);
int kvd_server_run(struct kvd *d);
void kvd_server_close(struct kvd *d);
/*
 * Decode and dispatch one complete frame (header and exactly its payload)
 * from client c. Returns 0, or -1 when c is closing or done. The server
 * calls it on c->in; the daemon_frames fuzz target calls it too, so that
 * it fuzzes the dispatch the daemon runs.
 */
int kvd_server_frame(struct kvd *d, struct kvd_client *c, const uint8_t *in);
/* Drop every client a handler marked closing (the loop, after each
 * handler; the fuzz target, after each step). */
void kvd_server_drop_closing(struct kvd *d);

/* reply.c */
/* epoll_ctl on d's epoll set, tag in data.u64. */
int kvd_ep_set(struct kvd *d, int op, int fd, uint32_t events, uint64_t tag);
/* Queue a reply; 0, or -1 when the client is closing (its send failed). */
int kvd_reply(struct kvd *d, struct kvd_client *c, uint16_t type, uint32_t seq,
	      const void *p1, uint32_t n1, const void *p2, uint32_t n2);
/* Send what is queued; -1 when the peer is gone. */
int kvd_client_flush(struct kvd *d, struct kvd_client *c);
/* End c's connection: the event loop drops it when the handler returns
 * (a BYE: everything it held goes at once). The first reason stands. */
void kvd_client_close(struct kvd *d, struct kvd_client *c, const char *why, bool bye);
/* A restore is parked on c: read nothing more from it until its reply
 * (only a hang-up is noticed meanwhile); resume once the reply is sent. */
void kvd_client_park(struct kvd *d, struct kvd_client *c);
void kvd_client_resume(struct kvd *d, struct kvd_client *c);
/* BYE (a frame handler): end the connection, releasing all at once. */
kvd_frame_fn kvd_client_bye;
/* Send an ERROR; fatal ones end the connection (kvd_client_close). */
void kvd_reply_error(struct kvd *d, struct kvd_client *c, uint32_t seq,
		     int err, bool fatal, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

/* registry.c */
/*
 * Find or add the namespace `want` (identity fields and id filled); returns
 * its row, or -1 when the table is full. With may_reclaim, the row of a
 * namespace without clients is taken over (its pages evicted) when no row
 * is free.
 */
int kvd_registry_ns(struct kvd *d, const struct kvshm_ns *want, bool may_reclaim);
/* HELLO (a second one is refused). */
kvd_frame_fn kvd_registry_hello;
/*
 * The client's connection ends. After a BYE (bye = true), or when its
 * process is gone, everything it held is released at once. Otherwise (a
 * protocol violation, or a hang-up from a process that lives on) its ledger
 * keeps counting and its WRITING pages stay its own until its pidfd says
 * the process exited: its threads may still be reading pinned pages.
 */
void kvd_registry_drop(struct kvd *d, struct kvd_client *c, const char *why);
/* POOL: a cuda pool's chunk fds for an attached client (-1: closing). */
kvd_frame_fn kvd_registry_pool;
void kvd_registry_bye(struct kvd *d, struct kvd_client *c);
/* The lingering client's process exited: release everything. */
void kvd_registry_exited(struct kvd *d, struct kvd_client *c);
/* STAT: hand an observer the segment fd, then end it. Returns -1. */
kvd_frame_fn kvd_registry_stat;
void kvd_registry_tick(struct kvd *d);

/* cache.c: ALLOC, PUBLISH, FREE. Return 0, or -1 if c is closing. */
kvd_frame_fn kvd_cache_alloc;
kvd_frame_fn kvd_cache_publish;
kvd_frame_fn kvd_cache_free;
/* Pages one process may hold pinned or writing: max-share of the pool. */
uint32_t kvd_share_pages(const struct kvd *d);
/* Give back every WRITING page of owner; returns how many. */
uint32_t kvd_cache_reclaim(struct kvd *d, uint32_t owner);

/* cache.c: ALLOC_KEYS (ALLOC with the blocks' keys: announced pages). */
kvd_frame_fn kvd_cache_alloc_keys;

/* flight.c: single flight */
/* Is the claimed block in flight by a client other than c, or cached? */
bool kvd_flight_taken(struct kvd *d, const struct kvd_client *c,
		      const struct kvproto_claim *cl);
/* Before a page may leave flight (publish, free, reclaim): note its
 * writer; _key notes the writer of the page the index names for key. */
void kvd_flight_note(struct kvd *d, uint32_t page);
void kvd_flight_note_key(struct kvd *d, struct kvshm_key key);
/* After the change: bump each noted writer's flight word and wake. */
void kvd_flight_wake(struct kvd *d);
/* c's connection ended while its process lives on: its announced pages
 * leave flight (they stay its own, WRITING) and their waiters wake to a
 * miss at once instead of waiting for its exit or their timeout. */
void kvd_flight_drop(struct kvd *d, const struct kvd_client *c);
/* Fold the clients' wait counters into the stats; keep a leaver's. */
void kvd_flight_fold(struct kvd *d);
void kvd_flight_retire(struct kvd *d, const struct kvd_client *c);

/* top.c */
/* Pin slots of c's ledger naming a page right now (c's own word). */
uint32_t kvd_ledger_pins(const struct kvd *d, const struct kvd_client *c);
/* c holds pages: WRITING ones, or pins in its ledger. */
bool kvd_client_holds(const struct kvd *d, const struct kvd_client *c);
/* Feed c's new hit records into the top-prefix sketch. */
void kvd_top_drain(struct kvd *d, struct kvd_client *c);
/* Count pinned pages and pins in use over all ledgers. */
void kvd_pin_census(struct kvd *d);

/* evict.c */
/* Free up to `want` READY pages nobody pins; returns how many. */
/* may_wait: the caller needs the pages now and waits for spill writes;
 * without it (the tick), eviction takes only what the spill tier can
 * start writing at once. */
uint32_t kvd_evict(struct kvd *d, uint32_t want, bool may_wait);
/* Evict every READY page of namespace ns_id that nobody pins; returns how
 * many are left (pinned or writing). */
uint32_t kvd_evict_ns(struct kvd *d, uint32_t ns_id);
/* Drain access rings, drop punched-out pages, then evict down to the
 * watermarks. */
void kvd_evict_tick(struct kvd *d);

/* nsstat.c: per-namespace statistics, and resetting all the counters. */
/* On the tick: fold the live clients' new ledger counts into their
 * namespaces' statistics, count clients, sweep a slice of the pages. */
void kvd_nsstat_tick(struct kvd *d);
/* A client leaves: fold what it counted since the last tick. */
void kvd_nsstat_retire(struct kvd *d, struct kvd_client *c);
/* Zero row ns_id's statistics (before the row is written for a
 * namespace). */
void kvd_nsstat_clear(struct kvd *d, uint32_t ns_id);
/* Zero every counter: daemon-wide, per namespace, the top-prefix sketch. */
void kvd_stats_reset(struct kvd *d);
/* RESET from c (before HELLO): reset if c is root or the daemon's own
 * user, else refuse. Always ends c's connection: returns -1. */
kvd_frame_fn kvd_nsstat_reset_req;

/* restore.c */
/*
 * RESTORE (keys only) or FETCH (parent, keys and tokens) from client c:
 * bring the blocks the tiers hold into pool pages and reply with one
 * status per block, now or, when a tier deferred, once it is done (the
 * client's further frames wait meanwhile). Returns 0, or -1 if c is
 * closing.
 */
kvd_frame_fn kvd_restore;
/* The core's side of the tier interface (d->tier_host). */
extern const struct kvd_tier_host kvd_core_tier_host;

/* drop.c: DROP from c: evict every unpinned block of c's namespace (pool
 * pages and spill slots). Returns 0, or -1 if c was dropped. */
kvd_frame_fn kvd_drop_ns;

/* top.c: empty the top-prefix sketch (a reset of the statistics). */
void kvd_top_reset(struct kvd *d);

#endif
