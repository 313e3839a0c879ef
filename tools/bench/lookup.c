// SPDX-License-Identifier: MIT
/*
 * lookup.c - kvbench's lookup mode: verified prefix lookups of 1, 4, 16,
 * 64 and 256 blocks of 16 tokens (16..4096 tokens), in 1 and 2 client
 * processes, and their latency, each against its peers in the same run.
 *
 * Kinds of work, each a "kind" that gets its own slices:
 *
 *   K_LOOKUP       kvc_lookup() alone, on requests prepared beforehand
 *                  (kvc_req_new and kvc_req_free untimed): index probe,
 *                  parent-key and token verification, pin.
 *   K_HASH         kvc_req_new + kvc_lookup + kvc_req_free: what a serving
 *                  process pays per prompt (XXH3 key chain, token copy,
 *                  lookup, unpin; no system call on either end).
 *   K_PEER_LOOKUP  an in-process open-addressing hash table holding the
 *                  same keys, with the same per-block check (stored parent
 *                  key equals the previous block's key, 16 stored tokens
 *                  equal), reading each call's keys and tokens from its own
 *                  copy of them, made just before the timed batch, as
 *                  K_LOOKUP reads each request's (before that, the peer
 *                  read one copy, hot in L1, while kvcached read a batch
 *                  of requests as big as 400 KB). K_PEER_HASH: the same after kvc_keys() (the same
 *                  XXH3 chain into a caller buffer).
 *   K_FLOOR        floor.h's floor_lookup on requests prepared as for
 *                  K_LOOKUP: the same hits by one straight function doing
 *                  only what a verified, pinned, recorded lookup must.
 *                  Rows: lookup against it, and it against the table.
 *   K_REDIS_GET    kvc_keys, then one GET per block (one round trip each,
 *                  hiredis), walking the prefix until the first miss.
 *   K_REDIS_MGET   kvc_keys, then one MGET of every block key (one round
 *                  trip).
 *   K_MC_GET       kvc_keys, then one memcached get per block
 *                  (libmemcached, a round trip each).
 *   K_MC_MGET      kvc_keys, then one multi-get of every key
 *                  (memcached_mget + memcached_fetch_result).
 *
 * The servers hold, for each block, the value (parent key, 16 tokens)
 * under the block key in hex, and the benchmark checks every returned
 * value as kvcached checks its pages' identity: parent equals the previous
 * block's key and the tokens equal the query's. A lookup counts only when
 * it verified the whole prefix; any miss fails the run.
 *
 * Rows: every kind's rate in verified blocks/s, the median over ROUNDS
 * rounds of per-slice rates, summed over the client processes (each its
 * own kvc_t, its own table, its own server connections). Latency rows:
 * one clock pair per call, nearest-rank percentiles, 1 process.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libmemcached/memcached.h>

#include "bench.h"
#include "floor.h"
#include "table.h"

#define PIN_BUDGET	4096	/* pins one lookup batch may hold at once */
#define MAX_BATCH	256	/* requests per lookup batch */
#define LAT_BLOCKS	256	/* prefix of the lookup vs hash table latency */
#define LAT_CAP		(1u << 20)	/* samples kept per kind */

static const size_t lookup_sizes[] = { 1, 4, 16, 64, 256 };
static const size_t quick_sizes[] = { 1, 16, 256 };
static char lookup_name[64];

/* What the servers store per block: the identity kvcached checks. */
struct lk_val {
	struct kvc_key parent;
	uint32_t tokens[BT];
};

/* ------------------------------------------------------ lookup workers */

enum {
	K_LOOKUP, K_PEER_LOOKUP, K_HASH, K_PEER_HASH, K_FLOOR,
	K_REDIS_GET, K_REDIS_MGET, K_MC_GET, K_MC_MGET, K_N
};

static const char *const kind_peer[K_N] = {
	[K_PEER_LOOKUP] = "hashtable", [K_PEER_HASH] = "hashtable", [K_FLOOR] = "floor",
	[K_REDIS_GET] = "redis-get", [K_REDIS_MGET] = "redis-mget",
	[K_MC_GET] = "memcached-get", [K_MC_MGET] = "memcached-mget",
};

