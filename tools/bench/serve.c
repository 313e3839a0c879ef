// SPDX-License-Identifier: MIT
/*
 * serve.c - kvbench's serve mode: the figure that says why kvcached
 * exists. N engine processes (tinylm, tools/tinylm/, forked from kvbench)
 * serve one request trace on one host, with the same total KV memory, in
 * these configurations measured in the same run:
 *
 *   none              no prefix cache: every prompt is prefilled whole;
 *   private           each process keeps its own in-process prefix cache
 *                     of 1/N of the memory (LRU over whole blocks, looked
 *                     up along the block chain: no IPC at all, no sharing
 *                     between processes), naive: a request's blocks are
 *                     stamped in prompt order, so its head goes first;
 *   private-tail      the same cache evicting a request's tail first, as
 *                     vLLM's automatic prefix caching does (its free queue
 *                     takes a finished request's blocks in reverse): the
 *                     best per-engine policy a user could pick;
 *   kvcached          one kvcached pool of all the memory, shared by the N
 *                     processes, single flight on (tlm_prefill waits for
 *                     blocks another process is writing), the daemon's
 *                     default eviction policy (s3fifo) and watermarks of
 *                     1 and 2% (the defaults, 5 and 10%, keep that much
 *                     of the memory empty for ALLOCs to come);
 *   kvcached-<policy> the same with each other eviction policy
 *                     (--eviction lru, clock);
 *   kvcached-nowait   the default pool with single flight off (TLM_NO_WAIT).
 *
 * Workloads, generated from a seed (parameters printed and in the JSON):
 *
 *   qa    long-document QA: D table documents of L tokens, each request
 *         one document (Zipf popularity, exponent s) and a new Q-token
 *         question, arriving as a Poisson process of rate lambda, routed
 *         to a uniformly random process;
 *   chat  multi-turn chat: S sessions over a shared P-token system
 *         prompt; turn t of a session is the system prompt, every earlier
 *         turn (U-token user text and a fixed U-token reply) and the new
 *         user text; turns arrive as a Poisson process, each turn of a
 *         random session with turns left, routed to a random process, and
 *         never before the session's previous turn has its first token;
 *   scan  a hot set of H documents of L tokens (uniform popularity) and,
 *         for a share f of the requests, a long document of 2L tokens
 *         that is never asked about again (a scan); each with a new
 *         question, Poisson arrivals, random routing. The hot set's token
 *         hit ratio is reported apart: scan resistance is keeping it;
 *   qa-big  qa at a realistic size: 2048-token documents and 256 MiB of
 *         KV memory (16,384 pages); run only when named in
 *         --serve-workloads (minutes on two cores).
 *
 * Each process serves the requests routed to it in arrival order, one at
 * a time. TTFT is from a request's arrival (or its previous turn's first
 * token, if later) to its first token: queueing included, as a user sees
 * it. Requests/s is the trace's requests over the time from the start to
 * the last first token. Prefill tokens are the tokens the engines ran;
 * hit ratios are the prompt blocks / tokens read from a cache (a prompt's
 * last token always runs: tinylm's rule). Every configuration starts cold
 * (a fresh daemon, empty private caches). Every request's first token
 * must be the same in every configuration, or kvbench fails: a cache may
 * never change a result.
 *
 * Each point (workload, N) runs `rounds` traces (seeds seed, seed + 1,
 * ...); in each round the configurations run one after the other, no
 * cache first, the others in an order that turns from round to round.
 * Prefill tokens are the mean per round, hit ratios and requests/s are
 * over all rounds, TTFT p50 and p99 the median of the rounds' figures: on
 * a machine shared with other work a burst of load during one run would
 * otherwise decide a configuration's tail.
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/lib/procfs.h"
#include "../tinylm/tinylm.h"
#include "bench.h"

enum { C_NONE, C_PRIVATE, C_PRIV_TAIL, C_KVC, C_KVC_P1, C_KVC_P2, C_NOWAIT, C_N };
static const char *const cfg_name[C_N] = {
	"none", "private", "private-tail", "kvcached", "kvcached-lru", "kvcached-clock",
	"kvcached-nowait",
};
/* The daemon's eviction policy per configuration: the default (config
 * key `eviction`, daemon/config.c: s3fifo) and the others. */
static const char *const cfg_policy[C_N] = {
	[C_KVC] = "s3fifo", [C_KVC_P1] = "lru", [C_KVC_P2] = "clock", [C_NOWAIT] = "s3fifo",
};

static bool is_kvc(int cfg)
{
	return cfg >= C_KVC;
}

enum { W_QA, W_CHAT, W_SCAN, W_BIG, W_N };
static const char *const wl_name[W_N] = { "qa", "chat", "scan", "qa-big" };
#define SCAN_ONEOFF 1000000u	/* scan: document ids from here are one-off */

/* Everything that shapes a run; printed, and in the JSON config. */
struct params {
	uint64_t seed;
	int rounds;		/* traces per point (seed, seed + 1, ...) */
	int procs[3], n_procs;
	size_t mem;		/* total KV memory, bytes */
	/* qa */
	int docs, doc_tokens, q_tokens, qa_requests;
	double zipf, qa_rate;
	/* chat */
	int sessions, sys_tokens, turn_tokens, turns;
	double chat_rate;
	/* scan: hot documents (doc_tokens each), one-off ones of scan_tokens */
	int scan_hot, scan_tokens, scan_requests;
	double scan_share, scan_rate;
	/* qa-big */
	size_t big_mem;
	int big_docs, big_doc_tokens, big_requests;
	double big_zipf, big_rate;
};

