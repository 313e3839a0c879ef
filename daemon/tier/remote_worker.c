// SPDX-License-Identifier: MIT
/*
 * remote_worker.c - the remote tier's worker threads: each takes jobs
 * off the queue (a put, a multi-get, a probe) and runs them with its own
 * connection to each server, then hands them back to the main thread
 * through the eventfd. A worker writes only the pages of its own fetch
 * job and reads only pages held for its puts; never the segment.
 */
#include "remote_int.h"

/*
 * Before an operation on server s: if the probe found it back since this
 * kvd_remote_worker last looked, drop our connection to it (one to the old process
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
 * A put: the item goes out in pieces where they lie, sealed in kvd_remote_place. A
 * held page's payload is sent from the pool (the evictor passes it by
 * until the put is done): header and tokens from the kvd_remote_worker's buffer,
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

void *kvd_remote_worker(void *arg)
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

void kvd_remote_enqueue(struct kvd_remote *r, struct rjob *j)
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