struct session {
	const char *sock;
	size_t blocks;		/* prefix length */
	bool latency;		/* one clock pair per call, samples kept */
	int nkinds;
	int kinds[K_N];		/* in slice order */
	uint64_t slice_ns;
	int nproc;		/* set by run_session */
	uint32_t *bar;		/* slices ended, over all workers (shared) */
};

struct wres {
	uint64_t ops[ROUNDS][K_N];
	uint64_t ns[ROUNDS][K_N];
	uint32_t lat[K_N][4];	/* p50 p90 p99 p999 */
	uint64_t nlat[K_N];
};

static uint64_t prefix_seed(size_t blocks)
{
	return 1000 + blocks;
}

static void bad_hit(kvc_t *c, const char *who, long got, size_t want)
{
	struct kvc_stats st;

	if (kvc_stats(c, &st))
		memset(&st, 0, sizeof(st));
	die("%s of a published %zu-block prefix hit %ld blocks (pin failures %llu, pins held %llu); another client evicting, or pin slots (max-pins) too few?",
	    who, want, got, (unsigned long long)st.pin_failures,
	    (unsigned long long)st.pins_held);
}

struct wstate {
	kvc_t *c;
	struct peer peer;
	redisContext *rc;
	memcached_st *mc;
	memcached_result_st mres;
	size_t n, ntok, batch;
	uint32_t *tokens, *pages;
	struct kvc_key *keys, *kbuf;
	struct kvc_key *qkeys;	/* the peer's batch of query copies */
	uint32_t *qtok;
	char *hex;		/* n x HEXKEY */
	const char **argv;	/* MGET argv, 1 + n */
	size_t *argl;
	struct kvc_req **reqs;
	int *hits;
	uint32_t *lat[K_N];
	size_t nlat[K_N];
};

static bool val_ok(const char *v, size_t len, struct kvc_key parent, const uint32_t *tokens)
{
	const struct lk_val *x = (const void *)v;

	return v && len == sizeof(*x) && x->parent.lo == parent.lo &&
	       x->parent.hi == parent.hi && !memcmp(x->tokens, tokens, sizeof(x->tokens));
}

/* The block keys of the prefix (XXH3 chain, as kvc_req_new computes it),
 * in hex: what a client of a key-value server must do first. */
static void hex_keys(struct wstate *w)
{
	size_t i;

	if ((size_t)ck(kvc_keys(w->c, w->tokens, w->ntok, NULL, 0, w->kbuf, w->n),
		       "kvc_keys") != w->n)
		die("kvc_keys: wrong block count");
	for (i = 0; i < w->n; i++)
		key_hex(w->hex + i * HEXKEY, w->kbuf[i]);
}

