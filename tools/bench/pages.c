// SPDX-License-Identifier: MIT
/*
 * pages.c - kvbench's pages mode: moving page bytes, in GB/s (1e9 bytes of
 * page per second), for pages of 64 KiB .. 2 MiB (the Llama-3-8B geometry
 * with 1 .. 32 layers), kvcached against memcpy, Redis and memcached of
 * the same bytes, all in one process and in alternating slices.
 *
 * Every operation moves one request of REQ_BYTES (16 MiB: 256 pages of
 * 64 KiB .. 8 pages of 2 MiB), the way an engine publishes and reads a
 * prompt's blocks together:
 *
 *   put   kvcached: kvc_req_new of a fresh prompt, kvc_lookup (a miss),
 *         kvc_alloc (one round trip), memcpy of one source page into each
 *         granted pool page, kvc_publish (one round trip), kvc_req_free.
 *         Redis: one pipelined batch of SETs of the same bytes (hiredis);
 *         memcached: memcached_set of each page (libmemcached, a round
 *         trip each); memcpy: the same page copied into a ring of 128 MiB
 *         (memfd, MAP_SHARED, pre-faulted), larger than the LLC.
 *   get   kvcached: kvc_req_new + kvc_lookup of a stored prompt, each hit
 *         page memcpy'd into one caller buffer of a page, kvc_req_free.
 *         Redis: one pipelined batch of GETs; memcached: one multi-get;
 *         memcpy: the same pages' bytes from a ring of the working set's
 *         size into the same kind of caller buffer.
 *   pin   kvcached's zero-copy hit: kvc_req_new + kvc_lookup (every page
 *         pinned, its pointer ready) + kvc_req_free. No peer: none of them
 *         reads a page in place (with Redis or memcached the bytes have
 *         to come over the socket), and setting a zero-copy figure
 *         against a copy's says nothing; get is the comparison.
 *
 * Every get and pin checks the first and last word of each page (the
 * pattern derived from the block key) and the lengths; put is checked by
 * a lookup and full compare afterwards. The working set of the gets
 * (WS_BYTES, 64 MiB, above the 32 MiB LLC of the development machine) is
 * stored in all three before timing, and held pinned in kvcached so that
 * the puts, which evict, cannot take it away. The pool is written once
 * through before timing (first-touch faults are not counted).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libmemcached/memcached.h>

#include "bench.h"

#define REQ_BYTES	(16ull << 20)
#define WS_BYTES	(64ull << 20)
#define RING_BYTES	(128ull << 20)

static const uint32_t page_layers[] = { 1, 2, 4, 8, 16, 32 };	/* x 64 KiB */
static const uint32_t quick_layers[] = { 1, 32 };

enum {
	P_PUT, P_GET, P_PIN, P_MEMCPY_PUT, P_MEMCPY_GET,
	P_REDIS_SET, P_REDIS_GET, P_MC_SET, P_MC_GET, P_N
};

struct pages {
	struct pubctx pub;	/* put: c, pb, fresh prompts, source page */
	kvc_t *c;
	size_t pb, n;		/* page bytes, pages per request */
	size_t ws_reqs;		/* stored requests of the working set */
	uint32_t *ws_tokens;	/* ws_reqs x n x BT */
	struct kvc_key *ws_keys;	/* ws_reqs x n */
	char *ws_hex;		/* ws_reqs x n x HEXKEY */
	struct kvc_req **keep;	/* pins holding the working set */
	uint8_t *ring, *buf, *src;
	size_t ring_pages, rpos, gpos, spos;
	redisContext *rc;
	memcached_st *mc;
	memcached_result_st mres;
	char (*put_keys)[16];	/* peers' put keys, ws_reqs x n */
};

static bool words_ok(const uint8_t *page, size_t pb, struct kvc_key k)
{
	uint64_t first, last;

	memcpy(&first, page, 8);
	memcpy(&last, page + pb - 8, 8);
	return first == page_word(k, 0) && last == page_word(k, pb / 8 - 1);
}

