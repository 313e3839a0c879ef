// SPDX-License-Identifier: MIT
/*
 * storm.c - the crash storm (issue #8): clients that look up, publish and
 * pin under eviction pressure are killed with SIGKILL at random moments,
 * and the daemon itself is killed with SIGKILL and restarted on the same
 * socket now and then. Afterwards nothing may be left behind and nothing
 * may ever have been wrong:
 *
 *  - during the storm, every page a lookup hit, every page pinned after a
 *    publish and every page a worker keeps pinned across requests holds
 *    exactly its block key's pattern (kvt_check). Workers count what they
 *    checked and every mismatch in a shared anonymous mapping made before
 *    any fork, so the observations of killed workers count too;
 *  - once every worker is gone, the final daemon shows no client attached,
 *    none lingering (every "attached" in its log has its "detached"), no
 *    pin (census: pins and pages_pinned 0) and no WRITING page; every page
 *    is FREE or READY, free + ready == n_pages, the free stack holds exactly
 *    the FREE pages, once each, and stats agree; every READY page is
 *    indexed under its own key, and is a block some worker wrote (key,
 *    parent and tokens of a known prompt block) with that block's bytes;
 *  - lookups of every prompt the workers used hit only pages whose bytes
 *    match; the daemon logged no error and no sanitizer report, and the
 *    last one shuts down cleanly.
 *
 * Short form by default (150 kills, 2 daemon restarts: a few seconds); the
 * long form runs with KVT_STORM_KILLS=N (`make storm STORM_KILLS=1000`),
 * one daemon restart per 200 kills. KVT_STORM_SEED replays a seed (the
 * parent's choices; the workers' timing is never the same), KVT_STORM_KEEP
 * keeps the daemons' log. Every wait is bounded; nothing asserts on timing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../../libclient/client_int.h"	/* pool base, for the READY sweep */
#include "../../libclient/observe.h"
#include "../../shm/index.h"
#include "../../shm/stats.h"

#define BT 16
#define FAMILIES 4		/* shared prefixes */
#define PREFIX_BLOCKS 6		/* blocks of a shared prefix */
#define NPROMPTS 128		/* prompt seeds: ~400 distinct blocks */
#define MAX_BLOCKS (PREFIX_BLOCKS + 6)
#define MAX_TOKENS (MAX_BLOCKS * BT + BT)
#define NWORKERS 5
#define MAX_HELD 2		/* requests a worker keeps pinned */

#define SHORT_KILLS 150
#define SHORT_RESTARTS 2
#define KILLS_PER_RESTART 200

/* Counters shared by every worker, live or killed (MAP_SHARED|ANON). */
struct shared {
	_Atomic uint64_t lookups;
	_Atomic uint64_t hit_blocks;
	_Atomic uint64_t publishes;		/* kvc_publish calls that succeeded */
	_Atomic uint64_t published_blocks;	/* blocks granted and published */
	_Atomic uint64_t allocs_short;		/* kvc_alloc granted fewer */
	_Atomic uint64_t unpublished;		/* granted pages given back */
	_Atomic uint64_t holds;			/* requests kept pinned */
	_Atomic uint64_t pages_checked;
	_Atomic uint64_t violations;
	_Atomic uint64_t opens;
	_Atomic uint64_t open_failures;		/* daemon down or restarting */
	_Atomic uint64_t dead_handles;		/* -ENOTCONN / -EPROTO / -EBADMSG */
	_Atomic uint64_t closes;		/* voluntary kvc_close + reopen */
	_Atomic uint64_t unexpected;		/* any other error */
	_Atomic int64_t last_unexpected;
	_Atomic int32_t first_violation_set;
	struct {
		int32_t pid, phase, prompt, block;
		int64_t page;
	} first_violation;
};

struct storm {
	struct kvt_daemon d;	/* dir, sock, log; pid of the current daemon */
	struct shared *sh;
	pid_t parent;
};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s * 0x2545f4914f6cdd1dull;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