/* Verified prefix through one server request kind; returns blocks. */
static size_t server_lookup(struct wstate *w, int k)
{
	struct kvc_key parent = { 0, 0 };
	memcached_return_t mrc;
	redisReply *rep;
	size_t i = 0, n = w->n;

	hex_keys(w);
	switch (k) {
	case K_REDIS_GET:
		for (i = 0; i < n; i++) {
			const char *argv[2] = { "GET", w->hex + i * HEXKEY };
			size_t len[2] = { 3, HEXKEY };
			bool ok;

			rep = redisCommandArgv(w->rc, 2, argv, len);
			if (!rep)
				die("redis GET: %s", w->rc->errstr);
			ok = rep->type == REDIS_REPLY_STRING &&
			     val_ok(rep->str, rep->len, parent, w->tokens + i * BT);
			freeReplyObject(rep);
			if (!ok)
				break;
			parent = w->kbuf[i];
		}
		break;
	case K_REDIS_MGET:
		rep = redisCommandArgv(w->rc, (int)n + 1, w->argv, w->argl);
		if (!rep)
			die("redis MGET: %s", w->rc->errstr);
		if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n)
			die("redis MGET: unexpected reply type %d", rep->type);
		for (i = 0; i < n; i++) {
			redisReply *e = rep->element[i];

			if (e->type != REDIS_REPLY_STRING ||
			    !val_ok(e->str, e->len, parent, w->tokens + i * BT))
				break;
			parent = w->kbuf[i];
		}
		freeReplyObject(rep);
		break;
	case K_MC_GET:
		for (i = 0; i < n; i++) {
			size_t len = 0;
			uint32_t flags;
			char *v = memcached_get(w->mc, w->hex + i * HEXKEY, HEXKEY, &len, &flags,
						&mrc);
			bool ok = v && val_ok(v, len, parent, w->tokens + i * BT);

			free(v);
			if (!ok) {
				if (mrc != MEMCACHED_SUCCESS && mrc != MEMCACHED_NOTFOUND)
					die("memcached get: %s", memcached_strerror(w->mc, mrc));
				break;
			}
			parent = w->kbuf[i];
		}
		break;
	case K_MC_MGET: {
		bool broken = false;

		mrc = memcached_mget(w->mc, w->argv + 1, w->argl + 1, n);
		if (mrc != MEMCACHED_SUCCESS)
			die("memcached mget: %s", memcached_strerror(w->mc, mrc));
		/* One server answers in request order, leaving out misses. */
		while (memcached_fetch_result(w->mc, &w->mres, &mrc)) {
			if (broken || i >= n ||
			    memcached_result_key_length(&w->mres) != HEXKEY ||
			    memcmp(memcached_result_key_value(&w->mres), w->hex + i * HEXKEY,
				   HEXKEY) ||
			    !val_ok(memcached_result_value(&w->mres),
				    memcached_result_length(&w->mres), parent, w->tokens + i * BT)) {
				broken = true;
				continue;
			}
			parent = w->kbuf[i++];
		}
		if (mrc != MEMCACHED_END && mrc != MEMCACHED_SUCCESS && mrc != MEMCACHED_NOTFOUND)
			die("memcached mget: %s", memcached_strerror(w->mc, mrc));
		break;
	}
	default:
		die("internal: server kind %d", k);
	}
	return i;
}

static void lat_add(struct wstate *w, int k, uint64_t t)
{
	if (w->nlat[k] < LAT_CAP)
		w->lat[k][w->nlat[k]++] = (uint32_t)(t > UINT32_MAX ? UINT32_MAX : t);
}

/* One call of kind k (not K_LOOKUP); returns the verified blocks. */
static size_t one_call(struct wstate *w, int k)
{
	struct kvc_req *r;
	size_t n = w->n;
	int h;

	switch (k) {
	case K_PEER_LOOKUP:
		return peer_lookup(&w->peer, w->keys, w->tokens, n, w->pages);
	case K_HASH:
		ck(kvc_req_new(w->c, w->tokens, w->ntok, NULL, 0, &r), "kvc_req_new");
		h = kvc_lookup(r);
		kvc_req_free(r);
		if (h < 0 || (size_t)h != n) {
			ck(h, "kvc_lookup");
			bad_hit(w->c, "kvc_lookup", h, n);
		}
		return (size_t)h;
	case K_PEER_HASH:
		h = ck(kvc_keys(w->c, w->tokens, w->ntok, NULL, 0, w->kbuf, n), "kvc_keys");
		if ((size_t)h != n)
			return 0;
		return peer_lookup(&w->peer, w->kbuf, w->tokens, n, w->pages);
	default:
		return server_lookup(w, k);
	}
}