static void op_get(struct pages *g, bool copy)
{
	size_t q = g->gpos++ % g->ws_reqs, j;
	struct kvc_req *r;
	int h;

	ck(kvc_req_new(g->c, g->ws_tokens + q * g->n * BT, g->n * BT, NULL, 0, &r),
	   "kvc_req_new");
	h = ck(kvc_lookup(r), "kvc_lookup");
	if ((size_t)h != g->n)
		die("pages: a stored %zu-page request hit %d pages", g->n, h);
	for (j = 0; j < g->n; j++) {
		const uint8_t *p = kvc_block(r, j);
		struct kvc_key k = g->ws_keys[q * g->n + j];

		if (copy) {
			memcpy(g->buf, p, g->pb);
			p = g->buf;
		}
		/* The pin reads one word of the page (and the last): what
		 * touching it in place costs, not a copy. */
		if (!words_ok(p, g->pb, k))
			die("pages: page %zu of a stored request holds the wrong bytes", j);
	}
	kvc_req_free(r);
}

static void op_redis(struct pages *g, bool set)
{
	size_t q = (set ? g->spos++ : g->gpos++) % g->ws_reqs, j;

	for (j = 0; j < g->n; j++) {
		const char *argv[3];
		size_t len[3];

		if (set) {
			argv[0] = "SET", len[0] = 3;
			argv[1] = g->put_keys[q * g->n + j], len[1] = strlen(argv[1]);
			argv[2] = (const char *)g->src, len[2] = g->pb;
		} else {
			argv[0] = "GET", len[0] = 3;
			argv[1] = g->ws_hex + (q * g->n + j) * HEXKEY, len[1] = HEXKEY;
		}
		if (redisAppendCommandArgv(g->rc, set ? 3 : 2, argv, len) != REDIS_OK)
			die("redis %s: %s", argv[0], g->rc->errstr);
	}
	for (j = 0; j < g->n; j++) {
		redisReply *rep;
		bool ok;

		if (redisGetReply(g->rc, (void **)&rep) != REDIS_OK)
			die("redis %s reply: %s", set ? "SET" : "GET", g->rc->errstr);
		if (set)
			ok = rep->type == REDIS_REPLY_STATUS;
		else
			ok = rep->type == REDIS_REPLY_STRING && rep->len == g->pb &&
			     words_ok((const uint8_t *)rep->str, g->pb, g->ws_keys[q * g->n + j]);
		freeReplyObject(rep);
		if (!ok)
			die("pages: redis %s of a %zu-byte page: wrong reply", set ? "SET" : "GET",
			    g->pb);
	}
}

static void op_mc(struct pages *g, bool set)
{
	size_t q = (set ? g->spos++ : g->gpos++) % g->ws_reqs, j;
	const char *keys[4096];
	size_t lens[4096];
	memcached_return_t rc;

	if (set) {
		for (j = 0; j < g->n; j++)
			mc_set_one(g->mc, g->put_keys[q * g->n + j],
				   strlen(g->put_keys[q * g->n + j]), g->src, g->pb);
		return;
	}
	for (j = 0; j < g->n; j++) {
		keys[j] = g->ws_hex + (q * g->n + j) * HEXKEY;
		lens[j] = HEXKEY;
	}
	rc = memcached_mget(g->mc, keys, lens, g->n);
	if (rc != MEMCACHED_SUCCESS)
		die("memcached mget: %s", memcached_strerror(g->mc, rc));
	j = 0;
	while (memcached_fetch_result(g->mc, &g->mres, &rc)) {
		if (j >= g->n || memcached_result_length(&g->mres) != g->pb ||
		    memcached_result_key_length(&g->mres) != HEXKEY ||
		    memcmp(memcached_result_key_value(&g->mres), keys[j], HEXKEY) ||
		    !words_ok((const uint8_t *)memcached_result_value(&g->mres), g->pb,
			      g->ws_keys[q * g->n + j]))
			die("pages: memcached get of a %zu-byte page: wrong or missing value "
			    "(item %zu)", g->pb, j);
		j++;
	}
	if (j != g->n)
		die("pages: memcached multi-get returned %zu of %zu pages (%s)", j, g->n,
		    memcached_strerror(g->mc, rc));
}

