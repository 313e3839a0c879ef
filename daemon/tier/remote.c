// SPDX-License-Identifier: MIT
/*
 * remote.c - the remote tier (tier 2): a block published on any host of a
 * fleet is a hit, after one fetch, on every other, through memcached
 * servers that all hosts share.
 *
 * Writing. With --remote-write publish (the default) every block a client
 * publishes is written once; with evict, only blocks the pool evicts.
 * The main thread never touches the network: it queues a put job and a
 * worker thread builds the item (remote_item.h: header, tokens, payload,
 * its MAC under the cluster secret) and stores it with libmemcached.
 * A published page is held (the evictor passes it by) until its worker
 * has copied it; an evicted page is copied into the job at once, so the
 * eviction goes on. Puts are best effort: past a cap, or to a server that
 * is down, they are skipped and counted.
 *
 * Finding. Clients never talk to memcached. A lookup reports the blocks
 * after its local hits and spilled run as a run that may be remote
 * (while remote_servers_up > 0); kvc_restore sends them in one FETCH with
 * their tokens. tier.c asks claim for each block the index does not
 * know; fetch takes a WRITING page for each and hands the run to the
 * workers, one job per server (a multi-get each, in parallel), and the
 * client's reply is deferred (tier.c parks the client; the loop serves
 * everyone else). A worker checks every item it gets (format, MAC,
 * namespace, key, parent, tokens: kvd_rval_check) and copies a good
 * payload into its page; on the main thread the page is published
 * (READY, indexed) and the statuses go back in the FETCH reply. An item
 * that fails a check is dropped and counted, never served.
 *
 * Faults. Every libmemcached operation runs under remote-timeout-ms
 * (connect, poll, send, receive). A server that fails an operation
 * (refused, reset, timed out) is marked down: its keys are misses and
 * its puts are skipped, with no further wait, until the once-a-second
 * probe (a get of a key nobody stores, on a handle of its own) finds it answering again.
 * A fetch whose reply is not complete by its deadline (twice the timeout,
 * plus its bytes at 100 MB/s) is answered with what has arrived; later
 * items still land in the pool for the next lookup. When no server
 * answers at all, one log line says so, lookups stop offering tier 2 and
 * the daemon serves from its own tiers until the probe finds one again.
 *
 * Threads. Workers take jobs from a mutex-protected queue (fetches
 * first, then the probe, then puts) and give them back through a done
 * list and an eventfd the main loop polls; each has its own memcached_st
 * (a clone) and MAC context. Only the main thread writes the segment and
 * the page table; a worker writes only the pages of its own fetch job
 * (WRITING, owned by the tier) and reads only pages held for its puts.
 */
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

/* A worker's outcome for a put or a fetch item. */
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
	uint8_t res;		/* worker: RES_* */
	uint8_t fail;		/* worker: enum kvd_rval_fail for RES_BAD */
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
	uint32_t page, gen;	/* held page, when the worker copies it */
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

static struct kvshm_stats *st_of(struct kvd_ground *g)
{
	return kvshm_stats(g->h);
}

/* ------------------------------------------------------------ workers */

/*
 * Before an operation on server s: if the probe found it back since this
 * worker last looked, drop our connection to it (one to the old process
 * would fail the first write).
 */
static void server_fresh(struct rworker *w, uint32_t s)
{
	unsigned e = atomic_load(&w->r->srv[s].epoch);

	if (w->seen[s] == e)
		return;
	w->seen[s] = e;
	kvd_mconn_close(&w->conn[s]);
}

/* A connection's failure: RES_TIMEOUT or RES_DOWN, the server marked
 * down (its keys are misses and its puts skipped until the probe finds
 * it answering). */
static uint8_t conn_failed(struct kvd_remote *r, uint32_t s, int rc)
{
	atomic_store(&r->srv[s].up, 0);
	return rc == -ETIMEDOUT ? RES_TIMEOUT : RES_DOWN;
}

/*
 * A put: the item goes out in pieces where they lie, sealed in place. A
 * held page's payload is sent from the pool (the evictor passes it by
 * until the put is done): header and tokens from the worker's buffer,
 * the payload from its page, the tag; nothing copied. An evicted page's
 * item was copied into the job at eviction (the page is gone by now).
 */
static void run_put(struct rworker *w, struct rjob *j)
{
	struct kvd_remote *r = w->r;
	size_t off = kvd_rval_payload_off(r->bt);
	struct kvd_rpiece p[3];
	uint8_t *head = j->held ? w->head : j->val, tag[KVD_RVAL_MAC];
	int rc;

	if (!atomic_load(&r->srv[j->srv].up)) {
		j->res = RES_SKIP;
		return;
	}
	p[0] = (struct kvd_rpiece){ head, off };
	p[1] = (struct kvd_rpiece){ j->held ? (uint8_t *)r->g->pool->mem.base +
						      (uint64_t)j->page * r->slot_bytes
					    : j->val + off,
				    j->ns.page_bytes };
	p[2] = (struct kvd_rpiece){ tag, KVD_RVAL_MAC };
	kvd_rval_fill(head, &j->ns, j->key, j->parent, j->tokens, r->bt, j->ns.page_bytes);
	if (kvd_rval_seal_v(w->mac, p, 2, tag)) {
		j->res = RES_DOWN;
		return;
	}
	server_fresh(w, j->srv);
	rc = kvd_mconn_set(&w->conn[j->srv], &r->srv[j->srv].at, j->mkey, strlen(j->mkey), p, 3,
			   (int)(r->timeout_ns / 1000000));
	j->err = rc;
	if (!rc)
		j->res = RES_OK;
	else if (rc == -E2BIG)
		j->res = RES_TOOBIG;
	else if (rc == -ENOMEM)
		j->res = RES_DOWN;	/* the server's memory: a failed put */
	else
		j->res = conn_failed(r, j->srv, rc);
}