static const struct params full = {
	.seed = 1, .rounds = 3, .procs = { 1, 2, 4 }, .n_procs = 3, .mem = 6u << 20,
	.docs = 24, .doc_tokens = 512, .q_tokens = 32, .qa_requests = 200,
	.zipf = 1.1, .qa_rate = 16.0,
	.sessions = 12, .sys_tokens = 256, .turn_tokens = 64, .turns = 8, .chat_rate = 8.0,
	.scan_hot = 6, .scan_tokens = 1024, .scan_requests = 120, .scan_share = 0.5,
	.scan_rate = 4.0,
	.big_mem = 256u << 20, .big_docs = 400, .big_doc_tokens = 2048, .big_requests = 300,
	.big_zipf = 0.8, .big_rate = 4.0,
};

static const struct params quick = {
	.seed = 1, .rounds = 1, .procs = { 2 }, .n_procs = 1, .mem = 1u << 20,
	.docs = 3, .doc_tokens = 128, .q_tokens = 16, .qa_requests = 16,
	.zipf = 1.1, .qa_rate = 200.0,
	.sessions = 2, .sys_tokens = 32, .turn_tokens = 16, .turns = 3, .chat_rate = 200.0,
	.scan_hot = 2, .scan_tokens = 128, .scan_requests = 16, .scan_share = 0.5,
	.scan_rate = 200.0,
	.big_mem = 4u << 20, .big_docs = 8, .big_doc_tokens = 256, .big_requests = 16,
	.big_zipf = 0.8, .big_rate = 200.0,
};

static const struct params *P;

/* Command-line overrides (serve_option); 0 / empty: the defaults. */
static struct {
	int procs[3], n_procs, rounds;
	unsigned workloads;	/* bit per workload */
} ov;

const char *serve_option(int o, const char *v)
{
	char buf[64], *tok, *save = NULL, *end;
	long x;

	if (strlen(v) >= sizeof(buf) || !*v)
		return "empty or too long";
	snprintf(buf, sizeof(buf), "%s", v);
	if (o == 'R') {
		x = strtol(v, &end, 10);
		if (*end || x < 1 || x > 8)
			return "must be a whole number from 1 to 8";
		ov.rounds = (int)x;
		return NULL;
	}
	if (o == 'P')
		ov.n_procs = 0;
	else
		ov.workloads = 0;
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (o == 'W') {
			int w;

			for (w = 0; w < W_N && strcmp(tok, wl_name[w]); w++)
				;
			if (w == W_N)
				return "workloads are qa, chat, scan and qa-big";
			ov.workloads |= 1u << w;
			continue;
		}
		x = strtol(tok, &end, 10);
		if (*end || x < 1 || x > 16)
			return "a list of at most 3 process counts from 1 to 16";
		if (ov.n_procs == 3)
			return "a list of at most 3 process counts from 1 to 16";
		ov.procs[ov.n_procs++] = (int)x;
	}
	return NULL;
}

/* The engines' model: tinylm, small enough that a run takes seconds. */
static const struct tlm_config model_cfg = {
	.dim = 128, .hidden_dim = 384, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
	.seq_len = 4096,
};
static struct tlm_model model;
static size_t page_bytes;

/* ------------------------------------------------------------ the trace */

struct sreq {
	double arrival;		/* seconds after the start */
	int32_t proc;		/* which engine serves it */
	int32_t prev;		/* chat: the session's previous turn, or -1 */
	uint32_t a, b;		/* qa, scan: document, question; chat: session, turn */
};

/* What a request did; written by its engine, in shared memory. */
struct sres {
	double ttft;		/* seconds */
	double done;		/* first token, seconds after the start */
	uint32_t tokens, computed, hit_tokens, blocks, hit_blocks, wait_tokens;
	uint32_t first;		/* the first token */
	uint32_t hot;		/* scan: a request for a hot document */
	_Atomic int finished;
};

struct trace {
	int w, n;
	uint64_t seed;
	struct sreq *rq;
	size_t max_tokens;
};

/* KV memory of a workload's runs, bytes. */
static size_t mem_of(int w)
{
	return w == W_BIG ? P->big_mem : P->mem;
}

static uint64_t rng_next(uint64_t *s)
{
	*s += 0x9e3779b97f4a7c15ull;
	return mix64(*s);
}