/* Prompt p: the 6-block prefix of family p % FAMILIES, then 0..6 blocks of
 * its own. Tokens past the last full block (a partial tail) are its own. */
static size_t prompt_blocks(uint32_t p)
{
	return PREFIX_BLOCKS + p % 7;
}

static void prompt_tokens(uint32_t p, uint32_t *t, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		t[i] = (uint32_t)(mix(i < PREFIX_BLOCKS * BT ?
				      (p % FAMILIES + 1) * 1000003ull + i :
				      (p + 77) * 2654435761ull + i) % 32000);
}

/* ------------------------------------------------------------- workers */

struct held {
	struct kvc_req *r;
	struct kvc_key k[MAX_BLOCKS];
	uint32_t prompt;
	size_t n;
};

static void violation(struct shared *sh, int phase, uint32_t prompt, size_t block,
		      int64_t page)
{
	int32_t no = 0;

	atomic_fetch_add(&sh->violations, 1);
	if (atomic_compare_exchange_strong(&sh->first_violation_set, &no, 1)) {
		sh->first_violation.pid = (int32_t)getpid();
		sh->first_violation.phase = phase;
		sh->first_violation.prompt = (int32_t)prompt;
		sh->first_violation.block = (int32_t)block;
		sh->first_violation.page = page;
	}
}

/* Check block i of r against its key's pattern, if it has a page. */
static void check_block(struct shared *sh, kvc_t *c, struct kvc_req *r, size_t i,
			struct kvc_key k, uint32_t prompt, int phase)
{
	const void *b = kvc_block(r, i);

	if (!b)
		return;
	atomic_fetch_add_explicit(&sh->pages_checked, 1, memory_order_relaxed);
	if (!kvt_check(b, kvc_page_bytes(c), k))
		violation(sh, phase, prompt, i, kvc_block_page(r, i));
}

static void drop_held(struct held *h)
{
	int i;

	for (i = 0; i < MAX_HELD; i++) {
		kvc_req_free(h[i].r);
		h[i].r = NULL;
	}
}

/*
 * One request: look up a random prefix of a random prompt (checking every
 * hit), and mostly allocate, fill, publish and check; sometimes leave the
 * grant unpublished, sometimes keep the request pinned for later rounds.
 * Returns 0 or the error that ended it (the handle is then replaced).
 */
static int one_request(struct shared *sh, kvc_t *c, struct held *held, uint64_t *rs)
{
	uint32_t t[MAX_TOKENS], p = (uint32_t)(rnd(rs) % NPROMPTS);
	size_t nb = prompt_blocks(p), use = 1 + rnd(rs) % nb, n = use * BT + rnd(rs) % BT, i;
	struct kvc_key k[MAX_BLOCKS];
	struct kvc_req *r = NULL;
	int rc, hits, got = 0, mode = (int)(rnd(rs) % 16);

	prompt_tokens(p, t, n);
	rc = kvc_keys(c, t, n, NULL, 0, k, MAX_BLOCKS);
	if (rc < 0)
		return rc;
	rc = kvc_req_new(c, t, n, NULL, 0, &r);
	if (rc < 0)
		return rc;
	hits = kvc_lookup(r);
	if (hits < 0) {
		kvc_req_free(r);
		return hits;
	}
	atomic_fetch_add_explicit(&sh->lookups, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&sh->hit_blocks, (uint64_t)hits, memory_order_relaxed);
	for (i = 0; i < (size_t)hits; i++)
		check_block(sh, c, r, i, k[i], p, 1);
	/* mode 0..3: lookup only; 4: grant but never publish; else publish. */
	if (mode >= 4 && (size_t)hits < use) {
		got = kvc_alloc(r);
		if (got < 0) {
			kvc_req_free(r);
			return got;
		}
		if ((size_t)(hits + got) < use)
			atomic_fetch_add_explicit(&sh->allocs_short, 1, memory_order_relaxed);
		for (i = (size_t)hits; i < (size_t)(hits + got); i++)
			kvt_fill(kvc_block(r, i), kvc_page_bytes(c), k[i]);
		if (got && mode == 4) {
			atomic_fetch_add_explicit(&sh->unpublished, (uint64_t)got,
						  memory_order_relaxed);
			kvc_req_free(r);	/* FREE round trip; may find the daemon gone */
			return 0;
		}
		if (got) {
			rc = kvc_publish(r);
			if (rc < 0) {
				kvc_req_free(r);
				return rc;
			}
			atomic_fetch_add_explicit(&sh->publishes, 1, memory_order_relaxed);
			atomic_fetch_add_explicit(&sh->published_blocks, (uint64_t)got,
						  memory_order_relaxed);
			/* Ours or a winner's: every cached block has its bytes. */
			for (i = 0; i < use; i++)
				check_block(sh, c, r, i, k[i], p, 2);
		}
	}
	if (rnd(rs) % 4 == 0) {
		struct held *h = &held[rnd(rs) % MAX_HELD];

		kvc_req_free(h->r);
		h->r = r;
		memcpy(h->k, k, sizeof(k));
		h->prompt = p;
		h->n = use;
		atomic_fetch_add_explicit(&sh->holds, 1, memory_order_relaxed);
	} else {
		kvc_req_free(r);
	}
	return 0;
}

