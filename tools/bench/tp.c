// SPDX-License-Identifier: MIT
/*
 * tp.c - kvbench's tp mode: tensor-parallel ranks on pages that every TP
 * size reads (issue #33), and the layout that was not chosen.
 *
 * The model: Llama-3-8B's KV heads (8 of 128, bf16), one layer, 16-token
 * blocks: a page of every head is 64 KiB; a TP 2 rank holds 4 heads.
 * One prompt of 256 blocks, cached three ways in one daemon:
 *
 *   shared     one page per block holding all 8 heads, written by the two
 *              ranks of a TP 2 engine together (each its 4 heads: the
 *              layout kvcached uses, readable at every TP size);
 *   per-rank   the layout before issue #33: a namespace per rank, each page
 *              that rank's 4 heads (what a TP 2 rank looked up before);
 *   per-head   the alternative: a page per KV head (8 KiB), keyed by block
 *              and head (the head is mixed into the key as an extra key),
 *              one writer each; any TP size reads the heads it holds.
 *
 * Kinds, in alternating slices (ROUNDS each; the lookups, then the
 * gathers, so that the gathers' copies do not leave the lookups' caches
 * cold), rank 0 of TP 2:
 *
 *   T_SHARED   kvc_lookup of the prompt in the shared namespace, on 16
 *              requests made beforehand (kvc_req_new and kvc_req_free
 *              untimed, as lookup mode's K_LOOKUP)
 *   T_RANK     the same in the rank's own namespace (per-rank)
 *   T_HEADS    the 4 head chains of the rank (per-head): 4 kvc_lookups a
 *              prompt; counted as the prompt's 256 blocks
 *   G_SHARED   kvc_gather of the rank's 4 heads of the 256 blocks from the
 *              shared pages into an engine cache of 4 heads (a run of 1 KiB
 *              per token row), the requests pinned beforehand
 *   G_HEADS    4 kvc_gathers, one per head page, into 4 one-head caches
 *              (the same bytes; interleaving them into the engine's layout,
 *              which a real engine would need, is not counted)
 *
 * Rows: lookup blocks/s (shared vs per-rank, shared vs per-head) and
 * gather GB/s (shared vs per-head). The index entries and pool pages each
 * layout takes per block are counted from the daemon's statistics and
 * printed below the table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define NB	256		/* blocks of the prompt */
#define HEADS	8
#define HD	128
#define BATCH	16		/* requests a lookup batch: 4096 pins */
/* Pages of 64 KiB (or more) the three layouts take, with room to spare:
 * a daemon kvbench did not start without them is skipped. */
#define NEED_PAGES (2 * (NB + NB + HEADS * NB))

enum { T_SHARED, T_RANK, T_HEADS, G_SHARED, G_HEADS, T_N };

struct tpb {
	kvc_t *shared, *rank, *heads;	/* rank 0 of TP 2; a rank's namespace; per head */
	uint32_t tokens[NB * BT];
	int64_t ids[NB];
	void *ek[1], *ev[1];		/* rank's cache: [NB][BT][4][HD], K and V */
	void *hk[4][1], *hv[4][1];	/* per-head caches: [NB][BT][1][HD] */
	struct kvc_layout ls, lh[4];
	struct kvc_req *gs, *gh[4];	/* pinned for the gathers */
	struct kvc_req *reqs[BATCH];
};

static char head_extra[HEADS][8];	/* "head0".."head7": per-head keys */

static struct kvc_model model_of(const char *name, uint32_t heads, uint16_t tp, uint16_t rank)
{
	struct kvc_model m = big_model(name, 1);

	m.kv_heads = heads;
	m.shard.tp_size = tp;
	m.shard.tp_rank = rank;
	return m;
}

static uint64_t stat_of(kvc_t *c, const char *name)
{
	struct kvc_stat st[256];
	int n = ck(kvc_daemon_stats(c, st, NELEM(st)), "kvc_daemon_stats"), i;

	for (i = 0; i < n && i < (int)NELEM(st); i++)
		if (!strcmp(st[i].name, name))
			return st[i].value;
	die("tp: no statistic %s", name);
}

static size_t elen(const char *extra)
{
	return extra ? strlen(extra) : 0;
}