/* One batch of kind k; returns timed ns, adds verified blocks to *ops. */
static uint64_t run_batch(struct wstate *w, const struct session *s, int k, uint64_t *ops)
{
	size_t b, n = w->n, B = k >= K_REDIS_GET ? 1 : w->batch, got;
	uint64_t t0, t1, acc = 0;

	if (k == K_LOOKUP || k == K_FLOOR) {
		int (*look)(struct kvc_req *) = k == K_LOOKUP ? kvc_lookup : floor_lookup;

		for (b = 0; b < B; b++)
			ck(kvc_req_new(w->c, w->tokens, w->ntok, NULL, 0, &w->reqs[b]),
			   "kvc_req_new");
		if (s->latency) {
			for (b = 0; b < B; b++) {
				t0 = now_ns();
				w->hits[b] = look(w->reqs[b]);
				t1 = now_ns() - t0;
				acc += t1;
				lat_add(w, k, t1);
			}
		} else {
			t0 = now_ns();
			for (b = 0; b < B; b++)
				w->hits[b] = look(w->reqs[b]);
			acc = now_ns() - t0;
		}
		for (b = 0; b < B; b++) {
			ck(w->hits[b], "kvc_lookup");
			if ((size_t)w->hits[b] != n)
				bad_hit(w->c, "kvc_lookup", w->hits[b], n);
			kvc_req_free(w->reqs[b]);
			w->reqs[b] = NULL;
		}
	} else if (s->latency) {
		for (b = 0; b < B; b++) {
			t0 = now_ns();
			got = one_call(w, k);
			t1 = now_ns() - t0;
			acc += t1;
			lat_add(w, k, t1);
			if (got != n)
				die("%s lookup of a stored %zu-block prefix verified %zu blocks",
				    kind_peer[k], n, got);
		}
	} else if (k == K_PEER_LOOKUP && !s->latency) {
		/* The peer reads its queries from B copies, as kvc_lookup
		 * reads B requests (each its own key chain and token copy,
		 * written just before by kvc_req_new): the same amount of
		 * query memory at the same temperature on both sides. */
		for (b = 0; b < B; b++) {
			memcpy(w->qkeys + b * n, w->keys, n * sizeof(*w->keys));
			memcpy(w->qtok + b * n * BT, w->tokens, n * BT * sizeof(uint32_t));
		}
		got = n;
		t0 = now_ns();
		for (b = 0; b < B && got == n; b++)
			got = peer_lookup(&w->peer, w->qkeys + b * n, w->qtok + b * n * BT, n,
					  w->pages);
		acc = now_ns() - t0;
		if (got != n)
			die("%s lookup of a stored %zu-block prefix verified %zu blocks",
			    kind_peer[k], n, got);
	} else {
		got = n;
		t0 = now_ns();
		for (b = 0; b < B && got == n; b++)
			got = one_call(w, k);
		acc = now_ns() - t0;
		if (got != n)
			die("%s lookup of a stored %zu-block prefix verified %zu blocks",
			    kind_peer[k], n, got);
	}
	sink += w->pages[n - 1];
	*ops += (uint64_t)B * n;
	return acc;
}

/*
 * Wait until every worker has ended slice idx. A slice ends at the first
 * call that finishes after its deadline, and one call of a server kind
 * can take milliseconds (256 GETs in a row): without this, that call
 * would run on into the other worker's next slice, another kind's, and
 * take CPU from it on a 2-CPU machine.
 */
static void slice_barrier(const struct session *s, uint32_t idx)
{
	uint64_t t0;

	if (s->nproc < 2)
		return;
	__atomic_add_fetch(s->bar, 1, __ATOMIC_ACQ_REL);
	t0 = now_ns();
	while (__atomic_load_n(s->bar, __ATOMIC_ACQUIRE) < (idx + 1) * (uint32_t)s->nproc) {
		/* A worker that died never arrives; no slice takes this long. */
		if (now_ns() - t0 > 60ull * 1000000000ull)
			die("lookup worker: the other worker stopped (slice %u)", idx);
		sched_yield();
	}
}