/* A pinned page never changes: re-check what we hold, every round. */
static void check_held(struct shared *sh, kvc_t *c, struct held *held)
{
	size_t i;
	int j;

	for (j = 0; j < MAX_HELD; j++)
		for (i = 0; held[j].r && i < held[j].n; i++)
			check_block(sh, c, held[j].r, i, held[j].k[i], held[j].prompt, 3);
}

/* Runs until killed. Never returns on its own (exits 0 only if orphaned). */
static int worker(void *arg)
{
	struct storm *s = arg;
	struct shared *sh = s->sh;
	struct held held[MAX_HELD];
	uint64_t rs = mix(now_ns() ^ ((uint64_t)getpid() << 32)) | 1;
	kvc_t *c = NULL;
	int rc;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != s->parent)
		return 0;
	memset(held, 0, sizeof(held));
	for (;;) {
		if (!c) {
			c = kvt_open(&s->d, NULL);
			if (!c) {
				atomic_fetch_add_explicit(&sh->open_failures, 1,
							  memory_order_relaxed);
				sleep_us(500);
				continue;
			}
			atomic_fetch_add_explicit(&sh->opens, 1, memory_order_relaxed);
		}
		rc = one_request(sh, c, held, &rs);
		check_held(sh, c, held);
		if (!rc && rnd(&rs) % 128)
			continue;
		if (!rc) {
			atomic_fetch_add_explicit(&sh->closes, 1, memory_order_relaxed);
		} else if (rc == -ENOTCONN || rc == -EPROTO || rc == -EBADMSG) {
			atomic_fetch_add_explicit(&sh->dead_handles, 1, memory_order_relaxed);
		} else {
			atomic_fetch_add(&sh->unexpected, 1);
			atomic_store(&sh->last_unexpected, rc);
		}
		/* Requests first: a kvc_req must not outlive its kvc_t. */
		drop_held(held);
		kvc_close(c);
		c = NULL;
	}
}

/* -------------------------------------------------------------- parent */

/* Reap pid within ms milliseconds: its wait status, or -1. */
static int reap(pid_t pid, int ms)
{
	int st, i;

	for (i = 0; i < ms * 10; i++) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		if (r == pid)
			return st;
		if (r < 0)
			return -1;
		sleep_us(100);
	}
	return -1;
}

static pid_t fork_worker(struct storm *s)
{
	return kvt_fork(worker, s);
}

/* kvcached on s->d.sock (the same path every time: a restarted daemon
 * replaces the stale socket), its log appended to s->d.log. */