#define MGET 64		/* keys per multi-get */

/* One multi-get's items, as kvd_mconn_mget's callbacks see them. */
struct rget {
	struct rworker *w;
	struct rfetch *f;
	const uint32_t *idx;	/* items of f, by key of the request */
	uint8_t *head;		/* each item's header and tokens (payload_off each) */
	uint8_t (*tag)[KVD_RVAL_MAC];
	uint8_t *odd;		/* an item of another length, read whole */
	size_t odd_len;
};

/*
 * Where item i's bytes go: an item of its block's length lands in pieces,
 * its payload straight into the block's page (WRITING, the tier's: no
 * client sees it before it is checked and published), or its staging
 * copy on a cuda pool; it is checked there (got_item). One of another
 * length (another format version, damage) is read whole into a buffer
 * of its own, at most twice a block's, and refused by the same check.
 */
static int where_item(void *arg, uint32_t i, uint64_t bytes, struct kvd_rpiece *p)
{
	struct rget *rg = arg;
	struct kvd_remote *r = rg->w->r;
	struct ritem *it = &rg->f->it[rg->idx[i]];
	size_t off = kvd_rval_payload_off(r->bt), len = kvd_rval_bytes(r->bt, rg->f->ns.page_bytes);

	if (it->res != RES_MISS)
		return 0;
	if (bytes != len) {
		free(rg->odd);
		rg->odd = bytes <= 2 * len ? malloc(bytes ? bytes : 1) : NULL;
		rg->odd_len = bytes;
		if (!rg->odd)
			return 0;
		p[0] = (struct kvd_rpiece){ rg->odd, bytes };
		return 1;
	}
	if (r->cuda) {
		/* A whole slot: kvd_pool_copy_in copies slots. */
		it->stage = calloc(1, r->slot_bytes);
		if (!it->stage)
			return 0;
	}
	p[0] = (struct kvd_rpiece){ rg->head + (size_t)i * off, off };
	p[1] = (struct kvd_rpiece){ r->cuda ? it->stage
					    : (uint8_t *)r->g->pool->mem.base +
						      (uint64_t)it->page * r->slot_bytes,
				    rg->f->ns.page_bytes };
	p[2] = (struct kvd_rpiece){ rg->tag[i], KVD_RVAL_MAC };
	return 3;
}

/* Item i is in: checked where it lies (format, MAC, namespace, key,
 * parent, tokens); a payload that fails is never served (its page goes
 * back unpublished). */
static void got_item(void *arg, uint32_t i)
{
	struct rget *rg = arg;
	struct kvd_remote *r = rg->w->r;
	struct rfetch *f = rg->f;
	struct ritem *it = &f->it[rg->idx[i]];
	struct kvd_rval_want want = { &f->ns, it->key, it->parent, it->tokens, r->bt };
	size_t off = kvd_rval_payload_off(r->bt), len = kvd_rval_bytes(r->bt, f->ns.page_bytes);
	enum kvd_rval_fail fail;
	const char *why;
	int rc;

	if (rg->odd) {
		rc = kvd_rval_check(rg->w->mac, rg->odd, rg->odd_len, &want, &fail, &why);
		free(rg->odd);
		rg->odd = NULL;
	} else {
		rc = kvd_rval_check_v(rg->w->mac, rg->head + (size_t)i * off, off,
				      r->cuda ? it->stage
					      : (uint8_t *)r->g->pool->mem.base +
							(uint64_t)it->page * r->slot_bytes,
				      f->ns.page_bytes, rg->tag[i], len, &want, &fail, &why);
	}
	if (rc) {
		it->res = RES_BAD;
		it->fail = (uint8_t)fail;
		return;
	}
	it->res = RES_OK;
}

static void run_get(struct rworker *w, struct rjob *j)
{
	struct kvd_remote *r = w->r;
	struct rfetch *f = j->f;
	const char *keys[MGET];
	size_t lens[MGET], off = kvd_rval_payload_off(r->bt);
	char kbuf[MGET][KVD_RVAL_KEY_MAX];
	struct rget rg = { w, f, NULL, NULL, NULL, NULL, 0 };
	uint32_t i, first;
	int rc = 0;

	for (i = 0; i < j->n; i++)
		f->it[j->idx[i]].res = RES_MISS;
	if (!atomic_load(&r->srv[j->srv].up)) {
		for (i = 0; i < j->n; i++)
			f->it[j->idx[i]].res = RES_SKIP;
		return;
	}
	rg.head = malloc(MGET * off);
	rg.tag = malloc(MGET * sizeof(*rg.tag));
	if (!rg.head || !rg.tag) {
		free(rg.head);
		free(rg.tag);
		return;	/* misses */
	}
	server_fresh(w, j->srv);
	/* Multi-gets of up to MGET keys, all to this job's server. */
	for (first = 0; first < j->n && !rc; first += MGET) {
		uint32_t k = j->n - first < MGET ? j->n - first : MGET;

		for (i = 0; i < k; i++) {
			lens[i] = kvd_rval_key(kbuf[i], r->prefix, f->ns.id, f->it[j->idx[first + i]].key);
			keys[i] = kbuf[i];
		}
		rg.idx = j->idx + first;
		rc = kvd_mconn_mget(&w->conn[j->srv], &r->srv[j->srv].at, keys, lens, k, where_item,
				    got_item, &rg, (int)(r->timeout_ns / 1000000));
	}
	free(rg.odd);
	free(rg.head);
	free(rg.tag);
	if (rc) {
		/* What did not come is the server's fault, not a plain miss. */
		uint8_t res = conn_failed(r, j->srv, rc);

		for (i = 0; i < j->n; i++)
			if (f->it[j->idx[i]].res == RES_MISS)
				f->it[j->idx[i]].res = res;
	}
}