static double rng_unit(uint64_t *s)
{
	return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_exp(uint64_t *s, double rate)
{
	return -log(rng_unit(s)) / rate;
}

static void make_trace(struct trace *t, int w, int nprocs, int round)
{
	uint64_t s;
	double at = 0;
	int i;

	t->w = w;
	t->seed = P->seed + (uint64_t)round;
	s = t->seed * 1000003 + (uint64_t)w;
	if (w == W_QA || w == W_BIG) {
		int docs = w == W_QA ? P->docs : P->big_docs;
		double *cdf = xmalloc(docs * sizeof(double)), sum = 0;
		double rate = w == W_QA ? P->qa_rate : P->big_rate;

		t->n = w == W_QA ? P->qa_requests : P->big_requests;
		t->rq = xmalloc(t->n * sizeof(*t->rq));
		for (i = 0; i < docs; i++)
			cdf[i] = sum += 1.0 / pow(i + 1, w == W_QA ? P->zipf : P->big_zipf);
		for (i = 0; i < t->n; i++) {
			double u = rng_unit(&s) * sum;
			int d = 0;

			while (d < docs - 1 && cdf[d] < u)
				d++;
			at += rng_exp(&s, rate);
			t->rq[i] = (struct sreq){ at, (int32_t)(rng_next(&s) % nprocs), -1,
						  (uint32_t)d, (uint32_t)i };
		}
		t->max_tokens = (size_t)(w == W_QA ? P->doc_tokens : P->big_doc_tokens) + P->q_tokens;
		free(cdf);
	} else if (w == W_SCAN) {
		t->n = P->scan_requests;
		t->rq = xmalloc(t->n * sizeof(*t->rq));
		for (i = 0; i < t->n; i++) {
			uint32_t d = rng_unit(&s) < P->scan_share
					     ? SCAN_ONEOFF + (uint32_t)i
					     : (uint32_t)(rng_next(&s) % (uint64_t)P->scan_hot);

			at += rng_exp(&s, P->scan_rate);
			t->rq[i] = (struct sreq){ at, (int32_t)(rng_next(&s) % nprocs), -1, d,
						  (uint32_t)i };
		}
		t->max_tokens = (size_t)(P->scan_tokens > P->doc_tokens ? P->scan_tokens
									  : P->doc_tokens) +
				P->q_tokens;
	} else {
		int *next = xmalloc(P->sessions * sizeof(int)), *last = xmalloc(P->sessions * sizeof(int));
		int left = P->sessions;

		t->n = P->sessions * P->turns;
		t->rq = xmalloc(t->n * sizeof(*t->rq));
		for (i = 0; i < P->sessions; i++)
			last[i] = -1;
		for (i = 0; i < t->n; i++) {
			int k = (int)(rng_next(&s) % (uint64_t)left), sess;

			/* The k-th session with turns left. */
			for (sess = 0; next[sess] >= P->turns || k--; sess++)
				;
			at += rng_exp(&s, P->chat_rate);
			t->rq[i] = (struct sreq){ at, (int32_t)(rng_next(&s) % nprocs), last[sess],
						  (uint32_t)sess, (uint32_t)next[sess] };
			last[sess] = i;
			if (++next[sess] == P->turns)
				left--;
		}
		t->max_tokens = (size_t)P->sys_tokens + (size_t)P->turns * 2 * P->turn_tokens;
		free(next);
		free(last);
	}
}

/* The prompt of request r into tok; its length. */
static size_t prompt_of(const struct trace *t, const struct sreq *r, uint32_t *tok)
{
	size_t n;
	uint32_t k;

	if (t->w != W_CHAT) {
		size_t len = t->w == W_QA ? (size_t)P->doc_tokens
			     : t->w == W_BIG ? (size_t)P->big_doc_tokens
			     : r->a >= SCAN_ONEOFF ? (size_t)P->scan_tokens : (size_t)P->doc_tokens;
		uint64_t id = t->w == W_QA ? t->seed * 1000 + r->a
			      : t->seed * 10000019ull + r->a + (uint64_t)t->w * 77777;

		n = tlm_make_doc(tok, len, id);
		if (n != len)
			die("serve: out of memory");
		return n + tlm_make_question(tok + n, P->q_tokens, (int)r->b);
	}
	n = tlm_make_doc(tok, P->sys_tokens, t->seed * 1000 + 999);
	if (n != (size_t)P->sys_tokens)
		die("serve: out of memory");
	for (k = 0; k <= r->b; k++) {
		/* The user's turn, then (before later turns) a fixed reply. */
		int id = (int)(t->seed % 1000 * 100000 + r->a * 1000 + k * 2);

		n += tlm_make_question(tok + n, P->turn_tokens, id);
		if (k < r->b)
			n += tlm_make_question(tok + n, P->turn_tokens, id + 1);
	}
	return n;
}

/* ------------------------------------------------ a private prefix cache */

/*
 * One engine's own prefix cache: whole blocks keyed along the chain (a
 * block's key covers every token before it), LRU, capacity in blocks, no
 * sharing. Tokens and parent are compared on a hit, so a hash collision
 * is a miss, as in kvcached.
 */
struct pblock {
	uint64_t key, parent, lru;
	int32_t next;		/* hash chain */
	int used;
};

struct pcache {
	size_t cap, n;
	uint32_t nb;		/* hash buckets, a power of two */
	int32_t *head;
	struct pblock *b;
	uint32_t *tok;		/* cap x BT */
	uint8_t *kv;		/* cap x page_bytes */
	uint64_t clock;
};

static void pcache_init(struct pcache *pc, size_t cap)
{
	memset(pc, 0, sizeof(*pc));
	pc->cap = cap ? cap : 1;
	for (pc->nb = 16; pc->nb < 2 * pc->cap; pc->nb *= 2)
		;
	pc->head = xmalloc(pc->nb * sizeof(int32_t));
	memset(pc->head, 0xff, pc->nb * sizeof(int32_t));
	pc->b = xmalloc(pc->cap * sizeof(*pc->b));
	pc->tok = xmalloc(pc->cap * BT * sizeof(uint32_t));
	pc->kv = xmalloc(pc->cap * page_bytes);
}

static void pcache_free(struct pcache *pc)
{
	free(pc->head);
	free(pc->b);
	free(pc->tok);
	free(pc->kv);
}

static uint64_t block_key(uint64_t parent, const uint32_t *t)
{
	uint64_t h = parent ^ 0x5bd1e9955bd1e995ull;

	for (int i = 0; i < BT; i++)
		h = mix64(h ^ t[i]);
	return h ? h : 1;
}

static int32_t pcache_find(const struct pcache *pc, uint64_t key, uint64_t parent,
			   const uint32_t *t)
{
	int32_t i;

	for (i = pc->head[key & (pc->nb - 1)]; i >= 0; i = pc->b[i].next)
		if (pc->b[i].key == key && pc->b[i].parent == parent &&
		    !memcmp(pc->tok + (size_t)i * BT, t, BT * sizeof(uint32_t)))
			return i;
	return -1;
}

/* A slot for a new block: a free one, else the least recently used. */
static int32_t pcache_slot(struct pcache *pc)
{
	int32_t v = 0, *pp;
	size_t i;

	if (pc->n < pc->cap) {
		v = (int32_t)pc->n++;
		return v;
	}
	for (i = 1; i < pc->cap; i++)
		if (pc->b[i].lru < pc->b[v].lru)
			v = (int32_t)i;
	for (pp = &pc->head[pc->b[v].key & (pc->nb - 1)]; *pp != v; pp = &pc->b[*pp].next)
		;
	*pp = pc->b[v].next;
	return v;
}

/*
 * tlm_prefill's contract, with the private cache in place of kvcached.
 * Hits are stamped as they are found (in use: a new block never evicts
 * its own request's prefix), new blocks as they are stored. With
 * tail_first the whole request is stamped again at the end, last block
 * first, so that its tail is the least recently used (vLLM's order).
 */
static void pcache_prefill(struct tlm_state *s, struct pcache *pc, const uint32_t *tok,
			   size_t n, bool tail_first, struct tlm_run *run)
{
	size_t blocks = n / BT, hits = 0, use, i;
	uint64_t *keys = xmalloc((blocks + 1) * sizeof(uint64_t));
	int32_t *at = xmalloc((blocks + 1) * sizeof(int32_t));

	memset(run, 0, sizeof(*run));
	run->tokens = n;
	keys[0] = 0;
	for (i = 0; i < blocks; i++) {
		keys[i + 1] = block_key(keys[i], tok + i * BT);
		at[i] = pcache_find(pc, keys[i + 1], keys[i], tok + i * BT);
		if (at[i] < 0)
			break;
		pc->b[at[i]].lru = ++pc->clock;
		hits++;
	}
	for (; i < blocks; i++)
		keys[i + 1] = block_key(keys[i], tok + i * BT);
	use = hits < (n - 1) / BT ? hits : (n - 1) / BT;
	for (i = 0; i < use; i++)
		tlm_kv_gather(s, i * BT, pc->kv + (size_t)at[i] * page_bytes, BT);
	s->n = use * BT;
	run->hit_tokens = use * BT;
	if (tlm_forward(s, tok + s->n, NULL, NULL, n - s->n, 1))
		die("serve: tinylm forward failed");
	run->computed = n - use * BT;
	for (i = hits; i < blocks; i++) {
		int32_t v = pcache_slot(pc);
		uint32_t h = (uint32_t)(keys[i + 1] & (pc->nb - 1));

		pc->b[v] = (struct pblock){ keys[i + 1], keys[i], ++pc->clock, pc->head[h], 1 };
		pc->head[h] = v;
		memcpy(pc->tok + (size_t)v * BT, tok + i * BT, BT * sizeof(uint32_t));
		tlm_kv_scatter(s, i * BT, pc->kv + (size_t)v * page_bytes, BT);
		at[i] = v;
		run->published++;
	}
	/* (a request longer than the cache may have evicted its own head:
	 * only blocks still holding this request's key are stamped) */
	for (i = blocks; tail_first && i--;)
		if (pc->b[at[i]].key == keys[i + 1])
			pc->b[at[i]].lru = ++pc->clock;
	free(keys);
	free(at);
}

/* ------------------------------------------------------------ engines */

struct shared {
	_Atomic int ready;
	_Atomic int failed;
	_Atomic double start;	/* CLOCK_MONOTONIC seconds; 0 until set */
};

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_until(double t)
{
	struct timespec ts;

	if (t <= mono())
		return;
	ts.tv_sec = (time_t)t;
	ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* One engine process: serve the requests routed to `me`, in order. */
static void engine(const struct trace *t, int cfg, int me, int nprocs, const char *sock,
		   struct shared *sh, struct sres *res)
{
	uint32_t *tok = xmalloc(t->max_tokens * sizeof(uint32_t));
	struct tlm_state s;
	struct pcache pc;
	kvc_t *c = NULL;
	double start;
	int i;

	if (tlm_state_init(&s, &model, t->max_tokens + 1))
		die("serve: out of memory");
	if (cfg == C_PRIVATE || cfg == C_PRIV_TAIL)
		pcache_init(&pc, mem_of(t->w) / page_bytes / (size_t)nprocs);
	if (is_kvc(cfg)) {
		struct kvc_model km = tlm_kvc_model(&model, BT);
		char err[256] = "";
		int rc = try_open(sock, &km, &c, err, sizeof(err));

		if (rc)
			die("serve: kvc_open on %s: %s %s", sock, kvc_strerror(rc), err);
	}
	atomic_fetch_add(&sh->ready, 1);
	while (!(start = atomic_load(&sh->start)))
		sleep_ms(1);
	for (i = 0; i < t->n; i++) {
		const struct sreq *r = &t->rq[i];
		struct sres *o = &res[i];
		struct tlm_run run;
		double arrive;
		size_t n;

		if (r->proc != me)
			continue;
		n = prompt_of(t, r, tok);
		arrive = start + r->arrival;
		if (r->prev >= 0) {
			/* A turn comes after the previous one's first token. */
			while (!atomic_load_explicit(&res[r->prev].finished, memory_order_acquire)) {
				if (atomic_load(&sh->failed))
					_exit(1);
				sleep_ms(1);
			}
			if (start + res[r->prev].done > arrive)
				arrive = start + res[r->prev].done;
		}
		sleep_until(arrive);
		tlm_state_reset(&s);
		if (cfg == C_PRIVATE || cfg == C_PRIV_TAIL) {
			pcache_prefill(&s, &pc, tok, n, cfg == C_PRIV_TAIL, &run);
		} else if (tlm_prefill(&s, c, tok, n, NULL, 0, wl_name[t->w],
				       cfg == C_NOWAIT ? TLM_NO_WAIT : 0, &run)) {
			die("serve: tinylm prefill failed");
		}
		o->first = tlm_argmax(s.logits, model.cfg.vocab_size);
		o->done = mono() - start;
		o->ttft = o->done - (arrive - start);
		if (run.cache_err)
			die("serve: a cache call failed: %s", kvc_strerror(run.cache_err));
		o->tokens = (uint32_t)n;
		o->computed = (uint32_t)run.computed;
		o->hit_tokens = (uint32_t)run.hit_tokens;
		o->blocks = (uint32_t)(n / BT);
		o->hit_blocks = (uint32_t)(run.hit_tokens / BT);
		o->wait_tokens = (uint32_t)run.wait_tokens;
		o->hot = t->w == W_SCAN && r->a < SCAN_ONEOFF;
		atomic_store_explicit(&o->finished, 1, memory_order_release);
	}
	if (cfg == C_PRIVATE || cfg == C_PRIV_TAIL)
		pcache_free(&pc);
	kvc_close(c);
	tlm_state_free(&s);
	free(tok);
}

/* ------------------------------------------------------------ one run */

struct metrics {
	double prefill, hit_tok, hit_blk, p50, p99, rps, wait_tokens, secs, hot_hit;
};

/* One configuration's requests over every round of a point. */
#define MAX_ROUNDS 8
struct acc {
	double p50[MAX_ROUNDS], p99[MAX_ROUNDS];	/* each round's TTFT, s */
	double prefill[MAX_ROUNDS];	/* each round's prefill tokens */
	double steal[MAX_ROUNDS];	/* each round's share of CPU stolen, % */
	int rounds, n;
	uint64_t tok, hit, blk, hblk, comp, wt;
	uint64_t hot_tok, hot_hit;	/* scan: the hot documents' requests */
	double secs;		/* start to last first token, summed */
};

static double pct(const double *sorted, int n, double p)
{
	int k = (int)ceil(p * n);

	return sorted[k < 1 ? 0 : k > n ? n - 1 : k - 1];
}

/* Serve trace t with configuration cfg on nprocs engines; add to *a.
 * Returns the seconds from the start to the last first token. */
static double run_config(const struct trace *t, int cfg, int nprocs, uint32_t *first,
			 bool ref, struct acc *a)
{
	struct shared *sh;
	struct sres *res;
	size_t bytes = sizeof(*sh) + (size_t)t->n * sizeof(*res);
	const char *sock = NULL;
	double last = 0, *ttft = xmalloc(t->n * sizeof(double));
	pid_t *pid = xmalloc(nprocs * sizeof(pid_t));
	int i, st, bad = 0, left;
	unsigned long long steal0, total0, steal1, total1;
	uint64_t comp0 = a->comp;
	void *mem;

	mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("serve: mmap: %s", strerror(errno));
	memset(mem, 0, bytes);
	sh = mem;
	res = (struct sres *)(sh + 1);
	if (is_kvc(cfg)) {
		char psz[32], pool[32];
		/* Equal memory: the default watermarks keep 5 to 10% of the
		 * pool empty for ALLOCs to come, which a private cache (it
		 * evicts in place) does not; 1 and 2% here. */
		const char *extra[] = { "--eviction", cfg_policy[cfg], "--low-watermark", "1",
					"--high-watermark", "2", NULL };

		snprintf(psz, sizeof(psz), "%zuK", page_bytes / 1024);
		snprintf(pool, sizeof(pool), "%zuK", mem_of(t->w) / 1024);
		/* fresh: starts cold */
		sock = daemon_start_args("serve", psz, pool, extra);
	}
	fflush(stdout);
	fflush(stderr);
	for (i = 0; i < nprocs; i++) {
		pid[i] = fork();
		if (pid[i] < 0)
			die("serve: fork: %s", strerror(errno));
		if (!pid[i]) {
			engine(t, cfg, i, nprocs, sock, sh, res);
			_exit(0);
		}
	}
	while (atomic_load(&sh->ready) < nprocs) {
		for (i = 0; i < nprocs; i++)
			if (waitpid(pid[i], &st, WNOHANG) == pid[i])
				die("serve: an engine process exited before the start");
		sleep_ms(1);
	}
	kvt_proc_cpu_jiffies(&steal0, &total0);
	atomic_store(&sh->start, mono() + 0.02);
	/* Any order: an engine waiting for another's turn must learn that
	 * one failed (kvbench's daemon is a child too: no waitpid(-1)). */
	for (left = nprocs; left;) {
		for (i = 0; i < nprocs; i++) {
			if (!pid[i] || waitpid(pid[i], &st, WNOHANG) != pid[i])
				continue;
			pid[i] = 0;
			left--;
			if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				atomic_store(&sh->failed, 1);
				bad = 1;
			}
		}
		if (left)
			sleep_ms(2);
	}
	kvt_proc_cpu_jiffies(&steal1, &total1);
	if (sock)
		daemon_stop(false);
	if (bad)
		die("serve: %s %s, %d processes: an engine process failed", wl_name[t->w],
		    cfg_name[cfg], nprocs);
	for (i = 0; i < t->n; i++) {
		const struct sres *o = &res[i];

		if (!o->finished)
			die("serve: request %d was not served", i);
		ttft[i] = o->ttft;
		a->n++;
		a->tok += o->tokens;
		a->hit += o->hit_tokens;
		a->blk += o->blocks;
		a->hblk += o->hit_blocks;
		a->comp += o->computed;
		a->wt += o->wait_tokens;
		if (o->hot) {
			a->hot_tok += o->tokens;
			a->hot_hit += o->hit_tokens;
		}
		if (o->done > last)
			last = o->done;
		/* A cache may never change a result. */
		if (ref)
			first[i] = o->first;
		else if (first[i] != o->first)
			die("serve: %s %s: request %d's first token %u differs from the first run's %u",
			    wl_name[t->w], cfg_name[cfg], i, o->first, first[i]);
	}
	a->secs += last;
	qsort(ttft, t->n, sizeof(double), cmp_dbl);
	a->prefill[a->rounds] = (double)(a->comp - comp0);
	a->steal[a->rounds] = total1 > total0 ? 100.0 * (double)(steal1 - steal0) /
							(double)(total1 - total0) : 0;
	a->p50[a->rounds] = pct(ttft, t->n, 0.50);
	a->p99[a->rounds++] = pct(ttft, t->n, 0.99);
	free(ttft);
	munmap(mem, bytes);
	free(pid);
	return last;
}

/*
 * Prefill tokens, TTFT p50 and p99: the median over the rounds of each
 * round's figure, so that one round hit by a burst of the machine's other
 * load does not make a configuration's tail (the spread is printed after
 * the table, spread_text); tokens by waiting: the mean per round; hit
 * ratios and requests/s: over all rounds.
 */
static struct metrics summarize(struct acc *a, int rounds)
{
	struct metrics m = { 0 };

	m.prefill = median(a->prefill, a->rounds);
	m.hit_tok = a->tok ? (double)a->hit / a->tok : 0;
	m.hit_blk = a->blk ? (double)a->hblk / a->blk : 0;
	m.p50 = median(a->p50, a->rounds) * 1e3;
	m.p99 = median(a->p99, a->rounds) * 1e3;
	m.secs = a->secs;
	m.rps = a->secs > 0 ? a->n / a->secs : 0;
	m.wait_tokens = (double)a->wt / rounds;
	m.hot_hit = a->hot_tok ? (double)a->hot_hit / a->hot_tok : 0;
	return m;
}

/* qa-big runs no `none` (it would prefill every 2,048-token prompt whole:
 * minutes) and no `kvcached-nowait` (at N = 1 it is `kvcached`); its first
 * tokens are checked against the first configuration that ran. */
static bool skip_config(int w, int cfg)
{
	return w == W_BIG && (cfg == C_NONE || cfg == C_NOWAIT);
}

/* ------------------------------------------------------------ rows */

static void rows_for(int w, int nprocs, const struct metrics *m)
{
	static const struct {
		const char *op, *unit;
		size_t off;
		bool vs_none;	/* a hit ratio against no cache says nothing */
	} ops[] = {
		{ "prefill_tokens", "tokens", offsetof(struct metrics, prefill), true },
		{ "ttft_p50", "ms", offsetof(struct metrics, p50), true },
		{ "ttft_p99", "ms", offsetof(struct metrics, p99), true },
		{ "requests_per_s", "req/s", offsetof(struct metrics, rps), true },
		{ "token_hit_ratio", "ratio", offsetof(struct metrics, hit_tok), false },
		{ "block_hit_ratio", "ratio", offsetof(struct metrics, hit_blk), false },
		{ "hot_hit_ratio", "ratio", offsetof(struct metrics, hot_hit), false },
	};
	size_t k;
	int c;

	for (k = 0; k < NELEM(ops); k++) {
		if (!strcmp(ops[k].op, "hot_hit_ratio") && w != W_SCAN)
			continue;
		for (c = C_NONE; c < C_N; c++) {
			struct row r = { .mode = "serve", .op = ops[k].op, .procs = nprocs,
					 .blocks = 0, .page_bytes = page_bytes, .unit = ops[k].unit,
					 .peer_kind = cfg_name[c], .workload = wl_name[w] };

			if (c == C_KVC || (c == C_NONE && !ops[k].vs_none) || skip_config(w, c))
				continue;
			r.kv = *(const double *)((const char *)&m[C_KVC] + ops[k].off);
			r.peer = *(const double *)((const char *)&m[c] + ops[k].off);
			add_row(&r);
		}
	}
}

/* Round r's ratio of configuration c to its peer p, for a figure. */
static double round_ratio(const double *kv, const double *peer, int r)
{
	return peer[r] > 0 ? kv[r] / peer[r] : 0;
}

/* "lo-hi" of n values. */
static void range_of(const double *v, int n, double *lo, double *hi)
{
	int i;

	*lo = *hi = n ? v[0] : 0;
	for (i = 1; i < n; i++) {
		*lo = v[i] < *lo ? v[i] : *lo;
		*hi = v[i] > *hi ? v[i] : *hi;
	}
}

/*
 * The spread behind a point's rows: kvcached against private and
 * private-tail round by round (prefill tokens, TTFT p99), each round's
 * steal, after the table and in the JSON ("serve_rounds"), so that a
 * figure is read with how much it moved and what the hypervisor took.
 */
static void spread_text(int w, int nprocs, const struct acc *a)
{
	static const int peers[] = { C_PRIVATE, C_PRIV_TAIL };
	double pre[MAX_ROUNDS], p99[MAX_ROUNDS], lo, hi, slo, shi;
	size_t k, at, line;
	int r, c, n = a[C_KVC].rounds;

	for (k = 0; k < NELEM(peers); k++) {
		const struct acc *pa = &a[peers[k]];

		if (skip_config(w, peers[k]) || pa->rounds != n)
			continue;
		for (r = 0; r < n; r++) {
			pre[r] = round_ratio(a[C_KVC].prefill, pa->prefill, r);
			p99[r] = round_ratio(a[C_KVC].p99, pa->p99, r);
		}
		at = line = strlen(mode_text);
		at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at,
				       "serve %s N=%d kvcached / %s by round: prefill", wl_name[w],
				       nprocs, cfg_name[peers[k]]);
		for (r = 0; r < n && at < sizeof(mode_text); r++)
			at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at, " %.3f",
					       pre[r]);
		at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at, ", TTFT p99");
		for (r = 0; r < n && at < sizeof(mode_text); r++)
			at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at, " %.3f",
					       p99[r]);
		range_of(a[C_KVC].steal, n, &slo, &shi);
		range_of(pa->steal, n, &lo, &hi);
		at += (size_t)snprintf(mode_text + at, sizeof(mode_text) - at,
				       "; steal %.1f-%.1f%% (kvcached), %.1f-%.1f%% (%s)\n", slo, shi,
				       lo, hi, cfg_name[peers[k]]);
		fputs(mode_text + line, stderr);
	}
	/* Every configuration's rounds, in the JSON. */
	for (c = C_NONE; c < C_N; c++) {
		const struct acc *x = &a[c];

		if (skip_config(w, c) || !x->rounds)
			continue;
		at = strlen(mode_json);
		at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at,
				       "%s{\"workload\":\"%s\",\"procs\":%d,\"config\":\"%s\"",
				       strstr(mode_json, "\"serve_rounds\":[{") ? "," : ",\"serve_rounds\":[",
				       wl_name[w], nprocs, cfg_name[c]);
		at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, ",\"prefill_tokens\":[");
		for (r = 0; r < x->rounds && at < sizeof(mode_json); r++)
			at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, "%s%.0f",
					       r ? "," : "", x->prefill[r]);
		at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, "],\"ttft_p99_ms\":[");
		for (r = 0; r < x->rounds && at < sizeof(mode_json); r++)
			at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, "%s%.2f",
					       r ? "," : "", x->p99[r] * 1e3);
		at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, "],\"ttft_p50_ms\":[");
		for (r = 0; r < x->rounds && at < sizeof(mode_json); r++)
			at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, "%s%.2f",
					       r ? "," : "", x->p50[r] * 1e3);
		at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, "],\"steal_pct\":[");
		for (r = 0; r < x->rounds && at < sizeof(mode_json); r++)
			at += (size_t)snprintf(mode_json + at, sizeof(mode_json) - at, "%s%.1f",
					       r ? "," : "", x->steal[r]);
		if (at < sizeof(mode_json))
			snprintf(mode_json + at, sizeof(mode_json) - at, "]}");
	}
}