/* One operation of kind k: one request's worth of pages. */
static void run_op(struct pages *g, int k)
{
	size_t j;

	switch (k) {
	case P_PUT:
		pub_request(&g->pub, g->n);
		break;
	case P_GET:
		op_get(g, true);
		break;
	case P_PIN:
		op_get(g, false);
		break;
	case P_MEMCPY_PUT:
		for (j = 0; j < g->n; j++)
			memcpy(g->ring + (g->rpos++ % g->ring_pages) * g->pb, g->src, g->pb);
		break;
	case P_MEMCPY_GET:
		/* From the working set's worth of the ring, like the gets. */
		for (j = 0; j < g->n; j++)
			memcpy(g->buf, g->ring + (g->rpos++ % (g->ws_reqs * g->n)) * g->pb, g->pb);
		sink += g->buf[0];
		break;
	case P_REDIS_SET:
		op_redis(g, true);
		break;
	case P_REDIS_GET:
		op_redis(g, false);
		break;
	case P_MC_SET:
		op_mc(g, true);
		break;
	case P_MC_GET:
		op_mc(g, false);
		break;
	}
}

/* Store the working set in kvcached (pinned) and in the servers. */
static void ws_store(struct pages *g)
{
	size_t q, j, i;
	uint8_t *page = xmalloc(g->pb);

	for (q = 0; q < g->ws_reqs; q++) {
		uint32_t *t = g->ws_tokens + q * g->n * BT;
		struct kvc_key *kk = g->ws_keys + q * g->n;
		struct kvc_req *r;
		int got;

		make_tokens(t, g->n * BT, (2ull << 40) + g->pb * 1000 + q);
		ck(kvc_keys(g->c, t, g->n * BT, NULL, 0, kk, g->n), "kvc_keys");
		ck(kvc_req_new(g->c, t, g->n * BT, NULL, 0, &r), "kvc_req_new");
		if (ck(kvc_lookup(r), "kvc_lookup"))
			die("pages: a fresh prompt hit: namespace not private?");
		if ((size_t)ck(kvc_alloc(r), "kvc_alloc") != g->n)
			die("pages: kvc_alloc granted fewer than %zu pages", g->n);
		for (j = 0; j < g->n; j++)
			fill_page(kvc_block(r, j), g->pb, kk[j]);
		got = ck(kvc_publish(r), "kvc_publish");
		if ((size_t)got != g->n)
			die("pages: kvc_publish cached %d of %zu pages", got, g->n);
		kvc_req_free(r);
		/* Hold it: a request that hit keeps its pages pinned. */
		ck(kvc_req_new(g->c, t, g->n * BT, NULL, 0, &g->keep[q]), "kvc_req_new");
		if ((size_t)ck(kvc_lookup(g->keep[q]), "kvc_lookup") != g->n)
			die("pages: a request just published does not hit");
		for (j = 0; j < g->n; j++) {
			if (!check_page(kvc_block(g->keep[q], j), g->pb, kk[j]))
				die("pages: published page %zu differs from what was written", j);
			key_hex(g->ws_hex + (q * g->n + j) * HEXKEY, kk[j]);
			snprintf(g->put_keys[q * g->n + j], sizeof(g->put_keys[0]), "put:%zu",
				 q * g->n + j);
		}
		for (j = 0; j < g->n; j++) {
			const char *key = g->ws_hex + (q * g->n + j) * HEXKEY;
			size_t kl = HEXKEY, vl = g->pb;
			const void *v = page;

			fill_page(page, g->pb, kk[j]);
			if (g->rc)
				redis_set_many(g->rc, &key, &kl, &v, &vl, 1);
			if (g->mc)
				mc_set_one(g->mc, key, kl, page, vl);
		}
		/* The memcpy peer's working set holds bytes as well. */
		for (j = 0; j < g->n; j++) {
			i = (q * g->n + j) % g->ring_pages;
			fill_page(g->ring + i * g->pb, g->pb, kk[j]);
		}
	}
	free(page);
}