static int daemon_start(struct storm *s)
{
	static const char *const extra[] = { "--log-level", "info", NULL };
	const char *argv[64];
	pid_t pid;
	int i, st;

	kvt_daemon_argv(s->d.sock, extra, argv, 64);
	pid = fork();
	if (pid < 0)
		return -1;
	if (!pid) {
		int fd = open(s->d.log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	s->d.pid = pid;
	for (i = 0; i < 1000; i++) {	/* up to 10 s */
		if (kvproto_can_connect(s->d.sock))
			return 0;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			s->d.pid = 0;
			return -1;
		}
		sleep_us(10000);
	}
	kill(pid, SIGKILL);
	reap(pid, 5000);
	s->d.pid = 0;
	return -1;
}

struct totals {
	uint64_t evictions, backoffs, reclaimed, publishes, dups, allocs, clients, alloc_short;
};

static uint64_t stat_of(const struct kvobs *o, size_t id)
{
	return atomic_load_explicit((_Atomic uint64_t *)kvshm_stats(o->h) + id,
				    memory_order_relaxed);
}

#define STAT(o, f) stat_of(o, KVSHM_STAT_ID(f))

/* Add what one daemon's life counted (read from its segment, which stays
 * mapped after the daemon is gone). */
static void add_totals(struct totals *t, const struct kvobs *o)
{
	if (!o->h)
		return;
	t->evictions += STAT(o, evictions);
	t->backoffs += STAT(o, evict_backoffs);
	t->reclaimed += STAT(o, reclaimed);
	t->publishes += STAT(o, publishes);
	t->dups += STAT(o, publish_dups);
	t->allocs += STAT(o, allocs);
	t->clients += STAT(o, clients_total);
	t->alloc_short += STAT(o, alloc_short);
}

static int observe(struct storm *s, struct kvobs *o)
{
	char err[256];
	int i;

	for (i = 0; i < 100; i++) {
		if (!kvobs_attach(s->d.sock, o, err, sizeof(err)))
			return 0;
		sleep_us(10000);
	}
	print_message("storm: cannot observe the daemon: %s\n", err);
	return -1;
}

/* SIGKILL the daemon mid-storm; -1 if it had died on its own. */
static int daemon_kill(struct storm *s)
{
	int st, rc = 0;

	if (waitpid(s->d.pid, &st, WNOHANG) == s->d.pid) {
		print_message("storm: daemon pid %d died on its own (status %#x)\n", s->d.pid, st);
		rc = -1;
	} else {
		kill(s->d.pid, SIGKILL);
		st = reap(s->d.pid, 5000);
		if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
			rc = -1;
	}
	s->d.pid = 0;
	return rc;
}

/* Count lines of the log that contain both a and b (b may be NULL). */
static unsigned log_count(const char *path, const char *a, const char *b)
{
	char line[2048];
	unsigned n = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, a) && (!b || strstr(line, b)))
			n++;
	fclose(f);
	return n;
}

/* Print lines of the log that contain a (at most 10). */
static void log_show(const char *path, const char *a)
{
	char line[2048];
	unsigned n = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return;
	while (n < 10 && fgets(line, sizeof(line), f))
		if (strstr(line, a)) {
			print_message("storm: log: %s", line);
			n++;
		}
	fclose(f);
}

/*
 * Bounded wait until the final daemon is quiet: nobody attached, no pin in
 * its census, nothing WRITING, and the free count and evictions unchanged
 * for 30 polls (150 ms, past the longest eviction back-off of 16 ticks), so
 * no tick is about to evict while the page table is checked.
 */
static bool wait_quiet(const struct kvobs *o, int ms)
{
	uint64_t last_free = UINT64_MAX, last_ev = UINT64_MAX;
	int i, same = 0;

	for (i = 0; i < ms / 5; i++) {
		uint64_t fr = STAT(o, pages_free), ev = STAT(o, evictions);

		same = fr == last_free && ev == last_ev ? same + 1 : 0;
		last_free = fr;
		last_ev = ev;
		if (!STAT(o, clients_attached) && !STAT(o, pins) && !STAT(o, pages_pinned) &&
		    !STAT(o, pages_writing) && same >= 30)
			return true;
		sleep_us(5000);
	}
	return false;
}