static void describe(void)
{
	int n = 0, i;
	char procs[32] = "";

	for (i = 0; i < P->n_procs; i++)
		n += snprintf(procs + n, sizeof(procs) - n, "%s%d", i ? "," : "", P->procs[i]);
	snprintf(mode_json, sizeof(mode_json),
 ",\"serve\":{\"seed\":%llu,\"rounds\":%d,\"procs\":[%s],\"kv_memory_bytes\":%zu,"
		 "\"page_bytes\":%zu,\"model\":{\"layers\":%d,\"dim\":%d,\"hidden\":%d,"
		 "\"heads\":%d,\"kv_heads\":%d},\"private\":\"in-process LRU of 1/N of the memory per engine\","
		 "\"private-tail\":\"the same, a request's tail evicted first (vLLM)\","
		 "\"policies\":{\"kvcached\":\"%s\",\"kvcached-lru\":\"%s\",\"kvcached-clock\":\"%s\"},"
		 "\"watermarks\":[1,2],"
		 "\"qa\":{\"docs\":%d,\"doc_tokens\":%d,\"question_tokens\":%d,\"requests\":%d,"
		 "\"zipf\":%g,\"rate\":%g},\"chat\":{\"sessions\":%d,\"system_tokens\":%d,"
		 "\"turn_tokens\":%d,\"turns\":%d,\"rate\":%g},"
		 "\"scan\":{\"hot_docs\":%d,\"doc_tokens\":%d,\"scan_tokens\":%d,\"scan_share\":%g,"
		 "\"requests\":%d,\"rate\":%g},"
		 "\"qa-big\":{\"kv_memory_bytes\":%zu,\"docs\":%d,\"doc_tokens\":%d,\"requests\":%d,"
		 "\"zipf\":%g,\"rate\":%g}}",
		 (unsigned long long)P->seed, P->rounds, procs, P->mem, page_bytes, model_cfg.n_layers,
		 model_cfg.dim, model_cfg.hidden_dim, model_cfg.n_heads, model_cfg.n_kv_heads,
		 cfg_policy[C_KVC], cfg_policy[C_KVC_P1], cfg_policy[C_KVC_P2],
		 P->docs, P->doc_tokens, P->q_tokens, P->qa_requests, P->zipf, P->qa_rate,
		 P->sessions, P->sys_tokens, P->turn_tokens, P->turns, P->chat_rate,
		 P->scan_hot, P->doc_tokens, P->scan_tokens, P->scan_share, P->scan_requests,
		 P->scan_rate, P->big_mem, P->big_docs, P->big_doc_tokens, P->big_requests, P->big_zipf,
		 P->big_rate);
	snprintf(mode_text, sizeof(mode_text),
		 "\nserve: seeds %llu.. (traces per point: %d), %s engine processes; tinylm %d layers, width %d, MLP %d, "
		 "%d heads (%d KV), fp32, %zu KiB pages;\n"
		 "  KV memory %zu MiB in all: one kvcached pool, or %zu MiB / N per private cache;\n"
		 "  qa: %d documents x %d tokens, Zipf %.2f, %d requests of a document + a new %d-token "
		 "question, Poisson %.1f/s, random routing;\n"
		 "  chat: %d sessions x %d turns over a shared %d-token system prompt, %d-token "
		 "user turns and replies, Poisson %.1f/s, random routing;\n"
		 "  scan: %d hot documents x %d tokens, and a share %.2f of the %d requests a "
		 "one-off %d-token document, Poisson %.1f/s;\n"
		 "  qa-big (only when named; no none, no nowait): %zu MiB of KV, %d documents x %d "
		 "tokens, Zipf %.2f, %d requests, Poisson %.1f/s;\n"
		 "  private: naive LRU (head first); private-tail: tail first (vLLM); kvcached: "
		 "eviction %s, watermarks 1%% and 2%%; kvcached-lru, kvcached-clock: those policies.\n",
		 (unsigned long long)P->seed, P->rounds, procs, model_cfg.n_layers, model_cfg.dim,
		 model_cfg.hidden_dim, model_cfg.n_heads, model_cfg.n_kv_heads, page_bytes >> 10,
		 P->mem >> 20, P->mem >> 20, P->docs, P->doc_tokens, P->zipf, P->qa_requests,
		 P->q_tokens, P->qa_rate, P->sessions, P->turns, P->sys_tokens, P->turn_tokens,
		 P->chat_rate, P->scan_hot, P->doc_tokens, P->scan_share, P->scan_requests,
		 P->scan_tokens, P->scan_rate, P->big_mem >> 20, P->big_docs, P->big_doc_tokens,
		 P->big_zipf, P->big_requests, P->big_rate, cfg_policy[C_KVC]);
	fputs(mode_text + 1, stderr);
}

