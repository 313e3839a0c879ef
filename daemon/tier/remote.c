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
#include "remote_int.h"

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
int kvd_remote_place(struct kvd_ground *g, struct rfetch *f, struct ritem *it)
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
		if (!kvd_remote_place(g, f, it)) {
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

/* Ask every server whether it answers (a kvd_remote_worker does it). */
void kvd_remote_probe_start(struct kvd_remote *r, uint64_t now)
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
		kvd_remote_probe_start(r, now);
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
	/* A published page is copied by its kvd_remote_worker; an evicted one (or one
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
		/* The evictor passes it by until its kvd_remote_worker has copied it. */
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
	kvd_remote_enqueue(r, j);
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
			kvd_remote_enqueue(r, jobs[s]);
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

const struct kvd_tier kvd_remote_tier = {
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