static int lookup_worker(const struct session *s, int up, int down)
{
	struct kvc_model m = tiny_model(lookup_name);
	struct wstate w;
	struct wres res;
	uint64_t t0, end;
	size_t i, j;
	char ready = 'r';
	int r, k, ki;

	memset(&w, 0, sizeof(w));
	memset(&res, 0, sizeof(res));
	w.c = open_model(s->sock, &m);
	w.n = s->blocks;
	w.ntok = w.n * BT;
	w.tokens = xmalloc(w.ntok * sizeof(uint32_t));
	w.keys = xmalloc(w.n * sizeof(*w.keys));
	w.kbuf = xmalloc(w.n * sizeof(*w.kbuf));
	w.pages = xmalloc(w.n * sizeof(uint32_t));
	w.hex = xmalloc(w.n * HEXKEY);
	w.argv = xmalloc((w.n + 1) * sizeof(*w.argv));
	w.argl = xmalloc((w.n + 1) * sizeof(*w.argl));
	w.argv[0] = "MGET";
	w.argl[0] = 4;
	for (i = 0; i < w.n; i++) {
		w.argv[i + 1] = w.hex + i * HEXKEY;
		w.argl[i + 1] = HEXKEY;
	}
	make_tokens(w.tokens, w.ntok, prefix_seed(w.n));
	if ((size_t)ck(kvc_keys(w.c, w.tokens, w.ntok, NULL, 0, w.keys, w.n), "kvc_keys") != w.n)
		die("kvc_keys: wrong block count");
	for (ki = 0; ki < s->nkinds; ki++) {
		k = s->kinds[ki];
		if ((k == K_REDIS_GET || k == K_REDIS_MGET) && !w.rc)
			w.rc = redis_connect();
		if ((k == K_MC_GET || k == K_MC_MGET) && !w.mc) {
			w.mc = mc_connect();
			if (!memcached_result_create(w.mc, &w.mres))
				die("memcached_result_create: out of memory");
		}
		if (s->latency)
			w.lat[k] = xmalloc(LAT_CAP * sizeof(uint32_t));
	}

	/* The peer table holds every published prefix, as the index does. */
	peer_init(&w.peer, 4096);
	for (i = 0, r = 0; i < NELEM(lookup_sizes); i++) {
		size_t n = lookup_sizes[i];
		uint32_t *t = xmalloc(n * BT * sizeof(uint32_t));
		struct kvc_key *kk = xmalloc(n * sizeof(*kk)), zero = { 0, 0 };

		make_tokens(t, n * BT, prefix_seed(n));
		ck(kvc_keys(w.c, t, n * BT, NULL, 0, kk, n), "kvc_keys");
		for (j = 0; j < n; j++)
			peer_insert(&w.peer, kk[j], j ? kk[j - 1] : zero, t + j * BT,
				    (uint32_t)r++);
		free(t);
		free(kk);
	}

	w.batch = PIN_BUDGET / w.n;
	if (w.batch > MAX_BATCH)
		w.batch = MAX_BATCH;
	if (!w.batch)
		w.batch = 1;
	w.reqs = xmalloc(w.batch * sizeof(*w.reqs));
	w.qkeys = xmalloc(w.batch * w.n * sizeof(*w.qkeys));
	w.qtok = xmalloc(w.batch * w.ntok * sizeof(uint32_t));
	w.hits = xmalloc(w.batch * sizeof(*w.hits));

	/* Ready; wait for the common start time. */
	if (write(up, &ready, 1) != 1 || read(down, &t0, sizeof(t0)) != sizeof(t0))
		die("worker: lost the parent");
	while (now_ns() < t0)
		;
	for (r = 0; r < ROUNDS; r++) {
		for (ki = 0; ki < s->nkinds; ki++) {
			k = s->kinds[ki];
			end = t0 + (uint64_t)(r * s->nkinds + ki + 1) * s->slice_ns;
			do {
				res.ns[r][k] += run_batch(&w, s, k, &res.ops[r][k]);
			} while (now_ns() < end);
			slice_barrier(s, (uint32_t)(r * s->nkinds + ki));
		}
	}
	if (s->latency) {
		for (ki = 0; ki < s->nkinds; ki++) {
			k = s->kinds[ki];
			qsort(w.lat[k], w.nlat[k], sizeof(uint32_t), cmp_u32);
			res.lat[k][0] = pctl(w.lat[k], w.nlat[k], 0.50);
			res.lat[k][1] = pctl(w.lat[k], w.nlat[k], 0.90);
			res.lat[k][2] = pctl(w.lat[k], w.nlat[k], 0.99);
			res.lat[k][3] = pctl(w.lat[k], w.nlat[k], 0.999);
			res.nlat[k] = w.nlat[k];
		}
	}
	if (write(up, &res, sizeof(res)) != (ssize_t)sizeof(res))
		die("worker: cannot report: %s", strerror(errno));
	if (w.rc)
		redisFree(w.rc);
	if (w.mc) {
		memcached_result_free(&w.mres);
		memcached_free(w.mc);
	}
	if (floor_fallbacks)
		fprintf(stderr, "kvbench: lookup floor: %llu requests of %zu blocks were not its case "
			"(a hit on one run of pages going up); kvc_lookup took them\n",
			(unsigned long long)floor_fallbacks, w.n);
	kvc_close(w.c);
	return 0;
}