/* Every attached client of daemon `pid` detached (none lingers). */
static bool wait_all_detached(const char *log, pid_t pid, unsigned *att, unsigned *det)
{
	char tag[48];
	int i;

	snprintf(tag, sizeof(tag), "kvcached[%d]:", (int)pid);
	for (i = 0; i < 1000; i++) {
		*att = log_count(log, tag, " attached: pid ");
		*det = log_count(log, tag, " detached: pid ");
		if (*att == *det)
			return true;
		sleep_us(10000);
	}
	return false;
}

/* A block some prompt can contain: its key, parent and tokens. */
struct known {
	struct kvc_key key, parent;
	uint32_t tokens[BT];
};

static size_t known_blocks(kvc_t *c, struct known *kb, size_t max)
{
	size_t n = 0, i, j;
	uint32_t p;

	for (p = 0; p < NPROMPTS; p++) {
		uint32_t t[MAX_TOKENS];
		struct kvc_key k[MAX_BLOCKS];
		size_t nb = prompt_blocks(p);

		prompt_tokens(p, t, nb * BT);
		assert_int_equal(kvc_keys(c, t, nb * BT, NULL, 0, k, MAX_BLOCKS), (int)nb);
		for (i = 0; i < nb; i++) {
			for (j = 0; j < n; j++)
				if (kb[j].key.lo == k[i].lo && kb[j].key.hi == k[i].hi)
					break;
			if (j < n)
				continue;	/* a shared prefix block */
			assert_true(n < max);
			kb[n].key = k[i];
			kb[n].parent = i ? k[i - 1] : (struct kvc_key){ c->root.lo, c->root.hi };
			memcpy(kb[n].tokens, t + i * BT, sizeof(kb[n].tokens));
			n++;
		}
	}
	return n;
}

static const struct known *find_known(const struct known *kb, size_t n, struct kvshm_key k)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (kb[i].key.lo == k.lo && kb[i].key.hi == k.hi)
			return &kb[i];
	return NULL;
}

/*
 * The final daemon's page table, read-only through the observer, and the
 * bytes of every READY page. Returns the READY pages whose bytes were
 * checked.
 */