/* Begin the prompt through c: looked up (a miss) and every page granted. */
static struct kvc_req *begin(struct tpb *b, kvc_t *c, const char *extra)
{
	struct kvc_req *r;
	int got;

	ck(kvc_req_new(c, b->tokens, NB * BT, extra, elen(extra), &r), "kvc_req_new");
	if (ck(kvc_lookup(r), "kvc_lookup"))
		die("tp: a fresh prompt hit");
	got = ck(kvc_alloc(r), "kvc_alloc");
	if (got != NB)
		die("tp: kvc_alloc granted %d of %d pages (%s)", got, NB,
		    kvc_strerror(kvc_req_short_reason(r)));
	return r;
}

static void finish(struct kvc_req *r)
{
	if (ck(kvc_publish(r), "kvc_publish") != NB)
		die("tp: a publish of %d pages cached fewer", NB);
	kvc_req_free(r);
}

/* Write the prompt through a one-writer handle, pages filled whole. */
static void put(struct tpb *b, kvc_t *c, const char *extra)
{
	struct kvc_req *r = begin(b, c, extra);
	struct kvc_key k[NB];
	size_t i;

	ck(kvc_req_keys(r, k, NB), "kvc_req_keys");
	for (i = 0; i < NB; i++)
		fill_page(kvc_block(r, i), kvc_page_bytes(c), k[i]);
	finish(r);
}

static struct kvc_req *pinned(struct tpb *b, kvc_t *c, const char *extra)
{
	struct kvc_req *r;

	ck(kvc_req_new(c, b->tokens, NB * BT, extra, elen(extra), &r), "kvc_req_new");
	if (ck(kvc_lookup(r), "kvc_lookup") != NB)
		die("tp: the cached prompt did not hit whole");
	return r;
}

static struct kvc_layout layout_of(void **k, void **v)
{
	struct kvc_layout l = { .size = sizeof(l), .kind = KVC_LAYOUT_KV, .layers = 1,
				.num_blocks = NB, .k = (void *const *)k, .v = (void *const *)v };

	return l;
}

/* One batch of kind t; returns its ns, adds blocks or bytes to *ops. */
static uint64_t batch(struct tpb *b, int t, uint64_t *ops)
{
	uint64_t t0, ns;
	int i, h;
	kvc_t *c = t == T_SHARED ? b->shared : t == T_RANK ? b->rank : b->heads;

	if (t == G_SHARED || t == G_HEADS) {
		t0 = now_ns();
		if (t == G_SHARED)
			ck(kvc_gather(b->gs, 0, NB, &b->ls, b->ids, NULL), "kvc_gather");
		else
			for (h = 0; h < 4; h++)
				ck(kvc_gather(b->gh[h], 0, NB, &b->lh[h], b->ids, NULL), "kvc_gather");
		ns = now_ns() - t0;
		*ops += (uint64_t)NB * BT * 4 * HD * 2 * 2;	/* the rank's K and V bytes */
		return ns;
	}
	/* Per head: BATCH / 4 prompts of the rank's 4 head chains each. */
	for (i = 0; i < BATCH; i++) {
		const char *x = t == T_HEADS ? head_extra[i % 4] : NULL;

		ck(kvc_req_new(c, b->tokens, NB * BT, x, elen(x), &b->reqs[i]), "kvc_req_new");
	}
	t0 = now_ns();
	for (i = 0; i < BATCH; i++)
		if (kvc_lookup(b->reqs[i]) != NB)
			die("tp: a lookup of the cached prompt missed (pin slots?)");
	ns = now_ns() - t0;
	for (i = 0; i < BATCH; i++)
		kvc_req_free(b->reqs[i]);
	*ops += (uint64_t)(t == T_HEADS ? BATCH / 4 : BATCH) * NB;	/* prompts' blocks */
	return ns;
}