static void row3(const char *op, const struct pages *g, const char *peer, double kv,
		 double pr, const char *skipped)
{
	add_row(&(struct row){ "pages", op, 1, g->n, g->pb, NULL, "GB/s", peer, kv,
			       skipped ? 0 : pr, skipped });
}

static void bench_size(const char *sock, uint32_t layers, const char *name)
{
	struct kvc_model m = big_model(name, layers);
	const char *rskip = srv_skip(SRV_REDIS), *mskip = srv_skip(SRV_MEMCACHED);
	double rate[P_N][ROUNDS], med[P_N];
	uint64_t bytes[ROUNDS][P_N], ns[ROUNDS][P_N], t0, end, t;
	int kinds[P_N], nk = 0, r, ki, k, fd;
	struct kvc_stats st;
	struct pages g;
	char err[256] = "";
	size_t q;
	void *mem;
	int rc;

	memset(&g, 0, sizeof(g));
	/* A serving engine that publishes continuously opens with alloc-ahead:
	 * one round trip per put instead of two (kvclient.h). */
	rc = try_open_flags(sock, &m, KVC_OPEN_ALLOC_AHEAD, &g.c, err, sizeof(err));
	if (rc == -EMEDIUMTYPE && opt.socket) {
		fprintf(stderr, "kvbench: pages: skipping %u KiB pages: %s\n", layers * 64, err);
		return;
	}
	if (rc)
		die("kvc_open(%s) on %s failed: %s%s%s%s", name, sock, kvc_strerror(rc),
		    *err ? " (" : "", err, *err ? ")" : "");
	g.pb = kvc_page_bytes(g.c);
	g.n = REQ_BYTES / g.pb;
	g.ws_reqs = WS_BYTES / REQ_BYTES;
	ck(kvc_stats(g.c, &st), "kvc_stats");
	if (st.pages_total < (g.ws_reqs + 4) * g.n) {
		if (!opt.socket)
			die("pages: the pool has %llu pages; %zu needed",
			    (unsigned long long)st.pages_total, (g.ws_reqs + 4) * g.n);
		fprintf(stderr, "kvbench: pages: skipping %zu KiB pages: the pool has %llu pages, %zu needed\n",
			g.pb >> 10, (unsigned long long)st.pages_total, (g.ws_reqs + 4) * g.n);
		kvc_close(g.c);
		return;
	}

	g.pub.c = g.c;
	g.pub.pb = g.pb;
	g.pub.tokens = xmalloc(g.n * BT * sizeof(uint32_t));
	if (posix_memalign(&mem, 4096, g.pb))
		die("out of memory (source page)");
	g.src = mem;
	for (q = 0; q < g.pb / 8; q++)
		((uint64_t *)g.src)[q] = mix64(q);
	g.pub.src = g.src;
	if (posix_memalign(&mem, 4096, g.pb))
		die("out of memory (caller buffer)");
	g.buf = mem;
	memset(g.buf, 0, g.pb);
	g.ring_pages = RING_BYTES / g.pb;
	fd = memfd_create("kvbench-pages", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)RING_BYTES))
		die("memcpy ring memfd: %s", strerror(errno));
	g.ring = mmap(NULL, RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (g.ring == MAP_FAILED)
		die("mmap memcpy ring: %s", strerror(errno));
	close(fd);
	memset(g.ring, 1, RING_BYTES);	/* fault it in, as the pool will be */

	g.ws_tokens = xmalloc(g.ws_reqs * g.n * BT * sizeof(uint32_t));
	g.ws_keys = xmalloc(g.ws_reqs * g.n * sizeof(*g.ws_keys));
	g.ws_hex = xmalloc(g.ws_reqs * g.n * HEXKEY);
	g.keep = xmalloc(g.ws_reqs * sizeof(*g.keep));
	g.put_keys = xmalloc(g.ws_reqs * g.n * sizeof(*g.put_keys));
	if (!rskip) {
		g.rc = redis_connect();
		redis_flushall(g.rc);
	}
	if (!mskip) {
		g.mc = mc_connect();
		mc_flushall(g.mc);
		if (!memcached_result_create(g.mc, &g.mres))
			die("memcached_result_create: out of memory");
	}

	pub_warm(&g.pub, g.n);
	ws_store(&g);

	kinds[nk++] = P_PUT;
	kinds[nk++] = P_MEMCPY_PUT;
	kinds[nk++] = P_GET;
	kinds[nk++] = P_PIN;
	kinds[nk++] = P_MEMCPY_GET;
	if (!rskip) {
		kinds[nk++] = P_REDIS_SET;
		kinds[nk++] = P_REDIS_GET;
	}
	if (!mskip) {
		kinds[nk++] = P_MC_SET;
		kinds[nk++] = P_MC_GET;
	}
	memset(bytes, 0, sizeof(bytes));
	memset(ns, 0, sizeof(ns));
	t0 = now_ns();
	for (r = 0; r < ROUNDS; r++) {
		for (ki = 0; ki < nk; ki++) {
			k = kinds[ki];
			end = t0 + (uint64_t)(r * nk + ki + 1) *
				   (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
			do {
				t = now_ns();
				run_op(&g, k);
				ns[r][k] += now_ns() - t;
				bytes[r][k] += g.n * g.pb;
			} while (now_ns() < end);
		}
	}
	pub_verify(&g.pub, g.n);
	for (k = 0; k < P_N; k++) {
		for (r = 0; r < ROUNDS; r++)
			rate[k][r] = ns[r][k] ? (double)bytes[r][k] / (double)ns[r][k] : 0;
		med[k] = median(rate[k], ROUNDS);	/* bytes/ns = GB/s */
	}
	row3("put", &g, "memcpy", med[P_PUT], med[P_MEMCPY_PUT], NULL);
	row3("put", &g, "redis-set", med[P_PUT], med[P_REDIS_SET], rskip);
	row3("put", &g, "memcached-set", med[P_PUT], med[P_MC_SET], mskip);
	row3("get", &g, "memcpy", med[P_GET], med[P_MEMCPY_GET], NULL);
	row3("get", &g, "redis-get", med[P_GET], med[P_REDIS_GET], rskip);
	row3("get", &g, "memcached-get", med[P_GET], med[P_MC_GET], mskip);
	row3("pin", &g, NULL, med[P_PIN], 0, NULL);
	/* The same, per page: a pin should cost the same at every size. */
	add_row(&(struct row){ "pages", "pin", 1, g.n, g.pb, NULL, "ns/page", NULL,
			       med[P_PIN] > 0 ? (double)g.pb / med[P_PIN] : 0, 0, NULL });

	for (q = 0; q < g.ws_reqs; q++)
		kvc_req_free(g.keep[q]);
	if (g.rc) {
		redis_flushall(g.rc);
		redisFree(g.rc);
	}
	if (g.mc) {
		mc_flushall(g.mc);
		memcached_result_free(&g.mres);
		memcached_free(g.mc);
	}
	bench_close(g.c);
	munmap(g.ring, RING_BYTES);
	free(g.src);
	free(g.buf);
	free(g.pub.tokens);
	free(g.ws_tokens);
	free(g.ws_keys);
	free(g.ws_hex);
	free(g.keep);
	free(g.put_keys);
}

void mode_pages(void)
{
	const uint32_t *layers = opt.quick ? quick_layers : page_layers;
	size_t nl = opt.quick ? NELEM(quick_layers) : NELEM(page_layers), i;
	char name[64], psz[16];

	servers_start();
	for (i = 0; i < nl; i++) {
		const char *sock = opt.socket;

		snprintf(name, sizeof(name), "kvbench-pages-%u-%d", layers[i], (int)main_pid);
		if (!sock) {
			/* Slots of exactly the page size; the working set (64 MiB),
			 * held pinned, and room for the puts to churn. */
			snprintf(psz, sizeof(psz), "%uK", layers[i] * 64);
			sock = daemon_start("pages", psz, "256M");
		}
		bench_size(sock, layers[i], name);
	}
	if (!opt.socket)
		daemon_stop(false);
}