void mode_serve(void)
{
	static struct params cur;
	char err[256];
	int w, k, c;

	if (opt.socket) {
		fprintf(stderr, "kvbench: serve: skipped with --socket (it starts its own daemon "
				"per configuration, sized like the private caches)\n");
		return;
	}
	cur = opt.quick ? quick : full;
	if (ov.n_procs) {
		memcpy(cur.procs, ov.procs, sizeof(cur.procs));
		cur.n_procs = ov.n_procs;
	}
	if (ov.rounds)
		cur.rounds = ov.rounds;
	P = &cur;
	if (tlm_model_generate(&model, &model_cfg, TLM_DEMO_SEED, err, sizeof(err)))
		die("serve: model: %s", err);
	page_bytes = (size_t)BT * model.cfg.n_layers * 2 * model.kv_dim * sizeof(float);
	describe();
	for (w = 0; w < W_N; w++) {
		/* qa-big only when asked for: it takes minutes. */
		if (ov.workloads ? !(ov.workloads & (1u << w)) : w == W_BIG)
			continue;
		for (k = 0; k < P->n_procs; k++) {
			int nprocs = P->procs[k], r;
			struct acc a[C_N];
			struct metrics m[C_N];

			memset(a, 0, sizeof(a));
			for (r = 0; r < P->rounds; r++) {
				struct trace t;
				uint32_t *first;
				int j, ran;

				make_trace(&t, w, nprocs, r);
				first = xmalloc(t.n * sizeof(uint32_t));
				/* No cache first (the reference first tokens), then the
				 * others in an order that turns every round, so that
				 * none of them always runs at the same point of the
				 * machine's other load. */
				for (j = 0, ran = 0; j < C_N; j++) {
					int cc = j ? 1 + (j - 1 + r) % (C_N - 1) : C_NONE;
					uint64_t comp = a[cc].comp;
					double secs;

					if (skip_config(w, cc))
						continue;
					secs = run_config(&t, cc, nprocs, first, !ran++, &a[cc]);

					fprintf(stderr, "serve %-6s N=%d round %d %-15s %4d req in %6.1f s: "
						"prefill %8llu tokens\n", wl_name[w], nprocs, r,
						cfg_name[cc], t.n, secs,
						(unsigned long long)(a[cc].comp - comp));
				}
				free(first);
				free(t.rq);
			}
			for (c = 0; c < C_N; c++) {
				char hot[32];

				memset(&m[c], 0, sizeof(m[c]));
				if (skip_config(w, c))
					continue;
				m[c] = summarize(&a[c], P->rounds);
				snprintf(hot, sizeof(hot), " (hot %.3f)", m[c].hot_hit);
				fprintf(stderr,
					"serve %-6s N=%d %-15s prefill %8.0f tokens/round, hit %.3f tok "
					"%.3f blk%s, TTFT p50 %7.1f p99 %7.1f ms, %.2f req/s%s",
					wl_name[w], nprocs, cfg_name[c], m[c].prefill, m[c].hit_tok,
					m[c].hit_blk, w == W_SCAN ? hot : "", m[c].p50, m[c].p99,
					m[c].rps, c == C_KVC ? "" : "\n");
				if (c == C_KVC)
					fprintf(stderr, ", %.0f tokens/round by waiting\n",
						m[c].wait_tokens);
			}
			rows_for(w, nprocs, m);
			spread_text(w, nprocs, a);
		}
	}
	/* Close the rounds' list, if any point ran. */
	if (strstr(mode_json, "\"serve_rounds\":[{"))
		snprintf(mode_json + strlen(mode_json), sizeof(mode_json) - strlen(mode_json), "]");
	tlm_model_free(&model);
}