static uint64_t check_pages(const struct kvobs *o, kvc_t *c)
{
	const struct kvshm_header *h = o->h;
	const struct kvshm_page *pg = kvshm_pages(h);
	const struct kvshm_free *fr = kvshm_free(h);
	uint32_t n = h->geo.n_pages, p, i, cnt[8] = { 0 }, foreign = 0, unindexed = 0;
	uint32_t wrong_identity = 0, wrong_bytes = 0, moved = 0;
	static struct known kb[NPROMPTS * MAX_BLOCKS];
	size_t nk = known_blocks(c, kb, NPROMPTS * MAX_BLOCKS);
	uint8_t *on_stack = calloc(n, 1);
	uint64_t checked = 0;

	assert_non_null(on_stack);
	for (p = 0; p < n; p++) {
		uint32_t st = atomic_load(&pg[p].state);

		cnt[st < 8 ? st : 7]++;
	}
	print_message("storm: final pages: %u free, %u ready, %u writing, %u evicting, %u other\n",
		      cnt[KVSHM_PAGE_FREE], cnt[KVSHM_PAGE_READY], cnt[KVSHM_PAGE_WRITING],
		      cnt[KVSHM_PAGE_EVICTING], n - cnt[0] - cnt[1] - cnt[2] - cnt[3]);
	/* No spill tier yet: FREE or READY, nothing else. */
	assert_int_equal(cnt[KVSHM_PAGE_FREE] + cnt[KVSHM_PAGE_READY], n);
	assert_int_equal(cnt[KVSHM_PAGE_FREE], STAT(o, pages_free));
	assert_int_equal(cnt[KVSHM_PAGE_READY], STAT(o, pages_ready));
	assert_int_equal(STAT(o, pages_writing), 0);
	assert_int_equal(STAT(o, index_entries), cnt[KVSHM_PAGE_READY]);
	/* The free stack holds exactly the FREE pages, each once. */
	assert_int_equal(fr->count, cnt[KVSHM_PAGE_FREE]);
	for (i = 0; i < fr->count; i++) {
		p = fr->page[i];
		assert_true(p < n);
		assert_false(on_stack[p]);
		on_stack[p] = 1;
		assert_int_equal(atomic_load(&pg[p].state), KVSHM_PAGE_FREE);
	}
	free(on_stack);

	for (p = 0; p < n; p++) {
		struct kvshm_key key;
		const struct known *k;
		uint32_t gen = atomic_load(&pg[p].gen);

		if (atomic_load(&pg[p].state) != KVSHM_PAGE_READY)
			continue;
		key = pg[p].key;
		if (kvshm_index_find(h, key) != p)
			unindexed++;
		k = find_known(kb, nk, key);
		if (!k) {
			foreign++;
			continue;
		}
		if (pg[p].parent.lo != k->parent.lo || pg[p].parent.hi != k->parent.hi ||
		    memcmp(kvshm_tokens(h, p), k->tokens, sizeof(k->tokens)) ||
		    pg[p].ns_id != c->ns_id)
			wrong_identity++;
		/* The bytes, through the pool mapping of the verifier handle
		 * (no public call reads a page whose parent was evicted). */
		if (!kvt_check(c->pool + (uint64_t)p * c->slot_bytes, c->page_bytes, k->key))
			wrong_bytes++;
		if (atomic_load(&pg[p].state) != KVSHM_PAGE_READY || atomic_load(&pg[p].gen) != gen)
			moved++;	/* evicted meanwhile: not a verdict */
		else
			checked++;
	}
	if (foreign || unindexed || wrong_identity || wrong_bytes)
		print_message("storm: READY pages: %u foreign, %u not indexed under their key, %u wrong identity, %u wrong bytes (%u moved)\n",
			      foreign, unindexed, wrong_identity, wrong_bytes, moved);
	assert_int_equal(foreign, 0);
	assert_int_equal(unindexed, 0);
	assert_int_equal(wrong_identity, 0);
	if (!moved)
		assert_int_equal(wrong_bytes, 0);
	return checked;
}

/* Look up every prompt in full, checking every hit page. */
static uint64_t check_lookups(kvc_t *c, uint64_t *bad)
{
	uint64_t checked = 0;
	uint32_t p;

	for (p = 0; p < NPROMPTS; p++) {
		uint32_t t[MAX_TOKENS];
		struct kvc_key k[MAX_BLOCKS];
		size_t nb = prompt_blocks(p), i;
		struct kvc_req *r;
		int hits;

		prompt_tokens(p, t, nb * BT);
		assert_int_equal(kvc_keys(c, t, nb * BT, NULL, 0, k, MAX_BLOCKS), (int)nb);
		assert_int_equal(kvc_req_new(c, t, nb * BT, NULL, 0, &r), 0);
		hits = kvc_lookup(r);
		assert_true(hits >= 0);
		for (i = 0; i < (size_t)hits; i++) {
			checked++;
			if (!kvt_check(kvc_block(r, i), kvc_page_bytes(c), k[i]))
				(*bad)++;
		}
		kvc_req_free(r);
	}
	return checked;
}

