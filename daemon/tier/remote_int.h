/* SPDX-License-Identifier: MIT */
/*
 * remote_int.h - the remote tier's state, shared by its files (private):
 * remote.c (the main thread's side: the tier's functions, completions),
 * remote_worker.c (the kvd_remote_worker threads' puts, gets and probes) and
 * remote_open.c (the secret, the servers, open).
 */
#ifndef KVD_REMOTE_INT_H
#define KVD_REMOTE_INT_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libmemcached/memcached.h>

#include "../../shm/index.h"
#include "../../shm/page.h"
#include "../obs/events.h"
#include "../pool/pool.h"
#include "../policy/policy.h"
#include "../util/clock.h"
#include "../util/log.h"
#include "remote.h"
#include "remote_conn.h"
#include "../../fmt/remote_item.h"
#include "tier.h"

#define WORKERS 4
#define PROBE_NS 1000000000ull		/* probe every server once a second */
#define OWNER_REMOTE (UINT32_MAX - 1)	/* page owner while a fetch fills it */
#define SECRET_MIN 16
#define SECRET_MAX 4096
#define DEADLINE_BPS 100e6		/* bytes/s a fetch's deadline allows for */

enum { RJ_PUT, RJ_GET, RJ_PROBE };

/* A kvd_remote_worker's outcome for a put or a fetch item. */
enum {
	RES_OK = 0,
	RES_MISS,	/* not in the store */
	RES_BAD,	/* failed a check: dropped */
	RES_DOWN,	/* its server failed or is down */
	RES_TIMEOUT,	/* its server did not answer in time */
	RES_TOOBIG,	/* the server refuses items this large (-I) */
	RES_SKIP,	/* not attempted (server known down) */
};

struct rsrv {
	struct kvd_rserver at;
	char name[300];		/* for messages */
	_Atomic int up;		/* written by workers and the probe */
	_Atomic unsigned epoch;	/* probe: bumped when it comes back */
	int logged;		/* main thread: the state last logged */
	memcached_st *probe;	/* the probe job's handle for this server */
};

struct ritem {
	struct kvshm_key key, parent;
	uint32_t page, gen;
	uint32_t srv;
	uint8_t res;		/* kvd_remote_worker: RES_* */
	uint8_t fail;		/* kvd_remote_worker: enum kvd_rval_fail for RES_BAD */
	uint8_t *stage;		/* cuda pool: the payload, copied in by the main thread */
	int32_t *status;	/* into the restore; unused once replied */
	uint32_t *tokens;	/* bt of them, in the fetch */
};

struct rfetch {
	struct kvd_restore *rq;	/* NULL once answered */
	struct kvshm_ns ns;	/* the client's namespace row, for the checks */
	uint32_t ns_id, n, left;	/* items; jobs not reaped yet */
	uint64_t t0, deadline, bytes;
	struct rfetch *next;	/* in flight, for the deadline */
	struct ritem it[];
};

struct rjob {
	struct rjob *next;
	uint8_t kind;
	uint8_t res;		/* put: RES_* */
	int err;		/* put: the connection's -errno, for the log */
	uint32_t srv;
	/* put */
	uint32_t page, gen;	/* held page, when the kvd_remote_worker copies it */
	bool held;
	uint8_t *val;		/* the item, its payload already in when !held */
	size_t len;
	uint32_t ns_id;
	struct kvshm_ns ns;
	struct kvshm_key key, parent;
	uint32_t *tokens;
	char mkey[KVD_RVAL_KEY_MAX];
	/* get: items idx[0..n) of f */
	struct rfetch *f;
	uint32_t n;
	uint32_t idx[];
};

struct rworker {
	struct kvd_remote *r;
	pthread_t th;
	struct kvd_mconn conn[KVD_REMOTE_MAX_SERVERS];	/* one per server, our own */
	struct kvd_rmac *mac;
	unsigned seen[KVD_REMOTE_MAX_SERVERS];	/* epochs acted upon */
	uint8_t *head;		/* a held put's header and tokens */
	bool started;
};

struct kvd_remote {
	struct kvd_ground *g;
	struct rsrv srv[KVD_REMOTE_MAX_SERVERS];
	unsigned nsrv;
	memcached_st *mc;		/* main thread: key -> server */
	struct kvd_rmac *mac;		/* template for the workers' */
	struct rworker w[WORKERS];
	int efd;
	uint32_t bt;
	uint64_t slot_bytes, timeout_ns;
	/* Dropped items: one warning an interval, then a count (a host
	 * with the wrong secret would log every block of every fetch). */
	struct kvd_ratelimit drop_log;
	bool cuda;
	int mode;			/* enum kvd_remote_write */
	char prefix[KVD_RVAL_PREFIX_MAX];

	pthread_mutex_t lock;		/* the queues below */
	pthread_cond_t wake;
	struct rjob *gets, **gets_tail, *puts, **puts_tail, *done;
	struct rjob *probe;		/* queued probe job, or NULL */
	bool stop;

	/* Main thread only. */
	uint16_t *hold;			/* page -> puts still reading it */
	uint32_t *clean;		/* page -> gen + 1 when it came from here */
	uint32_t puts_out, puts_cap;	/* put jobs not reaped */
	bool probing;
	uint64_t next_probe;
	unsigned up_logged;		/* servers up at the last log line */
	bool said_toobig;
	struct rfetch *inflight;
};

/* The tier's state, as it registered it (NULL: not open). */
static inline struct kvd_remote *remote_of(const struct kvd_ground *g)
{
	return kvd_tier_state(g, KVD_TIER_REMOTE);
}

static inline struct kvshm_stats *st_of(struct kvd_ground *g)
{
	return kvshm_stats(g->h);
}

/* remote_worker.c */
void *kvd_remote_worker(void *arg);
void kvd_remote_enqueue(struct kvd_remote *r, struct rjob *j);

/* remote.c: the tier's functions, which kvd_remote_open registers. */
extern const struct kvd_tier kvd_remote_tier;
int kvd_remote_place(struct kvd_ground *g, struct rfetch *f, struct ritem *it);
void kvd_remote_probe_start(struct kvd_remote *r, uint64_t now);

#endif