static void reap(pid_t *pids, int n, const char *what)
{
	int i, st, bad = 0;

	for (i = 0; i < n; i++) {
		if (pids[i] <= 0)
			continue;
		if (waitpid(pids[i], &st, 0) != pids[i] || !WIFEXITED(st) || WEXITSTATUS(st))
			bad++;
		pids[i] = 0;
	}
	if (bad)
		die("%d %s worker process%s failed (see above)", bad, what, bad > 1 ? "es" : "");
}

/* Run session s in nproc forked workers; their results in res[]. */
static void run_session(const struct session *s0, int nproc, struct wres *res)
{
	struct session sess = *s0, *s = &sess;
	int up[2][2], down[2][2], i;
	pid_t pids[2] = { 0, 0 };
	uint64_t t0;
	char c;

	sess.nproc = nproc;
	sess.bar = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sess.bar == MAP_FAILED)
		die("mmap (slice barrier): %s", strerror(errno));
	*sess.bar = 0;

	for (i = 0; i < nproc; i++)
		if (pipe2(up[i], O_CLOEXEC) || pipe2(down[i], O_CLOEXEC))
			die("pipe: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	for (i = 0; i < nproc; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork: %s", strerror(errno));
		if (!pids[i]) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			close(up[i][0]);
			close(down[i][1]);
			_exit(lookup_worker(s, up[i][1], down[i][0]));
		}
		close(up[i][1]);
		close(down[i][0]);
	}
	for (i = 0; i < nproc; i++) {
		if (!read_full(up[i][0], &c, 1)) {
			for (int j = 0; j < nproc; j++)
				close(down[j][1]);
			reap(pids, nproc, "lookup");
			die("lookup worker ended before it was ready");
		}
	}
	t0 = now_ns() + 2000000;	/* 2 ms from now, for all */
	for (i = 0; i < nproc; i++)
		if (write(down[i][1], &t0, sizeof(t0)) != sizeof(t0))
			die("cannot start lookup worker: %s", strerror(errno));
	for (i = 0; i < nproc; i++) {
		bool ok = read_full(up[i][0], &res[i], sizeof(res[i]));

		close(up[i][0]);
		close(down[i][1]);
		if (!ok) {
			reap(pids, nproc, "lookup");
			die("lookup worker ended without a result");
		}
	}
	reap(pids, nproc, "lookup");
	munmap(sess.bar, 4096);
}

/* Median over rounds of the summed per-slice rate (per second). */
static double agg_rate(const struct wres *res, int nproc, int kind)
{
	double r[ROUNDS];
	int i, p;

	for (i = 0; i < ROUNDS; i++) {
		r[i] = 0;
		for (p = 0; p < nproc; p++)
			if (res[p].ns[i][kind])
				r[i] += (double)res[p].ops[i][kind] * 1e9 / (double)res[p].ns[i][kind];
	}
	return median(r, ROUNDS);
}

/* Publish every lookup prefix once, with a key-derived page pattern; check
 * each by a lookup and its page bytes. Store the same blocks' identities
 * in the servers that run. */