void mode_tp(void)
{
	static struct tpb b;
	char n_shared[64], n_rank[64], n_heads[64];
	const uint64_t rank_bytes = (uint64_t)NB * BT * 4 * HD * 2;
	uint64_t ops[ROUNDS][T_N] = { { 0 } }, ns[ROUNDS][T_N] = { { 0 } };
	uint64_t e[4], p[4], until, slice_ns;
	double rate[T_N][ROUNDS], med[T_N];
	struct kvc_model ms, m1, mr, mh;
	struct kvc_req *q0, *q1;
	const char *sock = opt.socket;
	kvc_t *r1;
	int round, j, t, h, i;

	snprintf(n_shared, sizeof(n_shared), "kvbench-tp-%d-shared", (int)main_pid);
	snprintf(n_rank, sizeof(n_rank), "kvbench-tp-%d-rank", (int)main_pid);
	snprintf(n_heads, sizeof(n_heads), "kvbench-tp-%d-heads", (int)main_pid);
	ms = model_of(n_shared, HEADS, 2, 0);
	m1 = model_of(n_shared, HEADS, 2, 1);
	mr = model_of(n_rank, 4, 1, 0);
	mh = model_of(n_heads, 1, 1, 0);
	if (!sock)	/* 64 KiB slots: 256 + 256 + 2048 pages (a head's uses 8 KiB) */
		sock = daemon_start("tp", "64K", "192M");
	if (opt.socket) {	/* a daemon kvbench did not start: room for it all? */
		struct kvc_stats st;
		char err[256] = "";
		kvc_t *c = NULL;
		int rc = try_open(sock, &ms, &c, err, sizeof(err));

		if (!rc && (ck(kvc_stats(c, &st), "kvc_stats"), st.pages_total < NEED_PAGES))
			snprintf(err, sizeof(err), "the pool has %llu pages, %d needed",
				 (unsigned long long)st.pages_total, NEED_PAGES);
		if (c)
			kvc_close(c);
		if (rc || *err) {
			fprintf(stderr, "kvbench: tp: skipped: %s\n", *err ? err : kvc_strerror(rc));
			return;
		}
	}
	b.shared = open_model(sock, &ms);
	r1 = open_model(sock, &m1);
	b.rank = open_model(sock, &mr);
	b.heads = open_model(sock, &mh);
	make_tokens(b.tokens, NB * BT, 33);
	for (i = 0; i < NB; i++)
		b.ids[i] = i;
	b.ek[0] = xmalloc(rank_bytes);
	b.ev[0] = xmalloc(rank_bytes);
	for (i = 0; i < (int)(rank_bytes / 8); i++) {
		((uint64_t *)b.ek[0])[i] = mix64((uint64_t)i);
		((uint64_t *)b.ev[0])[i] = mix64((uint64_t)i + 7);
	}
	b.ls = layout_of(b.ek, b.ev);
	for (h = 0; h < HEADS; h++)
		snprintf(head_extra[h], sizeof(head_extra[h]), "head%d", h);
	for (h = 0; h < 4; h++) {
		b.hk[h][0] = xmalloc(rank_bytes / 4);
		b.hv[h][0] = xmalloc(rank_bytes / 4);
		b.lh[h] = layout_of(b.hk[h], b.hv[h]);
	}

	/* Shared: the two ranks of a TP 2 engine write each page together
	 * (the same engine cache stands for each rank's heads). */
	e[0] = stat_of(b.shared, "index_entries");
	p[0] = stat_of(b.shared, "pages_ready");
	q0 = begin(&b, b.shared, NULL);
	q1 = begin(&b, r1, NULL);
	ck(kvc_scatter(q0, 0, NB, &b.ls, b.ids, NULL), "kvc_scatter");
	ck(kvc_scatter(q1, 0, NB, &b.ls, b.ids, NULL), "kvc_scatter");
	finish(q0);
	finish(q1);
	e[1] = stat_of(b.shared, "index_entries");
	p[1] = stat_of(b.shared, "pages_ready");
	/* Per rank: one rank's namespace, its 4 heads a page. */
	put(&b, b.rank, NULL);
	e[2] = stat_of(b.shared, "index_entries");
	p[2] = stat_of(b.shared, "pages_ready");
	/* Per head: 8 chains, a page per head and block. */
	for (h = 0; h < HEADS; h++)
		put(&b, b.heads, head_extra[h]);
	e[3] = stat_of(b.shared, "index_entries");
	p[3] = stat_of(b.shared, "pages_ready");

	b.gs = pinned(&b, b.shared, NULL);
	for (h = 0; h < 4; h++)
		b.gh[h] = pinned(&b, b.heads, head_extra[h]);
	for (t = 0; t < T_N; t++) {	/* warm-up, untimed */
		uint64_t x = 0;

		batch(&b, t, &x);
	}
	/* Alternating slices, lookups first, then gathers (their copies
	 * would leave the lookups' caches cold): each round runs every kind
	 * of the phase once, starting with a different one. */
	slice_ns = (uint64_t)(opt.seconds * 1e9 / ROUNDS / T_N);
	for (j = 0; j < 2; j++) {
		int lo = j ? G_SHARED : T_SHARED, nk = j ? T_N - G_SHARED : G_SHARED, q;

		for (round = 0; round < ROUNDS; round++)
			for (q = 0; q < nk; q++) {
				t = lo + (round + q) % nk;
				until = now_ns() + slice_ns;
				do
					ns[round][t] += batch(&b, t, &ops[round][t]);
				while (now_ns() < until);
			}
	}
	for (t = 0; t < T_N; t++) {
		for (round = 0; round < ROUNDS; round++)
			rate[t][round] = (double)ops[round][t] / ((double)ns[round][t] / 1e9) /
					 (t >= G_SHARED ? 1e9 : 1);
		med[t] = median(rate[t], ROUNDS);
	}
	add_row(&(struct row){ .mode = "tp", .op = "lookup", .procs = 1, .blocks = NB,
			       .page_bytes = kvc_page_bytes(b.shared), .unit = "blocks/s",
			       .peer_kind = "per-rank-ns", .kv = med[T_SHARED], .peer = med[T_RANK] });
	add_row(&(struct row){ .mode = "tp", .op = "lookup", .procs = 1, .blocks = NB,
			       .page_bytes = kvc_page_bytes(b.shared), .unit = "blocks/s",
			       .peer_kind = "page-per-head", .kv = med[T_SHARED],
			       .peer = med[T_HEADS] });
	add_row(&(struct row){ .mode = "tp", .op = "gather", .procs = 1, .blocks = NB,
			       .page_bytes = kvc_page_bytes(b.shared), .unit = "GB/s",
			       .peer_kind = "page-per-head", .kv = med[G_SHARED], .peer = med[G_HEADS] });
	snprintf(mode_text, sizeof(mode_text),
		 "tp: 256 blocks of 8 KV heads x 128, bf16, 1 layer; rank 0 of TP 2. Per block: "
		 "pages of every head %.2f index entries, %.2f pages of %zu KiB (every TP size "
		 "reads them); a namespace per rank %.2f, %.2f pages of %zu KiB (and as many "
		 "again for rank 1; read at TP 2 only); a page per head %.2f, %.2f pages of %zu "
		 "KiB.\n",
		 (double)(e[1] - e[0]) / NB, (double)(p[1] - p[0]) / NB,
		 kvc_page_bytes(b.shared) >> 10, (double)(e[2] - e[1]) / NB,
		 (double)(p[2] - p[1]) / NB, kvc_page_bytes(b.rank) >> 10,
		 (double)(e[3] - e[2]) / NB, (double)(p[3] - p[2]) / NB,
		 kvc_page_bytes(b.heads) >> 10);
	snprintf(mode_json, sizeof(mode_json),
		 ",\"tp\":{\"blocks\":%d,\"entries_per_block\":{\"shared\":%.2f,\"per_rank\":%.2f,"
		 "\"per_head\":%.2f},\"pages_per_block\":{\"shared\":%.2f,\"per_rank\":%.2f,"
		 "\"per_head\":%.2f},\"page_kib\":{\"shared\":%zu,\"per_rank\":%zu,\"per_head\":%zu}}",
		 NB, (double)(e[1] - e[0]) / NB, (double)(e[2] - e[1]) / NB,
		 (double)(e[3] - e[2]) / NB, (double)(p[1] - p[0]) / NB, (double)(p[2] - p[1]) / NB,
		 (double)(p[3] - p[2]) / NB, kvc_page_bytes(b.shared) >> 10,
		 kvc_page_bytes(b.rank) >> 10, kvc_page_bytes(b.heads) >> 10);
	kvc_req_free(b.gs);
	for (h = 0; h < 4; h++) {
		kvc_req_free(b.gh[h]);
		free(b.hk[h][0]);
		free(b.hv[h][0]);
	}
	free(b.ek[0]);
	free(b.ev[0]);
	kvc_close(r1);
	bench_close(b.shared);
	bench_close(b.rank);
	bench_close(b.heads);
	if (!opt.socket)
		daemon_stop(true);
}