static void run_probe(struct kvd_remote *r)
{
	unsigned i;

	/* A get of a key nobody stores: "not found" is an answer. (Not
	 * memcached_version: it asks a server only until it knows its
	 * version, then answers from memory.) */
	for (i = 0; i < r->nsrv; i++) {
		memcached_return_t rc;
		uint32_t flags;
		size_t len;
		char *v = memcached_get(r->srv[i].probe, "kvcached-probe", 14, &len, &flags, &rc);
		int up = rc == MEMCACHED_SUCCESS || rc == MEMCACHED_NOTFOUND;

		free(v);
		if (up && !atomic_exchange(&r->srv[i].up, 1))
			atomic_fetch_add(&r->srv[i].epoch, 1);
		else if (!up)
			atomic_store(&r->srv[i].up, 0);
	}
}

static void *worker(void *arg)
{
	struct rworker *w = arg;
	struct kvd_remote *r = w->r;
	uint64_t one = 1;

	pthread_mutex_lock(&r->lock);
	for (;;) {
		struct rjob *j;

		while (!r->stop && !r->gets && !r->probe && !r->puts)
			pthread_cond_wait(&r->wake, &r->lock);
		if (r->stop)
			break;
		if (r->gets) {
			j = r->gets;
			r->gets = j->next;
			if (!r->gets)
				r->gets_tail = &r->gets;
		} else if (r->probe) {
			j = r->probe;
			r->probe = NULL;
		} else {
			j = r->puts;
			r->puts = j->next;
			if (!r->puts)
				r->puts_tail = &r->puts;
		}
		pthread_mutex_unlock(&r->lock);
		if (j->kind == RJ_PROBE) {
			run_probe(r);
		} else if (j->kind == RJ_PUT) {
			run_put(w, j);
		} else {
			run_get(w, j);
		}
		pthread_mutex_lock(&r->lock);
		j->next = r->done;
		r->done = j;
		if (write(r->efd, &one, sizeof(one)) != sizeof(one)) {
			/* Saturated counter: the loop will read it anyway. */
		}
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

static void enqueue(struct kvd_remote *r, struct rjob *j)
{
	pthread_mutex_lock(&r->lock);
	j->next = NULL;
	if (j->kind == RJ_GET) {
		*r->gets_tail = j;
		r->gets_tail = &j->next;
	} else {
		*r->puts_tail = j;
		r->puts_tail = &j->next;
	}
	pthread_cond_signal(&r->wake);
	pthread_mutex_unlock(&r->lock);
}

/* ------------------------------------------------------------ main thread */

static uint32_t server_of(struct kvd_remote *r, const char *mkey)
{
	uint32_t s = memcached_generate_hash(r->mc, mkey, strlen(mkey));

	return s < r->nsrv ? s : 0;
}

static unsigned servers_up(const struct kvd_remote *r)
{
	unsigned i, n = 0;

	for (i = 0; i < r->nsrv; i++)
		n += atomic_load(&r->srv[i].up) != 0;
	return n;
}

static void put_done(struct kvd_ground *g, struct rjob *j)
{
	struct kvd_remote *r = remote_of(g);
	struct kvshm_stats *st = st_of(g);

	if (j->held)
		r->hold[j->page]--;
	r->puts_out--;
	switch (j->res) {
	case RES_OK:
		kvd_stat_add(&st->remote_puts, 1);
		kvd_stat_add(&st->remote_put_bytes, (int64_t)j->len);
		/* On the servers now (for the events: medium REMOTE; a parent
		 * this host does not index is taken as the chain's root). */
		kvd_events_stored(g, j->ns_id, KVD_MEDIUM_REMOTE, j->key, j->parent,
				  kvshm_index_find(g->h, j->parent) == UINT32_MAX, j->tokens);
		break;
	case RES_SKIP:
		kvd_stat_add(&st->remote_put_skipped, 1);
		break;
	case RES_TOOBIG:
		kvd_stat_add(&st->remote_put_errors, 1);
		if (!r->said_toobig) {
			r->said_toobig = true;
			kvd_err("remote: server %s refuses items of %zu bytes: start memcached with -I above that (e.g. -I %lluk); such blocks are not shared",
				r->srv[j->srv].name, j->len,
				(unsigned long long)((j->len + 1023) / 1024 * 2));
		}
		break;
	case RES_TIMEOUT:
		kvd_stat_add(&st->remote_timeouts, 1);
		/* fall through */
	default:
		kvd_stat_add(&st->remote_put_errors, 1);
		kvd_debug("remote: put to %s failed: %s", r->srv[j->srv].name,
			  j->err == -ENOMEM ? "the server is out of memory" : strerror(-j->err));
		break;
	}
	free(j->tokens);
	free(j->val);
	free(j);
}

/* The page of a fetched item becomes READY and indexed. Returns 0 or -errno. */
static int place(struct kvd_ground *g, struct rfetch *f, struct ritem *it)
{
	struct kvd_remote *r = remote_of(g);
	struct kvshm_stats *st = st_of(g);
	uint32_t w, wg;
	int rc;

	if (r->cuda && kvd_pool_copy_in(g->pool, it->page, 1, it->stage)) {
		kvshm_page_free(g->h, it->page, it->gen, OWNER_REMOTE);
		return -EIO;
	}
	/* A spilled copy of the same block gives way (it cannot be: the
	 * index did not know the key when it was claimed, but a restore may
	 * have raced us since). */
	kvd_tiers_unindex(g, it->key, it->parent, it->tokens, f->ns_id);
	rc = kvshm_page_publish(g->h, it->page, it->gen, OWNER_REMOTE, it->key, it->parent,
				it->tokens, &w, &wg);
	kvd_events_published(g, it->page, rc);	/* in this host's pool now */
	/* Counted as the tier's hits, not as client publishes. */
	if (rc == KVSHM_PUBLISHED) {
		g->host->ready(g, it->page);
		kvd_stat_add(&st->publishes, -1);
		r->clean[it->page] = it->gen + 1;
		return 0;
	}
	if (rc == KVSHM_PUBLISH_DUP) {
		kvd_stat_add(&st->publish_dups, -1);
		return 0;	/* the same block is READY already */
	}
	if (rc == -EEXIST || rc == -ENOSPC)
		kvd_stat_add(&st->publish_refused, -1);
	return rc < 0 ? rc : -EIO;
}

static const char *const fail_text[] = {
	[KVD_RVAL_OK] = "ok",
	[KVD_RVAL_FORMAT] = "not a block of this geometry",
	[KVD_RVAL_BADMAC] = "MAC does not check (damaged, or sealed under another secret)",
	[KVD_RVAL_IDENTITY] = "another namespace, key or parent",
	[KVD_RVAL_TOKENS] = "other tokens under the same key",
	[KVD_RVAL_VERSION_OTHER] = "item of another format version",
};

static void fetch_finish(struct kvd_ground *g, struct rfetch *f)
{
	struct kvd_remote *r = remote_of(g);
	struct rfetch **pp;

	for (pp = &r->inflight; *pp; pp = &(*pp)->next)
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	if (f->bytes) {
		uint64_t dt = kvd_now_ns() - f->t0, bps, old;

		bps = dt ? (uint64_t)((double)f->bytes * 1e9 / (double)dt) : 0;
		old = atomic_load_explicit(&st_of(g)->remote_fetch_bps, memory_order_relaxed);
		atomic_store_explicit(&st_of(g)->remote_fetch_bps, old ? (old * 3 + bps) / 4 : bps,
				      memory_order_relaxed);
	}
	if (f->rq)
		kvd_tiers_fetch_done(g, f->rq);
	free(f);
}

/* Settle item it of f: its page placed or given back, counted. */
static void item_settle(struct kvd_ground *g, struct rfetch *f, struct ritem *it)
{
	struct kvshm_stats *st = st_of(g);
	int32_t status = -ENOENT;

	switch (it->res) {
	case RES_OK:
		if (!place(g, f, it)) {
			status = 0;
			kvd_stat_add(&st->remote_hits, 1);
			kvd_stat_add(&st->remote_fetch_bytes,
				     (int64_t)kvd_rval_bytes(remote_of(g)->bt, f->ns.page_bytes));
			f->bytes += kvd_rval_bytes(remote_of(g)->bt, f->ns.page_bytes);
		} else {
			kvd_stat_add(&st->remote_misses, 1);
		}
		break;
	case RES_BAD:
		if (it->fail == KVD_RVAL_VERSION_OTHER) {
			/* Written by another release (a fleet mid-upgrade): a
			 * plain miss, counted, not a warning per block; the
			 * next put of the block replaces it. */
			kvshm_page_free(g->h, it->page, it->gen, OWNER_REMOTE);
			kvd_stat_add(&st->remote_stale, 1);
			kvd_stat_add(&st->remote_misses, 1);
			break;
		}
		kvshm_page_free(g->h, it->page, it->gen, OWNER_REMOTE);
		kvd_stat_add(&st->remote_dropped, 1);
		if (kvd_log_allow(&remote_of(g)->drop_log, kvd_now_ns() / 1000000))
			kvd_warn("remote: block %016llx%016llx dropped: %s; served as a miss",
				 (unsigned long long)it->key.hi, (unsigned long long)it->key.lo,
				 fail_text[it->fail < KVD_RVAL_NFAIL ? it->fail : 0]);
		status = -EBADMSG;
		break;
	case RES_TIMEOUT:
		kvshm_page_free(g->h, it->page, it->gen, OWNER_REMOTE);
		kvd_stat_add(&st->remote_timeouts, 1);
		kvd_stat_add(&st->remote_misses, 1);
		status = -ETIMEDOUT;
		break;
	default:
		kvshm_page_free(g->h, it->page, it->gen, OWNER_REMOTE);
		kvd_stat_add(&st->remote_misses, 1);
		break;
	}
	free(it->stage);
	it->stage = NULL;
	if (f->rq)
		*it->status = status;
}

static void get_done(struct kvd_ground *g, struct rjob *j)
{
	struct rfetch *f = j->f;
	uint32_t i;

	for (i = 0; i < j->n; i++)
		item_settle(g, f, &f->it[j->idx[i]]);
	free(j);
	if (!--f->left)
		fetch_finish(g, f);
}

static void remote_reap(struct kvd_ground *g)
{
	struct kvd_remote *r = remote_of(g);
	struct rjob *j, *next;
	uint64_t x;

	if (read(r->efd, &x, sizeof(x)) < 0 && errno != EAGAIN)
		kvd_debug("remote: eventfd: %s", strerror(errno));
	pthread_mutex_lock(&r->lock);
	j = r->done;
	r->done = NULL;
	pthread_mutex_unlock(&r->lock);
	for (; j; j = next) {
		next = j->next;
		if (j->kind == RJ_PUT) {
			put_done(g, j);
		} else if (j->kind == RJ_GET) {
			get_done(g, j);
		} else {
			r->probing = false;
			free(j);
		}
	}
}

/* Stats: servers up; a log line when that changed. */
static void log_servers(struct kvd_ground *g)
{
	struct kvd_remote *r = remote_of(g);
	int now[KVD_REMOTE_MAX_SERVERS];
	unsigned i, up = 0;

	/* One snapshot: the probe may be changing them meanwhile. */
	for (i = 0; i < r->nsrv; i++)
		up += now[i] = atomic_load(&r->srv[i].up) != 0;
	atomic_store_explicit(&st_of(g)->remote_servers_up, up, memory_order_relaxed);
	if (up == 0 && r->up_logged != 0) {
		kvd_warn("remote: none of the %u memcached servers answers; serving from this host's tiers only, trying them again every second",
			 r->nsrv);
	} else if (up != 0) {
		for (i = 0; i < r->nsrv; i++) {
			if (now[i] == r->srv[i].logged)
				continue;
			if (now[i])
				kvd_info("remote: server %s answers (%u of %u up)", r->srv[i].name, up,
					 r->nsrv);
			else
				kvd_warn("remote: server %s does not answer: its blocks are misses until it does (%u of %u up)",
					 r->srv[i].name, up, r->nsrv);
		}
	}
	for (i = 0; i < r->nsrv; i++)
		r->srv[i].logged = now[i];
	r->up_logged = up;
}

/* Ask every server whether it answers (a worker does it). */
static void probe_start(struct kvd_remote *r, uint64_t now)
{
	struct rjob *j = calloc(1, sizeof(*j));

	if (!j)
		return;	/* the next tick tries again */
	j->kind = RJ_PROBE;
	r->probing = true;
	r->next_probe = now + PROBE_NS;
	pthread_mutex_lock(&r->lock);
	r->probe = j;
	pthread_cond_signal(&r->wake);
	pthread_mutex_unlock(&r->lock);
}

static void remote_tick(struct kvd_ground *g)
{
	struct kvd_remote *r = remote_of(g);
	uint64_t now = kvd_now_ns();
	struct rfetch *f;

	if (!r->probing && now >= r->next_probe)
		probe_start(r, now);
	kvd_log_more(&r->drop_log, now / 1000000);
	/* Fetches past their deadline are answered with what has come. */
	for (f = r->inflight; f; f = f->next) {
		if (!f->rq || now < f->deadline)
			continue;
		kvd_debug("remote: a fetch of %u blocks is past its deadline; answered without the rest",
			  f->n);
		kvd_tiers_fetch_done(g, f->rq);
		f->rq = NULL;
	}
}


static bool remote_busy(const struct kvd_ground *g, uint32_t page)
{
	return remote_of(g)->hold[page] != 0;
}

static bool remote_put(struct kvd_ground *g, uint32_t page, enum kvd_tier_put why)
{
	struct kvd_remote *r = remote_of(g);
	const struct kvshm_page *p = &kvshm_pages(g->h)[page];
	uint32_t gen = atomic_load_explicit(&p->gen, memory_order_relaxed);
	const struct kvshm_ns *ns = &kvshm_ns(g->h)[p->ns_id];
	struct kvshm_stats *st = st_of(g);
	struct rjob *j;
	size_t off = kvd_rval_payload_off(r->bt);

	if ((why == KVD_PUT_PUBLISH) != (r->mode == KVD_REMOTE_PUBLISH))
		return false;
	if (why == KVD_PUT_EVICT && r->clean[page] == gen + 1)
		return false;	/* it came from here, unchanged */
	/* A page the index no longer names (its block dropped: punched out
	 * by a client, say) is not the block any more. */
	if (kvshm_index_find(g->h, p->key) != page)
		return false;
	if (r->puts_out >= r->puts_cap || !servers_up(r)) {
		kvd_stat_add(&st->remote_put_skipped, 1);
		return false;
	}
	j = calloc(1, sizeof(*j) + 0);
	if (!j)
		return false;
	j->kind = RJ_PUT;
	j->page = page;
	j->gen = gen;
	j->ns_id = p->ns_id;
	memcpy(&j->ns, ns, sizeof(j->ns));
	j->key = p->key;
	j->parent = p->parent;
	j->len = kvd_rval_bytes(r->bt, ns->page_bytes);
	j->tokens = malloc((size_t)r->bt * sizeof(uint32_t));
	/* A published page is copied by its worker; an evicted one (or one
	 * in GPU memory) here, now. */
	j->held = why == KVD_PUT_PUBLISH && !r->cuda;
	j->val = j->held ? NULL : malloc(j->len);
	kvd_rval_key(j->mkey, r->prefix, ns->id, p->key);
	j->srv = server_of(r, j->mkey);
	if (!j->tokens || (!j->held && !j->val) || !atomic_load(&r->srv[j->srv].up)) {
		kvd_stat_add(&st->remote_put_skipped, 1);
		free(j->tokens);
		free(j->val);
		free(j);
		return false;
	}
	memcpy(j->tokens, kvshm_tokens(g->h, page), (size_t)r->bt * sizeof(uint32_t));
	if (j->held) {
		/* The evictor passes it by until its worker has copied it. */
		r->hold[page]++;
	} else if (r->cuda) {
		uint8_t *tmp = malloc(r->slot_bytes);

		if (!tmp || kvd_pool_copy_out(g->pool, page, 1, tmp)) {
			free(tmp);
			free(j->tokens);
			free(j->val);
			free(j);
			kvd_stat_add(&st->remote_put_skipped, 1);
			return false;
		}
		memcpy(j->val + off, tmp, ns->page_bytes);
		free(tmp);
	} else {
		memcpy(j->val + off, (const uint8_t *)g->pool->mem.base + (uint64_t)page * r->slot_bytes,
		       ns->page_bytes);
	}
	r->puts_out++;
	enqueue(r, j);
	return false;	/* never takes the page: the next tier may */
}

static int remote_claim(struct kvd_ground *g, uint32_t ns_id, uint32_t loc, bool full,
			struct kvd_fetch *f)
{
	(void)ns_id;
	/* Blocks the index does not know, of a FETCH (which has tokens),
	 * while some server answers. */
	if (loc != UINT32_MAX || !f->tokens || !servers_up(remote_of(g)))
		return 0;
	if (full) {
		kvd_stat_add(&st_of(g)->remote_misses, 1);
		return -ENOSPC;
	}
	return 1;
}

static int remote_fetch(struct kvd_ground *g, uint32_t ns_id, uint32_t tenant,
			struct kvd_fetch *fe, uint32_t n, struct kvd_restore *rq)
{
	struct kvd_remote *r = remote_of(g);
	struct kvshm_stats *st = st_of(g);
	struct rfetch *f;
	uint32_t *tok, i, s, *nper, njobs = 0;
	struct rjob **jobs;
	char mkey[KVD_RVAL_KEY_MAX];

	f = calloc(1, sizeof(*f) + n * sizeof(struct ritem) + (size_t)n * r->bt * sizeof(uint32_t));
	nper = calloc(r->nsrv, sizeof(*nper));
	jobs = calloc(r->nsrv, sizeof(*jobs));
	if (!f || !nper || !jobs) {
		free(f);
		free(nper);
		free(jobs);
		for (i = 0; i < n; i++)
			*fe[i].status = -ENOMEM;
		return 0;
	}
	tok = (uint32_t *)(void *)&f->it[n];
	f->rq = rq;
	f->ns_id = ns_id;
	memcpy(&f->ns, &kvshm_ns(g->h)[ns_id], sizeof(f->ns));
	f->n = n;
	f->t0 = kvd_now_ns();
	kvd_stat_add(&st->remote_fetches, n);
	for (i = 0; i < n; i++) {
		struct ritem *it = &f->it[i];

		it->key = fe[i].key;
		it->parent = fe[i].parent;
		it->status = fe[i].status;
		it->tokens = tok + (size_t)i * r->bt;
		memcpy(it->tokens, fe[i].tokens, (size_t)r->bt * sizeof(uint32_t));
		kvd_rval_key(mkey, r->prefix, f->ns.id, it->key);
		it->srv = server_of(r, mkey);
		it->res = RES_SKIP;
		if (!atomic_load(&r->srv[it->srv].up)) {
			kvd_stat_add(&st->remote_misses, 1);
			continue;	/* -ENOENT: its server is down */
		}
		if (kvshm_page_alloc(g->h, OWNER_REMOTE, ns_id, &it->page, &it->gen)) {
			*it->status = -ENOSPC;
			kvd_stat_add(&st->remote_misses, 1);
			continue;
		}
		/* The client's key space, so its tenant's. */
		kvshm_page_set_tenant(g->h, it->page, tenant);
		/* A page for the daemon, not handed to a client. */
		kvd_stat_add(&st->allocs, -1);
		*it->status = -ETIMEDOUT;	/* until it is settled */
		it->res = RES_MISS;
		nper[it->srv]++;
	}
	/* One job per server: a multi-get each, in parallel. */
	for (s = 0; s < r->nsrv; s++) {
		if (!nper[s])
			continue;
		jobs[s] = calloc(1, sizeof(struct rjob) + nper[s] * sizeof(uint32_t));
		if (!jobs[s]) {
			for (i = 0; i < n; i++)
				if (f->it[i].res == RES_MISS && f->it[i].srv == s) {
					kvshm_page_free(g->h, f->it[i].page, f->it[i].gen, OWNER_REMOTE);
					f->it[i].res = RES_SKIP;
					*f->it[i].status = -ENOMEM;
				}
			continue;
		}
		jobs[s]->kind = RJ_GET;
		jobs[s]->srv = s;
		jobs[s]->f = f;
		njobs++;
	}
	for (i = 0; i < n; i++)
		if (f->it[i].res == RES_MISS)
			jobs[f->it[i].srv]->idx[jobs[f->it[i].srv]->n++] = i;
	free(nper);
	if (!njobs) {
		free(jobs);
		free(f);
		return 0;
	}
	f->left = njobs;
	f->deadline = f->t0 + 2 * r->timeout_ns +
		      (uint64_t)((double)n * (double)f->ns.page_bytes / DEADLINE_BPS * 1e9);
	f->next = r->inflight;
	r->inflight = f;
	for (s = 0; s < r->nsrv; s++)
		if (jobs[s])
			enqueue(r, jobs[s]);
	free(jobs);
	return 1;
}

static void remote_forget_ns(struct kvd_ground *g, uint32_t ns_id)
{
	struct kvd_remote *r = remote_of(g);
	struct rjob **pp, *j, *drop = NULL;

	/* Queued puts of the namespace go (their pages must be evictable);
	 * running ones finish. */
	pthread_mutex_lock(&r->lock);
	for (pp = &r->puts; (j = *pp);) {
		if (j->kind == RJ_PUT && j->ns_id == ns_id) {
			*pp = j->next;
			j->next = drop;
			drop = j;
		} else {
			pp = &j->next;
		}
	}
	r->puts_tail = &r->puts;
	while (*r->puts_tail)
		r->puts_tail = &(*r->puts_tail)->next;
	pthread_mutex_unlock(&r->lock);
	for (; drop; drop = j) {
		j = drop->next;
		drop->res = RES_SKIP;
		put_done(g, drop);
	}
}

static int remote_fd(const struct kvd_ground *g)
{
	return remote_of(g)->efd;
}

static void remote_close(struct kvd_ground *g);

static const struct kvd_tier remote_tier = {
	.name = "remote",
	.fd = remote_fd,
	.reap = remote_reap,
	.tick = remote_tick,
	.put = remote_put,
	.busy = remote_busy,
	.claim = remote_claim,
	.fetch = remote_fetch,
	.forget_ns = remote_forget_ns,
	.stats = log_servers,
	.close = remote_close,
};

static void remote_close(struct kvd_ground *g)
{
	struct kvd_remote *r = remote_of(g);
	struct rjob *j, *next;
	unsigned i, k;

	if (!r)
		return;
	/* No lookup offers tier 2 from now on (a reload may close the tier
	 * while the daemon goes on). */
	atomic_store_explicit(&st_of(g)->remote_servers_up, 0, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->remote_servers, 0, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->remote_write_mode, KVSHM_REMOTE_OFF, memory_order_relaxed);
	pthread_mutex_lock(&r->lock);
	r->stop = true;
	pthread_cond_broadcast(&r->wake);
	pthread_mutex_unlock(&r->lock);
	for (i = 0; i < WORKERS; i++)
		if (r->w[i].started)
			pthread_join(r->w[i].th, NULL);
	/* What finished is settled; what never ran is given back. */
	remote_reap(g);
	for (j = r->gets; j; j = next) {
		next = j->next;
		for (i = 0; i < j->n; i++)
			j->f->it[j->idx[i]].res = RES_SKIP;
		get_done(g, j);
	}
	for (j = r->puts; j; j = next) {
		next = j->next;
		j->res = RES_SKIP;
		put_done(g, j);
	}
	free(r->probe);
	for (i = 0; i < WORKERS; i++) {
		for (k = 0; k < KVD_REMOTE_MAX_SERVERS; k++)
			kvd_mconn_close(&r->w[i].conn[k]);
		kvd_rmac_free(r->w[i].mac);
		free(r->w[i].head);
	}
	for (i = 0; i < r->nsrv; i++)
		if (r->srv[i].probe)
			memcached_free(r->srv[i].probe);
	if (r->mc)
		memcached_free(r->mc);
	kvd_rmac_free(r->mac);
	if (r->efd >= 0)
		close(r->efd);
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->wake);
	free(r->hold);
	free(r->clean);
	free(r);
	kvd_tier_remove(g, KVD_TIER_REMOTE);
}

/* ------------------------------------------------------------ open */

/* The cluster secret: a file only its owner may read. */
static int read_secret(const char *path, uint8_t *buf, size_t *len)
{
	struct stat sb;
	ssize_t got;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0) {
		kvd_err("remote-secret-file %s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		kvd_err("remote-secret-file %s: not a regular file", path);
		close(fd);
		return -1;
	}
	if (sb.st_mode & 077) {
		kvd_err("remote-secret-file %s: mode %04o lets other users at it; chmod 600 it",
			path, (unsigned)(sb.st_mode & 07777));
		close(fd);
		return -1;
	}
	got = read(fd, buf, SECRET_MAX + 1);
	close(fd);
	if (got < SECRET_MIN || got > SECRET_MAX) {
		kvd_err("remote-secret-file %s: %zd bytes; a secret has %d to %d (e.g. head -c 32 /dev/urandom)",
			path, got, SECRET_MIN, SECRET_MAX);
		return -1;
	}
	*len = (size_t)got;
	return 0;
}

/* A libmemcached handle with our behaviours: ketama, a timeout on every
 * operation, and no server ejected (its keys stay its own). */
static memcached_st *mc_new(struct kvd_remote *r, const struct kvd_rserver *one, uint32_t tmo_ms)
{
	memcached_st *m = memcached_create(NULL);
	unsigned i;
	memcached_return_t rc = MEMCACHED_SUCCESS;

	if (!m)
		return NULL;
	for (i = 0; i < (one ? 1 : r->nsrv) && memcached_success(rc); i++) {
		const struct kvd_rserver *s = one ? one : &r->srv[i].at;

		rc = s->port ? memcached_server_add(m, s->host, s->port)
			     : memcached_server_add_unix_socket(m, s->host);
	}
	if (!memcached_success(rc) ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_DISTRIBUTION,
				   MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_NO_BLOCK, 1) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, tmo_ms) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, tmo_ms) != MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_SND_TIMEOUT, (uint64_t)tmo_ms * 1000) !=
		    MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_RCV_TIMEOUT, (uint64_t)tmo_ms * 1000) !=
		    MEMCACHED_SUCCESS ||
	    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 1) != MEMCACHED_SUCCESS) {
		memcached_free(m);
		return NULL;
	}
	return m;
}