static void publish_prefixes(const char *sock)
{
	struct kvc_model m = tiny_model(lookup_name);
	kvc_t *c = open_model(sock, &m);
	size_t pb = kvc_page_bytes(c), i, j;
	redisContext *rc = srv_skip(SRV_REDIS) ? NULL : redis_connect();
	memcached_st *mc = srv_skip(SRV_MEMCACHED) ? NULL : mc_connect();
	struct kvc_stats st;
	size_t total = 0;

	for (i = 0; i < NELEM(lookup_sizes); i++)
		total += lookup_sizes[i];
	ck(kvc_stats(c, &st), "kvc_stats");
	if (st.pages_total < total + 64)
		die("the pool has %llu pages; the lookup prefixes need %zu and room to spare",
		    (unsigned long long)st.pages_total, total);
	for (i = 0; i < NELEM(lookup_sizes); i++) {
		size_t n = lookup_sizes[i];
		uint32_t *t = xmalloc(n * BT * sizeof(uint32_t));
		struct kvc_key *kk = xmalloc(n * sizeof(*kk));
		struct lk_val *vals = xmalloc(n * sizeof(*vals));
		char *hex = xmalloc(n * HEXKEY);
		const char **kp = xmalloc(n * sizeof(*kp));
		const void **vp = xmalloc(n * sizeof(*vp));
		size_t *kl = xmalloc(n * sizeof(*kl)), *vl = xmalloc(n * sizeof(*vl));
		struct kvc_req *r;
		int got;

		make_tokens(t, n * BT, prefix_seed(n));
		ck(kvc_keys(c, t, n * BT, NULL, 0, kk, n), "kvc_keys");
		ck(kvc_req_new(c, t, n * BT, NULL, 0, &r), "kvc_req_new");
		got = ck(kvc_lookup(r), "kvc_lookup");
		if (got)
			die("a fresh %zu-block prefix already hit %d blocks: namespace not private?",
			    n, got);
		got = ck(kvc_alloc(r), "kvc_alloc");
		if ((size_t)got != n)
			die("kvc_alloc granted %d of %zu pages", got, n);
		for (j = 0; j < n; j++) {
			void *p = kvc_block(r, j);

			if (!p)
				die("kvc_block(%zu) is NULL after kvc_alloc", j);
			fill_page(p, pb, kk[j]);
		}
		got = ck(kvc_publish(r), "kvc_publish");
		if ((size_t)got != n)
			die("kvc_publish cached %d of %zu blocks", got, n);
		kvc_req_free(r);

		ck(kvc_req_new(c, t, n * BT, NULL, 0, &r), "kvc_req_new");
		got = ck(kvc_lookup(r), "kvc_lookup");
		if ((size_t)got != n)
			die("lookup right after publish hit %d of %zu blocks", got, n);
		for (j = 0; j < n; j++)
			if (!check_page(kvc_block(r, j), pb, kk[j]))
				die("page of block %zu of the %zu-block prefix differs from what was published",
				    j, n);
		kvc_req_free(r);

		for (j = 0; j < n; j++) {
			if (j)
				vals[j].parent = kk[j - 1];
			memcpy(vals[j].tokens, t + j * BT, sizeof(vals[j].tokens));
			key_hex(hex + j * HEXKEY, kk[j]);
			kp[j] = hex + j * HEXKEY;
			kl[j] = HEXKEY;
			vp[j] = &vals[j];
			vl[j] = sizeof(vals[j]);
			if (mc)
				mc_set_one(mc, kp[j], HEXKEY, vp[j], vl[j]);
		}
		if (rc)
			redis_set_many(rc, kp, kl, vp, vl, n);
		free(t);
		free(kk);
		free(vals);
		free(hex);
		free(kp);
		free(vp);
		free(kl);
		free(vl);
	}
	if (rc)
		redisFree(rc);
	if (mc)
		memcached_free(mc);
	kvc_close(c);
}

/* The server kinds that run, in order; returns how many were added. */
static int add_server_kinds(struct session *s)
{
	int before = s->nkinds;

	if (!srv_skip(SRV_REDIS)) {
		s->kinds[s->nkinds++] = K_REDIS_GET;
		s->kinds[s->nkinds++] = K_REDIS_MGET;
	}
	if (!srv_skip(SRV_MEMCACHED)) {
		s->kinds[s->nkinds++] = K_MC_GET;
		s->kinds[s->nkinds++] = K_MC_MGET;
	}
	return s->nkinds - before;
}

static const char *kind_skip(int k)
{
	return srv_skip(k == K_REDIS_GET || k == K_REDIS_MGET ? SRV_REDIS : SRV_MEMCACHED);
}

/* A rate row of a session: kind k as op, against kind pk as its peer. */
static void kind_row(const struct wres *res, int np, size_t blocks, const char *op, int k, int pk)
{
	add_row(&(struct row){ "lookup", op, np, blocks, 4096, NULL, "blocks/s", kind_peer[pk],
			       agg_rate(res, np, k), agg_rate(res, np, pk), NULL });
}