static void test_crash_storm(void **state)
{
	const char *env = getenv("KVT_STORM_KILLS"), *senv = getenv("KVT_STORM_SEED");
	unsigned kills = SHORT_KILLS, restarts = SHORT_RESTARTS, k, next_restart = 0, r = 0;
	unsigned worker_failures = 0, daemon_failures = 0, att = 0, det = 0;
	uint64_t seed, rs, t0 = now_ns(), lookup_checked, ready_checked, final_bad = 0;
	struct totals tot = { 0 };
	struct storm s;
	struct kvobs o = { 0 };
	struct shared *sh;
	pid_t w[NWORKERS];
	kvc_t *c;
	int i, st;

	(void)state;
	if (env && *env) {
		kills = (unsigned)strtoul(env, NULL, 10);
		if (!kills)
			kills = 1000;
		restarts = kills / KILLS_PER_RESTART ? kills / KILLS_PER_RESTART : 1;
	}
	seed = senv && *senv ? strtoull(senv, NULL, 0) : (now_ns() ^ (uint64_t)getpid());
	rs = mix(seed) | 1;
	print_message("storm: %u kills, %u daemon restarts, %d workers, seed %#" PRIx64 "\n",
		      kills, restarts, NWORKERS, seed);

	memset(&s, 0, sizeof(s));
	s.parent = getpid();
	snprintf(s.d.dir, sizeof(s.d.dir), "/tmp/kvt-storm.XXXXXX");
	assert_non_null(mkdtemp(s.d.dir));
	chmod(s.d.dir, 0755);
	snprintf(s.d.sock, sizeof(s.d.sock), "%s/kvcached.sock", s.d.dir);
	snprintf(s.d.log, sizeof(s.d.log), "%s/kvcached.log", s.d.dir);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(sh != MAP_FAILED);
	memset(sh, 0, sizeof(*sh));
	s.sh = sh;
	/* Removed when the test passes; a failed run leaves it to read. */
	print_message("storm: daemon log %s\n", s.d.log);

	assert_int_equal(daemon_start(&s), 0);
	assert_int_equal(observe(&s, &o), 0);
	for (i = 0; i < NWORKERS; i++) {
		w[i] = fork_worker(&s);
		assert_true(w[i] > 0);
	}
	next_restart = kills / (restarts + 1);
	for (k = 0; k < kills; k++) {
		sleep_us((long)(rnd(&rs) % 31) * 1000);
		if (r < restarts && k == next_restart) {
			/* The daemon dies with everything in flight; its
			 * clients find out at their next round trip. */
			add_totals(&tot, &o);
			kvobs_detach(&o);
			daemon_failures += daemon_kill(&s) != 0;
			sleep_us((long)(rnd(&rs) % 20) * 1000);
			assert_int_equal(daemon_start(&s), 0);
			assert_int_equal(observe(&s, &o), 0);
			r++;
			next_restart = (unsigned)((uint64_t)kills * (r + 1) / (restarts + 1));
		}
		i = (int)(rnd(&rs) % NWORKERS);
		kill(w[i], SIGKILL);
		st = reap(w[i], 5000);
		if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
			print_message("storm: worker %d ended with status %#x, not by SIGKILL\n",
				      (int)w[i], st);
			worker_failures++;
		}
		w[i] = fork_worker(&s);
		assert_true(w[i] > 0);
	}
	for (i = 0; i < NWORKERS; i++) {
		kill(w[i], SIGKILL);
		st = reap(w[i], 5000);
		if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
			worker_failures++;
	}
	/* The last daemon must have lived through its share of the storm. */
	assert_int_equal(waitpid(s.d.pid, &st, WNOHANG), 0);

	/* Quiet: nobody attached or lingering, no pin, nothing WRITING. */
	if (!wait_quiet(&o, 10000))
		print_message("storm: not quiet: attached %" PRIu64 " pins %" PRIu64
			      " pinned %" PRIu64 " writing %" PRIu64 "\n",
			      STAT(&o, clients_attached), STAT(&o, pins), STAT(&o, pages_pinned),
			      STAT(&o, pages_writing));
	assert_int_equal(STAT(&o, clients_attached), 0);
	assert_int_equal(STAT(&o, pins), 0);
	assert_int_equal(STAT(&o, pages_pinned), 0);
	assert_int_equal(STAT(&o, pages_writing), 0);
	if (!wait_all_detached(s.d.log, s.d.pid, &att, &det))
		print_message("storm: %u clients attached, %u detached\n", att, det);
	assert_int_equal(att, det);

	/* The page table, then the bytes, through one verifier client. */
	c = kvt_open(&s.d, NULL);
	assert_non_null(c);
	ready_checked = check_pages(&o, c);
	lookup_checked = check_lookups(c, &final_bad);
	kvc_close(c);
	assert_true(wait_quiet(&o, 10000));
	assert_int_equal(STAT(&o, pages_free) + STAT(&o, pages_ready), o.h->geo.n_pages);
	add_totals(&tot, &o);

	/* A clean stop, and a log free of errors and sanitizer reports. */
	assert_int_equal(kvt_daemon_stop(&s.d), 0);
	kvobs_detach(&o);
	log_show(s.d.log, "]: error: ");
	log_show(s.d.log, "Sanitizer");
	log_show(s.d.log, "runtime error");
	assert_int_equal(log_count(s.d.log, "]: error: ", NULL), 0);
	assert_int_equal(log_count(s.d.log, "Sanitizer", NULL), 0);
	assert_int_equal(log_count(s.d.log, "runtime error", NULL), 0);

	print_message("storm: kills=%u daemon_restarts=%u lookups=%" PRIu64 " publishes=%" PRIu64
		      " pages_checked=%" PRIu64 " violations=%" PRIu64 "\n",
		      kills, r, atomic_load(&sh->lookups), atomic_load(&sh->publishes),
		      atomic_load(&sh->pages_checked) + lookup_checked + ready_checked,
		      atomic_load(&sh->violations) + final_bad);
	print_message("storm: detail: hit_blocks=%" PRIu64 " published_blocks=%" PRIu64
		      " alloc_short=%" PRIu64 " unpublished=%" PRIu64 " holds=%" PRIu64
		      " opens=%" PRIu64
		      " open_failures=%" PRIu64 " dead_handles=%" PRIu64 " closes=%" PRIu64
		      " unexpected=%" PRIu64 " final: lookup_pages=%" PRIu64 " ready_pages=%" PRIu64
		      " daemons: clients=%" PRIu64 " allocs=%" PRIu64 " publishes=%" PRIu64
		      " dups=%" PRIu64 " evictions=%" PRIu64 " backoffs=%" PRIu64
		      " reclaimed=%" PRIu64 " wall=%.1fs\n",
		      atomic_load(&sh->hit_blocks), atomic_load(&sh->published_blocks),
		      atomic_load(&sh->allocs_short), atomic_load(&sh->unpublished),
		      atomic_load(&sh->holds),
		      atomic_load(&sh->opens), atomic_load(&sh->open_failures),
		      atomic_load(&sh->dead_handles), atomic_load(&sh->closes),
		      atomic_load(&sh->unexpected), lookup_checked, ready_checked, tot.clients,
		      tot.allocs, tot.publishes, tot.dups, tot.evictions, tot.backoffs,
		      tot.reclaimed, (double)(now_ns() - t0) / 1e9);
	if (atomic_load(&sh->first_violation_set))
		print_message("storm: first violation: pid %d phase %d (1 hit, 2 after publish, 3 held pin) prompt %d block %d page %" PRId64 "\n",
			      sh->first_violation.pid, sh->first_violation.phase,
			      sh->first_violation.prompt, sh->first_violation.block,
			      sh->first_violation.page);
	if (atomic_load(&sh->unexpected))
		print_message("storm: last unexpected error: %s\n",
			      kvc_strerror((int)atomic_load(&sh->last_unexpected)));

	assert_int_equal(atomic_load(&sh->violations), 0);
	assert_int_equal(final_bad, 0);
	assert_int_equal(atomic_load(&sh->unexpected), 0);
	assert_int_equal(worker_failures, 0);
	assert_int_equal(daemon_failures, 0);
	assert_int_equal(r, restarts);
	/* The storm did what it is for: requests ran and checked pages. */
	assert_true(atomic_load(&sh->publishes) > 0);
	assert_true(atomic_load(&sh->pages_checked) > 0);

	munmap(sh, sizeof(*sh));
	if (getenv("KVT_STORM_KEEP")) {	/* keep the daemons' log to read */
		print_message("storm: log kept: %s\n", s.d.log);
		return;
	}
	unlink(s.d.log);
	unlink(s.d.sock);
	rmdir(s.d.dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crash_storm),
	};

	return cmocka_run_group_tests_name("integration/storm", tests, NULL, NULL);
}