int kvd_remote_open(struct kvd_ground *g)
{
	static const char *const modes[] = { "published", "evicted" };
	struct kvd_rserver sv[KVD_REMOTE_MAX_SERVERS];
	uint8_t secret[SECRET_MAX + 1];
	size_t slen = 0;
	const char *why = NULL;
	struct kvd_remote *r;
	sigset_t all, old;
	unsigned i, k, n;
	uint32_t pages = g->h->geo.n_pages;

	if (!g->cfg->remote[0])
		return 0;
	if (kvd_remote_parse(g->cfg->remote, sv, KVD_REMOTE_MAX_SERVERS, &n, &why)) {
		kvd_err("remote %s: %s", g->cfg->remote, why);
		return -1;
	}
	if (g->cfg->remote_secret_file[0]) {
		if (read_secret(g->cfg->remote_secret_file, secret, &slen))
			return -1;
	} else if (g->cfg->remote_insecure) {
		kvd_warn("remote: no secret (remote-insecure): blocks are checked for damage only; any host that reaches the servers can forge KV for this fleet");
	} else {
		kvd_err("remote: needs remote-secret-file, or remote-insecure");
		return -1;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		goto nomem;
	r->efd = -1;
	for (i = 0; i < WORKERS; i++)
		for (k = 0; k < KVD_REMOTE_MAX_SERVERS; k++)
			kvd_mconn_init(&r->w[i].conn[k]);
	r->drop_log.what = "remote: dropped blocks";
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->wake, NULL);
	r->gets_tail = &r->gets;
	r->puts_tail = &r->puts;
	/* Registered at once: a failed open is undone by kvd_tiers_close. */
	kvd_tier_add(g, KVD_TIER_REMOTE, &remote_tier, r);
	r->g = g;
	r->nsrv = n;
	r->bt = g->h->geo.block_tokens;
	r->slot_bytes = g->h->geo.page_bytes;
	r->timeout_ns = (uint64_t)g->cfg->remote_timeout_ms * 1000000ull;
	r->cuda = g->h->pool_kind != KVSHM_POOL_HOST;
	r->mode = g->cfg->remote_write;
	snprintf(r->prefix, sizeof(r->prefix), "%s", g->cfg->remote_prefix);
	/* Held pages (publish) or copies (evict) in flight: a quarter of
	 * the pool at most, and 256 MiB of copies. */
	r->puts_cap = pages / 4 < 16 ? 16 : pages / 4 > 4096 ? 4096 : pages / 4;
	if (r->mode == KVD_REMOTE_EVICT && r->puts_cap > (256u << 20) / r->slot_bytes)
		r->puts_cap = (uint32_t)((256u << 20) / r->slot_bytes) ?: 8;
	r->hold = calloc(pages, sizeof(*r->hold));
	r->clean = calloc(pages, sizeof(*r->clean));
	r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!r->hold || !r->clean || r->efd < 0)
		goto nomem;
	for (i = 0; i < n; i++) {
		r->srv[i].at = sv[i];
		if (sv[i].port)
			snprintf(r->srv[i].name, sizeof(r->srv[i].name), strchr(sv[i].host, ':') ?
				 "[%.255s]:%u" : "%.255s:%u", sv[i].host, sv[i].port);
		else
			snprintf(r->srv[i].name, sizeof(r->srv[i].name), "%.255s", sv[i].host);
		r->srv[i].logged = 0;
	}
	r->mc = mc_new(r, NULL, g->cfg->remote_timeout_ms);
	if (!r->mc || kvd_rmac_new(&r->mac, secret, slen)) {
		kvd_err("remote: cannot set up libmemcached or the MAC");
		goto fail;
	}
	for (i = 0; i < n; i++) {
		r->srv[i].probe = mc_new(r, &sv[i], g->cfg->remote_timeout_ms);
		if (!r->srv[i].probe) {
			kvd_err("remote: cannot set up libmemcached for %s", r->srv[i].name);
			goto fail;
		}
	}
	for (i = 0; i < WORKERS; i++) {
		r->w[i].r = r;
		r->w[i].head = malloc(kvd_rval_payload_off(r->bt));
		if (!r->w[i].head || kvd_rmac_dup(&r->w[i].mac, r->mac))
			goto nomem;
	}
	memset(secret, 0, sizeof(secret));
	/* Signals are the main loop's (signalfd): workers take none. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (i = 0; i < WORKERS; i++)
		r->w[i].started = !pthread_create(&r->w[i].th, NULL, worker, &r->w[i]);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	for (i = 0; i < WORKERS; i++)
		if (!r->w[i].started) {
			kvd_err("remote: cannot start worker threads");
			goto fail;
		}
	atomic_store_explicit(&st_of(g)->remote_servers, n, memory_order_relaxed);
	atomic_store_explicit(&st_of(g)->remote_write_mode,
			      r->mode == KVD_REMOTE_PUBLISH ? KVSHM_REMOTE_PUBLISH : KVSHM_REMOTE_EVICT,
			      memory_order_relaxed);
	r->up_logged = 0;
	probe_start(r, kvd_now_ns());
	kvd_info("remote: %u memcached servers (ketama), blocks written when %s, %u ms timeout, %s (Poly1305 of %s), item keys %s:*",
		 n, modes[r->mode], g->cfg->remote_timeout_ms,
		 slen ? "sealed (item format 2) under the cluster secret" : "NOT authenticated",
		 kvd_rmac_impl(r->mac), r->prefix);
	return 0;
nomem:
	kvd_err("remote: out of memory");
fail:
	memset(secret, 0, sizeof(secret));
	return -1;
}