static void bench_lookup(const char *sock, const size_t *sizes, size_t nsizes)
{
	static const int server_kinds[] = { K_REDIS_GET, K_REDIS_MGET, K_MC_GET, K_MC_MGET };
	struct session s = { .sock = sock };
	struct wres res[2];
	size_t i, j;
	int np;

	for (np = 1; np <= 2; np++) {
		for (i = 0; i < nsizes; i++) {
			s.blocks = sizes[i];
			s.nkinds = 0;
			s.kinds[s.nkinds++] = K_LOOKUP;
			s.kinds[s.nkinds++] = K_PEER_LOOKUP;
			s.kinds[s.nkinds++] = K_HASH;
			s.kinds[s.nkinds++] = K_PEER_HASH;
			s.kinds[s.nkinds++] = K_FLOOR;
			add_server_kinds(&s);
			/* Each row (kvcached + its peer) gets opt.seconds. */
			s.slice_ns = (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
			run_session(&s, np, res);
			kind_row(res, np, s.blocks, "lookup", K_LOOKUP, K_PEER_LOOKUP);
			kind_row(res, np, s.blocks, "hash_lookup", K_HASH, K_PEER_HASH);
			/* How far kvc_lookup is from its design's floor, and
			 * the floor from the table (floor.h). */
			kind_row(res, np, s.blocks, "lookup", K_LOOKUP, K_FLOOR);
			kind_row(res, np, s.blocks, "lookup_floor", K_FLOOR, K_PEER_LOOKUP);
			for (j = 0; j < NELEM(server_kinds); j++) {
				int k = server_kinds[j];

				add_row(&(struct row){ "lookup", "hash_lookup", np, s.blocks, 4096,
						       NULL, "blocks/s", kind_peer[k],
						       agg_rate(res, np, K_HASH),
						       kind_skip(k) ? 0 : agg_rate(res, np, k),
						       kind_skip(k) });
			}
		}
	}
}

/* Latency: per prefix size, hash_lookup vs every server kind (p50, p99);
 * for 256 blocks also kvc_lookup vs the hash table (p50 .. p999). */
static void bench_latency(const char *sock, const size_t *sizes, size_t nsizes)
{
	static const char *const names[4] = { "p50", "p90", "p99", "p999" };
	static const int server_kinds[] = { K_REDIS_GET, K_REDIS_MGET, K_MC_GET, K_MC_MGET };
	struct session s = { .sock = sock, .latency = true };
	struct wres res;
	size_t i, j;
	int p;

	for (i = 0; i < nsizes; i++) {
		s.blocks = sizes[i];
		s.nkinds = 0;
		if (s.blocks == LAT_BLOCKS) {
			s.kinds[s.nkinds++] = K_LOOKUP;
			s.kinds[s.nkinds++] = K_PEER_LOOKUP;
		}
		s.kinds[s.nkinds++] = K_HASH;
		add_server_kinds(&s);
		s.slice_ns = (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
		run_session(&s, 1, &res);
		if (!res.nlat[K_HASH])
			die("latency: no samples");
		if (s.blocks == LAT_BLOCKS)
			for (p = 0; p < 4; p++)
				add_row(&(struct row){ "lookup", "lookup", 1, LAT_BLOCKS, 4096,
						       names[p], "ns", "hashtable",
						       res.lat[K_LOOKUP][p],
						       res.lat[K_PEER_LOOKUP][p], NULL });
		for (j = 0; j < NELEM(server_kinds); j++) {
			int k = server_kinds[j];

			for (p = 0; p < 4; p += 2)	/* p50, p99 */
				add_row(&(struct row){ "lookup", "hash_lookup", 1, s.blocks, 4096,
						       names[p], "ns", kind_peer[k],
						       res.lat[K_HASH][p],
						       kind_skip(k) ? 0 : res.lat[k][p],
						       kind_skip(k) });
		}
	}
}

void mode_lookup(void)
{
	const size_t *sizes = opt.quick ? quick_sizes : lookup_sizes;
	size_t nsizes = opt.quick ? NELEM(quick_sizes) : NELEM(lookup_sizes);
	const char *sock;

	snprintf(lookup_name, sizeof(lookup_name), "kvbench-lookup-%d", (int)main_pid);
	servers_start();
	sock = opt.socket ? opt.socket : daemon_start("lookup", "4K", "4M");
	publish_prefixes(sock);
	bench_lookup(sock, sizes, nsizes);
	bench_latency(sock, sizes, nsizes);
	if (opt.socket) {
		struct kvc_model m = tiny_model(lookup_name);

		bench_drop_model(sock, &m);
	} else {
		daemon_stop(false);
	}
}
