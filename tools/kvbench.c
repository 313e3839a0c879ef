// SPDX-License-Identifier: MIT
/*
 * kvbench.c - kvcached's benchmark: every figure next to its peer, measured
 * in the same run on the same machine, and printed as a ratio.
 *
 * What is timed (CLOCK_MONOTONIC):
 *
 *   lookup       kvc_lookup() alone on a request prepared beforehand
 *                (kvc_req_new before, kvc_req_free after, both untimed):
 *                index probe, parent-key and token verification, pin.
 *   hash_lookup  kvc_req_new + kvc_lookup + kvc_req_free: what a serving
 *                process pays per prompt (XXH3 key chain, token copy,
 *                lookup, unpin; no system call on either end).
 *   latency      one clock_gettime pair around each kvc_lookup of a
 *                256-block prefix; samples sorted, nearest-rank p50, p90,
 *                p99, p999. Includes one clock read (printed separately).
 *   publish      per request of N blocks: kvc_req_new, kvc_lookup (a miss),
 *                kvc_alloc (one round trip), memcpy of a page into each
 *                granted pool page, kvc_publish (one round trip),
 *                kvc_req_free. Reported in blocks/s and GB/s (1e9 bytes) of
 *                page bytes written and published.
 *
 * Lookup figures are verified blocks per second: the prefixes (1, 4, 16, 64
 * and 256 blocks of 16 tokens) are published once, then every lookup must
 * hit the whole prefix or the run fails. They run in 1 and 2 forked client
 * processes, each with its own kvc_t (and its own peer table); the figure
 * is the sum over processes.
 *
 * The peers:
 *   - lookup, hash_lookup, latency: a plain in-process open-addressing hash
 *     table (linear probing, 128-byte entries) holding the same 128-bit
 *     keys, probed from the same bits of the key, with the same check per
 *     block: stored parent key equals the previous block's key and memcmp
 *     of the 16 stored tokens. No pins, no shared memory, no seqcounts. For
 *     hash_lookup the peer hashes with kvc_keys() (the same XXH3 chain,
 *     into a caller buffer), so the ratio shows everything but the hash.
 *   - publish: plain single-core memcpy of the same page bytes from the
 *     same source page into a shared-memory (memfd, MAP_SHARED, pre-faulted)
 *     ring larger than the last-level cache, like the pool it stands for.
 *
 * Each row runs its kvcached side and its peer side in alternating slices
 * (10 rounds each, --seconds split evenly), aligned to absolute deadlines
 * so that two processes slice together; the figure is the median over
 * rounds of the per-slice rate, which keeps a noisy neighbour or a
 * frequency change from favouring one side. Work inside a slice runs in
 * batches (up to 4096 pinned blocks), timed as a whole, so clock reads do
 * not weigh on short lookups.
 *
 * Unless --socket names a running daemon, kvbench starts kvcached itself
 * (the binary next to its own, or --daemon PATH) on a private socket in a
 * private folder, twice: 4 KiB pages and a 4 MiB pool for lookups (1 layer,
 * 2 kv heads, head dim 32, 2-byte dtype, 16 tokens), then 2 MiB pages and a
 * 256 MiB pool for publish (Llama-3-8B geometry: 32 layers, 8 kv heads,
 * head dim 128, bf16, 16 tokens). The publish pool is written once through
 * before timing so first-touch page faults are not counted; the requests
 * after that run in steady state, the daemon evicting to make room. Model
 * names carry kvbench's pid so nothing from another run or tenant is hit.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../libclient/kvclient.h"

#define BT		16	/* tokens per block */
#define ROUNDS		10	/* slices per side and row */
#define MAX_KINDS	4
#define PIN_BUDGET	4096	/* pins one lookup batch may hold at once */
#define MAX_BATCH	256	/* requests per lookup batch */
#define LAT_BLOCKS	256	/* prefix of the latency measurement */
#define LAT_CAP		(1u << 20)	/* samples kept per side */
#define MAX_ROWS	64

static const size_t lookup_sizes[] = { 1, 4, 16, 64, 256 };
static const size_t pub_sizes[] = { 1, 4, 16 };		/* 2 MiB pages */
static const size_t small_pub_sizes[] = { 1, 16, 256 };	/* 4 KiB pages */
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static struct {
	double seconds;
	bool quick;
	bool json;
	const char *daemon;
	const char *socket;
} opt = { .seconds = 1.0 };

/* The daemon kvbench started (pid 0: none) and its private folder. */
static struct {
	pid_t pid;
	char dir[64];
	char sock[108];
	char log[128];
	char path[4096];
} dmn;

static pid_t main_pid;
static volatile uint64_t sink;

struct row {
	const char *mode;	/* lookup, hash_lookup, latency, publish */
	int procs;
	size_t blocks;
	size_t page_bytes;
	const char *pct;	/* latency percentile, else NULL */
	const char *unit;	/* blocks/s, ns, GB/s */
	const char *peer_kind;	/* hashtable, memcpy */
	double kv, peer;
};

static struct row rows[MAX_ROWS];
static int nrows;

/* ---------------------------------------------------------------- util */

static void print_log_tail(void)
{
	char buf[2048];
	FILE *f;
	long sz;
	size_t n;

	if (!dmn.log[0] || !(f = fopen(dmn.log, "r")))
		return;
	fseek(f, 0, SEEK_END);
	sz = ftell(f);
	fseek(f, sz > (long)sizeof(buf) - 1 ? sz - (long)sizeof(buf) + 1 : 0, SEEK_SET);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	if (n)
		fprintf(stderr, "kvbench: kvcached log (%s), last lines:\n%s%s", dmn.log, buf,
			buf[n - 1] == '\n' ? "" : "\n");
}

static void stop_daemon(bool quiet);

static void cleanup(void)
{
	if (dmn.pid > 0)
		stop_daemon(true);
	if (dmn.dir[0]) {
		rmdir(dmn.dir);
		dmn.dir[0] = 0;
	}
}

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	fputs("kvbench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (getpid() != main_pid)
		_exit(1);	/* a worker: the parent reports and cleans up */
	if (dmn.pid > 0)
		print_log_tail();
	cleanup();
	exit(1);
}

/* A kvc_ call's return: die with what failed unless it is >= 0. */
static int ck(int rc, const char *what)
{
	if (rc < 0)
		die("%s failed: %s (%d)", what, kvc_strerror(rc), rc);
	return rc;
}

static void *xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Token ids of one prompt; different seeds share no block. */
static void make_tokens(uint32_t *t, size_t n, uint64_t seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		t[i] = (uint32_t)(mix64(seed * 0x100000001b3ull + i) % 128256);
}

static void fill_page(void *page, size_t bytes, struct kvc_key k)
{
	uint64_t *p = page;
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		p[i] = mix64(k.lo ^ (k.hi + i));
}

static bool check_page(const void *page, size_t bytes, struct kvc_key k)
{
	const uint64_t *p = page;
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		if (p[i] != mix64(k.lo ^ (k.hi + i)))
			return false;
	return true;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted samples. */
static uint32_t pctl(const uint32_t *s, size_t n, double p)
{
	size_t k = (size_t)ceil(p * (double)n);

	if (!n)
		return 0;
	return s[k ? (k > n ? n : k) - 1 : 0];
}

static void add_row(const char *mode, int procs, size_t blocks, size_t page_bytes,
		    const char *pct, const char *unit, const char *peer_kind,
		    double kv, double peer)
{
	if (nrows == MAX_ROWS)
		die("internal: too many result rows");
	rows[nrows++] = (struct row){ mode, procs, blocks, page_bytes, pct, unit,
				      peer_kind, kv, peer };
}

/* ------------------------------------------------------------ daemon */

static bool can_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ok = fd >= 0 && !connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	if (fd >= 0)
		close(fd);
	return ok;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* The kvcached binary: --daemon, else the one next to this executable. */
static void find_daemon(void)
{
	char exe[4096], *slash;
	ssize_t n;

	if (opt.daemon) {
		snprintf(dmn.path, sizeof(dmn.path), "%s", opt.daemon);
	} else {
		n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		if (n <= 0)
			die("cannot read /proc/self/exe (%s); name the daemon with --daemon PATH",
			    strerror(errno));
		exe[n] = 0;
		slash = strrchr(exe, '/');
		if (slash)
			*slash = 0;
		if (strlen(exe) + sizeof("/kvcached") > sizeof(dmn.path))
			die("path of kvbench too long");
		snprintf(dmn.path, sizeof(dmn.path), "%s/kvcached", exe);
	}
	if (access(dmn.path, X_OK))
		die("no kvcached executable at %s (%s); build it (make) or pass --daemon PATH, or bench a running daemon with --socket PATH",
		    dmn.path, strerror(errno));
}

static void start_daemon(const char *name, const char *page_size, const char *pool_size)
{
	const char *argv[] = { dmn.path, "--socket", dmn.sock, "--page-size", page_size,
			       "--pool-size", pool_size, "--hugepages", "off", NULL };
	int i, st, fd;

	if (!dmn.dir[0]) {
		snprintf(dmn.dir, sizeof(dmn.dir), "/tmp/kvbench.XXXXXX");
		if (!mkdtemp(dmn.dir)) {
			dmn.dir[0] = 0;
			die("mkdtemp /tmp/kvbench.XXXXXX: %s", strerror(errno));
		}
	}
	snprintf(dmn.sock, sizeof(dmn.sock), "%s/%s.sock", dmn.dir, name);
	snprintf(dmn.log, sizeof(dmn.log), "%s/%s.log", dmn.dir, name);
	fflush(stdout);
	fflush(stderr);
	dmn.pid = fork();
	if (dmn.pid < 0) {
		dmn.pid = 0;
		die("fork: %s", strerror(errno));
	}
	if (!dmn.pid) {
		/* Never outlive kvbench, whatever happens to it. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != main_pid)
			_exit(127);
		fd = open(dmn.log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (fd >= 0)
			dup2(fd, 0);
		execv(dmn.path, (char **)argv);
		fprintf(stderr, "exec %s: %s\n", dmn.path, strerror(errno));
		_exit(127);
	}
	for (i = 0; i < 1000; i++) {	/* up to 10 s */
		if (can_connect(dmn.sock))
			return;
		if (waitpid(dmn.pid, &st, WNOHANG) == dmn.pid) {
			dmn.pid = 0;
			print_log_tail();
			die("kvcached (%s --page-size %s --pool-size %s) exited at start with status %d",
			    dmn.path, page_size, pool_size,
			    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		}
		sleep_ms(10);
	}
	die("kvcached did not accept connections on %s within 10 s", dmn.sock);
}

/* SIGTERM, wait (SIGKILL after 5 s), remove its files. */
static void stop_daemon(bool quiet)
{
	int i, st = 0;
	pid_t w = 0;

	if (dmn.pid <= 0)
		return;
	kill(dmn.pid, SIGTERM);
	for (i = 0; i < 500; i++) {
		w = waitpid(dmn.pid, &st, WNOHANG);
		if (w == dmn.pid || (w < 0 && errno != EINTR))
			break;
		sleep_ms(10);
	}
	if (w != dmn.pid) {
		kill(dmn.pid, SIGKILL);
		waitpid(dmn.pid, &st, 0);
		if (!quiet)
			fprintf(stderr, "kvbench: kvcached ignored SIGTERM for 5 s; killed it\n");
	} else if (!quiet && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
		fprintf(stderr, "kvbench: warning: kvcached exited with %s %d\n",
			WIFEXITED(st) ? "status" : "signal",
			WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		print_log_tail();
	}
	dmn.pid = 0;
	unlink(dmn.sock);
	unlink(dmn.log);
	dmn.log[0] = 0;
}

static void on_signal(int sig)
{
	/* Async-signal-safe calls only. */
	if (getpid() == main_pid) {
		if (dmn.pid > 0)
			kill(dmn.pid, SIGTERM);
		if (dmn.sock[0])
			unlink(dmn.sock);
		if (dmn.log[0])
			unlink(dmn.log);
		if (dmn.dir[0])
			rmdir(dmn.dir);
	}
	_exit(128 + sig);
}

/* ------------------------------------------------------------ models */

static char lookup_name[64], pub_name[64];

static struct kvc_model tiny_model(void)
{
	struct kvc_model m = {
		.size = sizeof(m), .name = lookup_name, .dtype_bytes = 2, .layers = 1,
		.kv_heads = 2, .head_dim = 32, .block_tokens = BT, .pos_kind = KVC_POS_ROPE,
	};
	return m;
}

/* Llama-3-8B-like: 16 x layers x 2 x 8 x 128 x 2 bytes = layers x 64 KiB. */
static struct kvc_model big_model(uint32_t layers)
{
	struct kvc_model m = {
		.size = sizeof(m), .name = pub_name, .dtype_bytes = 2, .layers = layers,
		.kv_heads = 8, .head_dim = 128, .block_tokens = BT, .pos_kind = KVC_POS_ROPE,
	};
	return m;
}

static int try_open(const char *sock, const struct kvc_model *m, kvc_t **c, char *err,
		    size_t errlen)
{
	struct kvc_options o = { .size = sizeof(o), .socket_path = sock, .errbuf = err,
				 .errbuf_len = errlen };

	return kvc_open(m, &o, c);
}

static kvc_t *open_model(const char *sock, const struct kvc_model *m)
{
	char err[256] = "";
	kvc_t *c = NULL;
	int rc = try_open(sock, m, &c, err, sizeof(err));

	if (rc)
		die("kvc_open(%s, %u layers) on %s failed: %s%s%s%s", m->name, m->layers, sock,
		    kvc_strerror(rc), *err ? " (" : "", err, *err ? ")" : "");
	if (kvc_block_tokens(c) != BT)
		die("daemon uses %zu-token blocks; kvbench needs %d", kvc_block_tokens(c), BT);
	return c;
}

/* --------------------------------------------------------- peer table */

struct peer_ent {
	struct kvc_key key;
	struct kvc_key parent;
	uint32_t tokens[BT];
	uint32_t page;		/* page + 1; 0: empty */
	uint32_t pad[7];
};
_Static_assert(sizeof(struct peer_ent) == 128, "peer entry: two cache lines");

struct peer {
	struct peer_ent *e;
	uint32_t mask;
};

static void peer_init(struct peer *p, uint32_t cap)
{
	void *m = NULL;

	if (posix_memalign(&m, 64, (size_t)cap * sizeof(*p->e)))
		die("out of memory (peer table)");
	memset(m, 0, (size_t)cap * sizeof(*p->e));
	p->e = m;
	p->mask = cap - 1;
}

static void peer_insert(struct peer *p, struct kvc_key k, struct kvc_key parent,
			const uint32_t *tokens, uint32_t page)
{
	uint32_t i = (uint32_t)(k.hi >> 32) & p->mask, n;

	for (n = 0; p->e[i].page; n++, i = (i + 1) & p->mask) {
		if (n > p->mask)
			die("internal: peer table full");
		if (p->e[i].key.lo == k.lo && p->e[i].key.hi == k.hi)
			return;
	}
	p->e[i].key = k;
	p->e[i].parent = parent;
	memcpy(p->e[i].tokens, tokens, sizeof(p->e[i].tokens));
	p->e[i].page = page + 1;
}

static inline const struct peer_ent *peer_find(const struct peer *p, struct kvc_key k)
{
	uint32_t i = (uint32_t)(k.hi >> 32) & p->mask;

	for (;;) {
		const struct peer_ent *e = &p->e[i];

		if (!e->page)
			return NULL;
		if (e->key.lo == k.lo && e->key.hi == k.hi)
			return e;
		i = (i + 1) & p->mask;
	}
}

/* Longest verified prefix, pages[] filled: the peer of kvc_lookup. */
static __attribute__((noinline)) size_t
peer_lookup(const struct peer *p, const struct kvc_key *keys, const uint32_t *tokens,
	    size_t n, uint32_t *pages)
{
	struct kvc_key parent = { 0, 0 };
	size_t i;

	for (i = 0; i < n; i++) {
		const struct peer_ent *e = peer_find(p, keys[i]);

		if (!e || e->parent.lo != parent.lo || e->parent.hi != parent.hi ||
		    memcmp(e->tokens, tokens + i * BT, sizeof(e->tokens)))
			break;
		pages[i] = e->page - 1;
		parent = keys[i];
	}
	return i;
}

/* ------------------------------------------------------ lookup workers */

enum { K_LOOKUP, K_PEER_LOOKUP, K_HASH, K_PEER_HASH };

struct session {
	const char *sock;
	size_t blocks;		/* prefix length */
	bool latency;		/* per-call samples, kinds K_LOOKUP, K_PEER_LOOKUP */
	int nkinds;
	uint64_t slice_ns;
};

struct wres {
	uint64_t ops[ROUNDS][MAX_KINDS];
	uint64_t ns[ROUNDS][MAX_KINDS];
	uint32_t lat[2][4];	/* p50 p90 p99 p999: kvcached, peer */
	uint64_t nlat[2];
};
_Static_assert(sizeof(struct wres) <= 4096, "a worker reports in one pipe write");

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
	size_t n, ntok, batch;
	uint32_t *tokens, *pages;
	struct kvc_key *keys, *kbuf;
	struct kvc_req **reqs;
	int *hits;
	uint32_t *lat[2];
	size_t nlat[2];
};

/* One batch of kind k; returns timed ns, adds verified blocks to *ops. */
static uint64_t run_batch(struct wstate *w, const struct session *s, int k, uint64_t *ops)
{
	size_t b, n = w->n, B = w->batch;
	uint64_t t0, t1, acc = 0;
	int h;

	switch (k) {
	case K_LOOKUP:
		for (b = 0; b < B; b++)
			ck(kvc_req_new(w->c, w->tokens, w->ntok, NULL, 0, &w->reqs[b]),
			   "kvc_req_new");
		if (s->latency) {
			t1 = 0;
			for (b = 0; b < B; b++) {
				t0 = now_ns();
				w->hits[b] = kvc_lookup(w->reqs[b]);
				t1 = now_ns() - t0;
				acc += t1;
				if (w->nlat[0] < LAT_CAP)
					w->lat[0][w->nlat[0]++] = (uint32_t)(t1 > UINT32_MAX ? UINT32_MAX : t1);
			}
		} else {
			t0 = now_ns();
			for (b = 0; b < B; b++)
				w->hits[b] = kvc_lookup(w->reqs[b]);
			acc = now_ns() - t0;
		}
		for (b = 0; b < B; b++) {
			ck(w->hits[b], "kvc_lookup");
			if ((size_t)w->hits[b] != n)
				bad_hit(w->c, "kvc_lookup", w->hits[b], n);
			kvc_req_free(w->reqs[b]);
			w->reqs[b] = NULL;
		}
		break;
	case K_PEER_LOOKUP:
		if (s->latency) {
			for (b = 0; b < B; b++) {
				t0 = now_ns();
				w->hits[b] = (int)peer_lookup(&w->peer, w->keys, w->tokens, n, w->pages);
				t1 = now_ns() - t0;
				acc += t1;
				if (w->nlat[1] < LAT_CAP)
					w->lat[1][w->nlat[1]++] = (uint32_t)(t1 > UINT32_MAX ? UINT32_MAX : t1);
			}
		} else {
			t0 = now_ns();
			for (b = 0; b < B; b++)
				w->hits[b] = (int)peer_lookup(&w->peer, w->keys, w->tokens, n, w->pages);
			acc = now_ns() - t0;
		}
		for (b = 0; b < B; b++)
			if ((size_t)w->hits[b] != n)
				die("peer lookup hit %d of %zu blocks (kvbench bug)", w->hits[b], n);
		sink += w->pages[n - 1];
		break;
	case K_HASH:
		t0 = now_ns();
		for (b = 0; b < B; b++) {
			struct kvc_req *r;

			ck(kvc_req_new(w->c, w->tokens, w->ntok, NULL, 0, &r), "kvc_req_new");
			h = kvc_lookup(r);
			kvc_req_free(r);
			if (h < 0 || (size_t)h != n) {
				ck(h, "kvc_lookup");
				bad_hit(w->c, "kvc_lookup", h, n);
			}
		}
		acc = now_ns() - t0;
		break;
	case K_PEER_HASH:
		t0 = now_ns();
		for (b = 0; b < B; b++) {
			h = ck(kvc_keys(w->c, w->tokens, w->ntok, NULL, 0, w->kbuf, n), "kvc_keys");
			if ((size_t)h != n ||
			    peer_lookup(&w->peer, w->kbuf, w->tokens, n, w->pages) != n)
				die("peer hash+lookup missed (kvbench bug)");
		}
		acc = now_ns() - t0;
		sink += w->pages[n - 1];
		break;
	}
	*ops += (uint64_t)B * n;
	return acc;
}

static int lookup_worker(const struct session *s, int up, int down)
{
	struct kvc_model m = tiny_model();
	struct wstate w;
	struct wres res;
	uint64_t t0, end;
	size_t i, j;
	char ready = 'r';
	int r, k;

	memset(&w, 0, sizeof(w));
	memset(&res, 0, sizeof(res));
	w.c = open_model(s->sock, &m);
	w.n = s->blocks;
	w.ntok = w.n * BT;
	w.tokens = xmalloc(w.ntok * sizeof(uint32_t));
	w.keys = xmalloc(w.n * sizeof(*w.keys));
	w.kbuf = xmalloc(w.n * sizeof(*w.kbuf));
	w.pages = xmalloc(w.n * sizeof(uint32_t));
	make_tokens(w.tokens, w.ntok, prefix_seed(w.n));
	if ((size_t)ck(kvc_keys(w.c, w.tokens, w.ntok, NULL, 0, w.keys, w.n), "kvc_keys") != w.n)
		die("kvc_keys: wrong block count");

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
	w.hits = xmalloc(w.batch * sizeof(*w.hits));
	if (s->latency) {
		w.lat[0] = xmalloc(LAT_CAP * sizeof(uint32_t));
		w.lat[1] = xmalloc(LAT_CAP * sizeof(uint32_t));
	}

	/* Ready; wait for the common start time. */
	if (write(up, &ready, 1) != 1 || read(down, &t0, sizeof(t0)) != sizeof(t0))
		die("worker: lost the parent");
	while (now_ns() < t0)
		;
	for (r = 0; r < ROUNDS; r++) {
		for (k = 0; k < s->nkinds; k++) {
			end = t0 + (uint64_t)(r * s->nkinds + k + 1) * s->slice_ns;
			do {
				res.ns[r][k] += run_batch(&w, s, k, &res.ops[r][k]);
			} while (now_ns() < end);
		}
	}
	if (s->latency) {
		for (k = 0; k < 2; k++) {
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
	kvc_close(w.c);
	return 0;
}

static bool read_full(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
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
static void run_session(const struct session *s, int nproc, struct wres *res)
{
	int up[2][2], down[2][2], i;
	pid_t pids[2] = { 0, 0 };
	uint64_t t0;
	char c;

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
	qsort(r, ROUNDS, sizeof(double), cmp_dbl);
	return ROUNDS % 2 ? r[ROUNDS / 2] : (r[ROUNDS / 2 - 1] + r[ROUNDS / 2]) / 2;
}

/* Publish every lookup prefix once, with a key-derived page pattern; check
 * each by a lookup and its page bytes. */
static void publish_prefixes(const char *sock)
{
	struct kvc_model m = tiny_model();
	kvc_t *c = open_model(sock, &m);
	size_t pb = kvc_page_bytes(c), i, j;
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
		free(t);
		free(kk);
	}
	kvc_close(c);
}

static void bench_lookup(const char *sock)
{
	struct session s = { .sock = sock, .nkinds = 4 };
	struct wres res[2];
	size_t i;
	int np;

	/* Four kinds x ROUNDS slices: each row (kvcached + peer) gets opt.seconds. */
	s.slice_ns = (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
	for (np = 1; np <= 2; np++) {
		for (i = 0; i < NELEM(lookup_sizes); i++) {
			s.blocks = lookup_sizes[i];
			run_session(&s, np, res);
			add_row("lookup", np, s.blocks, 4096, NULL, "blocks/s", "hashtable",
				agg_rate(res, np, K_LOOKUP), agg_rate(res, np, K_PEER_LOOKUP));
			add_row("hash_lookup", np, s.blocks, 4096, NULL, "blocks/s", "hashtable",
				agg_rate(res, np, K_HASH), agg_rate(res, np, K_PEER_HASH));
		}
	}
}

static void bench_latency(const char *sock)
{
	static const char *const names[4] = { "p50", "p90", "p99", "p999" };
	struct session s = { .sock = sock, .nkinds = 2, .latency = true,
			     .blocks = LAT_BLOCKS };
	struct wres res;
	int i;

	s.slice_ns = (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
	run_session(&s, 1, &res);
	if (!res.nlat[0] || !res.nlat[1])
		die("latency: no samples");
	for (i = 0; i < 4; i++)
		add_row("latency", 1, LAT_BLOCKS, 4096, names[i], "ns", "hashtable",
			res.lat[0][i], res.lat[1][i]);
}

/* ------------------------------------------------------------ publish */

struct pubctx {
	kvc_t *c;
	size_t pb;
	uint64_t ctr;		/* prompt counter: every request is new */
	uint32_t *tokens;
	const uint8_t *src;
};

static uint64_t pub_seed(uint64_t ctr)
{
	return (1ull << 40) + ctr;
}

/* One request of n fresh blocks; returns the ns it took. */
static uint64_t pub_request(struct pubctx *p, size_t n)
{
	struct kvc_req *r;
	uint64_t t0, t1;
	size_t i;
	int got;

	make_tokens(p->tokens, n * BT, pub_seed(p->ctr++));
	t0 = now_ns();
	ck(kvc_req_new(p->c, p->tokens, n * BT, NULL, 0, &r), "kvc_req_new");
	got = ck(kvc_lookup(r), "kvc_lookup");
	if (got)
		die("a fresh prompt hit %d blocks: namespace not private?", got);
	got = ck(kvc_alloc(r), "kvc_alloc");
	if ((size_t)got != n)
		die("kvc_alloc granted %d of %zu pages (pool too small or pinned full?)", got, n);
	for (i = 0; i < n; i++) {
		void *dst = kvc_block(r, i);

		if (!dst)
			die("kvc_block(%zu) is NULL after kvc_alloc", i);
		memcpy(dst, p->src, p->pb);
	}
	got = ck(kvc_publish(r), "kvc_publish");
	if ((size_t)got != n)
		die("kvc_publish cached %d of %zu blocks", got, n);
	kvc_req_free(r);
	t1 = now_ns();
	return t1 - t0;
}

/* The last request's blocks must hit and hold the source bytes. */
static void pub_verify(struct pubctx *p, size_t n)
{
	struct kvc_req *r;
	size_t i;
	int got;

	make_tokens(p->tokens, n * BT, pub_seed(p->ctr - 1));
	ck(kvc_req_new(p->c, p->tokens, n * BT, NULL, 0, &r), "kvc_req_new");
	got = ck(kvc_lookup(r), "kvc_lookup");
	if ((size_t)got != n)
		die("the last published request hit %d of %zu blocks", got, n);
	for (i = 0; i < n; i++)
		if (memcmp(kvc_block(r, i), p->src, p->pb))
			die("published page %zu does not hold the bytes written", i);
	kvc_req_free(r);
}

/*
 * Publish rows for sizes[] (blocks per request) through handle c.
 * The peer writes the same bytes with memcpy into a memfd ring of
 * ring_bytes. gbs: also add GB/s rows.
 */
static void bench_publish(kvc_t *c, const size_t *sizes, size_t nsizes, size_t ring_bytes,
			  bool gbs)
{
	struct pubctx p = { .c = c };
	size_t i, ring_pages, pos = 0, maxn = 0, warm, done;
	struct kvc_stats st;
	uint8_t *ring, *src;
	int fd, r, k;
	void *m;

	p.pb = kvc_page_bytes(c);
	ck(kvc_stats(c, &st), "kvc_stats");
	/* A running daemon's pool may be too small for the largest requests
	 * (slots bigger than our pages): those rows are left out, said so. */
	for (i = 0; i < nsizes; i++) {
		if (4 * sizes[i] > st.pages_total)
			fprintf(stderr, "kvbench: skipping publish of %zu-block requests: the pool has only %llu pages\n",
				sizes[i], (unsigned long long)st.pages_total);
		else if (sizes[i] > maxn)
			maxn = sizes[i];
	}
	if (!maxn)
		return;
	p.tokens = xmalloc(maxn * BT * sizeof(uint32_t));
	if (posix_memalign(&m, 4096, p.pb))
		die("out of memory (source page)");
	src = m;
	for (i = 0; i < p.pb / 8; i++)
		((uint64_t *)src)[i] = mix64(i);
	p.src = src;

	ring_pages = ring_bytes / p.pb;
	if (ring_pages < 2 * maxn)
		ring_pages = 2 * maxn;
	fd = memfd_create("kvbench-peer", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)(ring_pages * p.pb)))
		die("peer ring memfd (%zu bytes): %s", ring_pages * p.pb, strerror(errno));
	ring = mmap(NULL, ring_pages * p.pb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (ring == MAP_FAILED)
		die("mmap peer ring: %s", strerror(errno));
	close(fd);
	memset(ring, 1, ring_pages * p.pb);	/* fault it in, as the pool will be */

	/*
	 * Write the pool once through so first-touch faults are not timed: the
	 * daemon reserves the pool with posix_fallocate, which leaves shmem
	 * pages to be zeroed on first write (and, in a VM, backed by the host
	 * then): up to 20x slower than a warm write. Capped at 4 GiB.
	 */
	warm = st.pages_total;
	if (warm * p.pb > (4ull << 30)) {
		warm = (4ull << 30) / p.pb;
		fprintf(stderr, "kvbench: warming only 4 GiB of a %llu-page pool; publish figures may include first-touch page faults\n",
			(unsigned long long)st.pages_total);
	}
	for (done = 0; done < warm; done += maxn)
		pub_request(&p, maxn);

	for (i = 0; i < nsizes; i++) {
		size_t n = sizes[i];
		uint64_t ops[ROUNDS][2], ns[ROUNDS][2], t0, end, t;
		double rate[2][ROUNDS], med[2];

		if (n > maxn)
			continue;
		memset(ops, 0, sizeof(ops));
		memset(ns, 0, sizeof(ns));
		t0 = now_ns();
		for (r = 0; r < ROUNDS; r++) {
			for (k = 0; k < 2; k++) {
				end = t0 + (uint64_t)(r * 2 + k + 1) * (uint64_t)(opt.seconds * 1e9 / (2.0 * ROUNDS));
				do {
					if (k == 0) {
						ns[r][0] += pub_request(&p, n);
					} else {
						size_t b;

						t = now_ns();
						for (b = 0; b < n; b++, pos++)
							memcpy(ring + (pos % ring_pages) * p.pb, src, p.pb);
						ns[r][1] += now_ns() - t;
					}
					ops[r][k] += n;
				} while (now_ns() < end);
			}
		}
		pub_verify(&p, n);
		for (k = 0; k < 2; k++) {
			for (r = 0; r < ROUNDS; r++)
				rate[k][r] = ns[r][k] ? (double)ops[r][k] * 1e9 / (double)ns[r][k] : 0;
			qsort(rate[k], ROUNDS, sizeof(double), cmp_dbl);
			med[k] = rate[k][ROUNDS / 2];
		}
		add_row("publish", 1, n, p.pb, NULL, "blocks/s", "memcpy", med[0], med[1]);
		if (gbs)
			add_row("publish", 1, n, p.pb, NULL, "GB/s", "memcpy",
				med[0] * (double)p.pb / 1e9, med[1] * (double)p.pb / 1e9);
	}
	sink += ring[(pos ? pos - 1 : 0) % ring_pages * p.pb];
	munmap(ring, ring_pages * p.pb);
	free(src);
	free(p.tokens);
}

static void bench_publish_small(const char *sock)
{
	struct kvc_model m = tiny_model();
	kvc_t *c = open_model(sock, &m);

	bench_publish(c, small_pub_sizes, NELEM(small_pub_sizes), 64ull << 20, false);
	kvc_close(c);
}

static size_t bench_publish_big(const char *sock)
{
	static const uint32_t layers[] = { 32, 16, 8, 4, 2, 1 };
	char err[256] = "";
	kvc_t *c = NULL;
	size_t i, pb;
	int rc = -EMEDIUMTYPE;

	/* 2 MiB pages (32 layers) where the pool's slots take them; a
	 * running daemon with smaller slots gets fewer layers. */
	for (i = 0; i < NELEM(layers) && rc == -EMEDIUMTYPE; i++) {
		struct kvc_model m = big_model(layers[i]);

		rc = try_open(sock, &m, &c, err, sizeof(err));
	}
	if (rc)
		die("kvc_open(%s) on %s failed: %s%s%s%s", pub_name, sock, kvc_strerror(rc),
		    *err ? " (" : "", err, *err ? ")" : "");
	if (kvc_block_tokens(c) != BT)
		die("daemon uses %zu-token blocks; kvbench needs %d", kvc_block_tokens(c), BT);
	pb = kvc_page_bytes(c);
	bench_publish(c, pub_sizes, NELEM(pub_sizes),
		      opt.quick ? (64ull << 20) : (128ull << 20), true);
	kvc_close(c);
	return pb;
}

/* ------------------------------------------------------------- output */

static void machine(long *ncpu, char *cpu, size_t cpulen, char *kernel, size_t klen)
{
	char line[512];
	struct utsname u;
	FILE *f;

	*ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	snprintf(cpu, cpulen, "unknown");
	f = fopen("/proc/cpuinfo", "r");
	if (f) {
		while (fgets(line, sizeof(line), f)) {
			char *colon = strchr(line, ':');

			if (!strncmp(line, "model name", 10) && colon) {
				colon++;
				while (*colon == ' ' || *colon == '\t')
					colon++;
				colon[strcspn(colon, "\n")] = 0;
				snprintf(cpu, cpulen, "%s", colon);
				break;
			}
		}
		fclose(f);
	}
	if (uname(&u))
		snprintf(kernel, klen, "unknown");
	else
		snprintf(kernel, klen, "%s %s %s", u.sysname, u.release, u.machine);
}

static uint32_t timer_overhead(void)
{
	static uint32_t s[20001];
	size_t i;

	for (i = 0; i < NELEM(s); i++) {
		uint64_t t0 = now_ns();

		s[i] = (uint32_t)(now_ns() - t0);
	}
	qsort(s, NELEM(s), sizeof(s[0]), cmp_u32);
	return s[NELEM(s) / 2];
}

static void fmt_val(char *buf, size_t len, double v, const char *unit)
{
	if (!strcmp(unit, "ns"))
		snprintf(buf, len, "%.0f ns", v);
	else if (!strcmp(unit, "GB/s"))
		snprintf(buf, len, "%.2f GB/s", v);
	else if (v >= 1e6)
		snprintf(buf, len, "%.2f M blk/s", v / 1e6);
	else if (v >= 1e3)
		snprintf(buf, len, "%.1f k blk/s", v / 1e3);
	else
		snprintf(buf, len, "%.0f blk/s", v);
}

static void fmt_size(char *buf, size_t len, const struct row *r)
{
	if (r->pct)
		snprintf(buf, len, "%zu blk, %s", r->blocks, r->pct);
	else if (!strcmp(r->mode, "publish"))
		snprintf(buf, len, "%zu blk x %zu KiB", r->blocks, r->page_bytes >> 10);
	else
		snprintf(buf, len, "%zu blk, %d proc", r->blocks, r->procs);
}

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void print_results(const char *cpu, long ncpu, const char *kernel, uint32_t tmr,
			  size_t big_pb, double wall)
{
	char a[32], b[32], sz[40];
	int i;

	if (opt.json) {
		printf("{\"tool\":\"kvbench\",\"schema\":1,\"kvclient_version\":");
		json_str(kvc_version_string());
		printf(",\"machine\":{\"cpus\":%ld,\"cpu_model\":", ncpu);
		json_str(cpu);
		printf(",\"kernel\":");
		json_str(kernel);
		printf("},\"config\":{\"seconds_per_row\":%g,\"quick\":%s,\"daemon\":\"%s\","
		       "\"block_tokens\":%d,\"rounds\":%d,\"lookup_page_bytes\":4096,"
		       "\"publish_page_bytes\":%zu,\"timer_overhead_ns\":%u,\"wall_seconds\":%.1f},"
		       "\"results\":[",
		       opt.seconds, opt.quick ? "true" : "false", opt.socket ? "external" : "spawned",
		       BT, ROUNDS, big_pb, tmr, wall);
		for (i = 0; i < nrows; i++) {
			const struct row *r = &rows[i];

			printf("%s\n{\"mode\":\"%s\",\"procs\":%d,\"blocks\":%zu,\"page_bytes\":%zu,"
			       "\"percentile\":", i ? "," : "", r->mode, r->procs, r->blocks,
			       r->page_bytes);
			if (r->pct)
				printf("\"%s\"", r->pct);
			else
				printf("null");
			printf(",\"unit\":\"%s\",\"kvcached\":%.6g,\"peer\":%.6g,\"peer_kind\":\"%s\","
			       "\"ratio\":%.4f}", r->unit, r->kv, r->peer, r->peer_kind,
			       r->peer > 0 ? r->kv / r->peer : 0.0);
		}
		printf("\n]}\n");
		return;
	}
	printf("kvbench: libkvclient %s, %ld CPUs (%s), %s\n", kvc_version_string(), ncpu, cpu,
	       kernel);
	printf("daemon: %s; %g s per row (%d alternating rounds, median); clock read %u ns\n\n",
	       opt.socket ? opt.socket : "spawned (host pool, hugepages off)", opt.seconds,
	       ROUNDS, tmr);
	printf("%-12s %-20s %16s %16s %8s\n", "mode", "size", "kvcached", "peer", "ratio");
	for (i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];

		fmt_val(a, sizeof(a), r->kv, r->unit);
		fmt_val(b, sizeof(b), r->peer, r->unit);
		fmt_size(sz, sizeof(sz), r);
		printf("%-12s %-20s %16s %16s %8.3f\n", r->mode, sz, a, b,
		       r->peer > 0 ? r->kv / r->peer : 0.0);
	}
	printf("\npeers: lookup, hash_lookup, latency: in-process open-addressing hash table,\n"
	       "  same 128-bit keys, parent + 16-token check per block (hash_lookup: both hash\n"
	       "  with XXH3 via kvc_keys); publish: single-core memcpy of the same page bytes\n"
	       "  into a pre-faulted memfd ring. ratio = kvcached / peer (throughput: higher\n"
	       "  is better; latency: lower is better). Wall time %.1f s.\n", wall);
}

/* ------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f,
"usage: kvbench [options]\n"
"\n"
"Benchmarks kvcached against in-process peers in one run: lookup throughput\n"
"(verified blocks/s, 1 and 2 client processes, prefixes of 1..256 blocks of\n"
"16 tokens), lookup latency percentiles, and publish throughput (blocks/s and\n"
"GB/s). Every figure comes with its peer and the ratio.\n"
"\n"
"  --quick          tiny run for CI smoke tests (a couple of seconds)\n"
"  --seconds N      seconds per result row, kvcached and peer together\n"
"                   (default 1; --quick: 0.04)\n"
"  --json           one JSON object on stdout instead of the table\n"
"  --daemon PATH    kvcached binary to start (default: the kvcached next to\n"
"                   kvbench)\n"
"  --socket PATH    bench the kvcached already running there instead of\n"
"                   starting one (it needs 16-token blocks and room for\n"
"                   about 600 pages)\n"
"  --help           this text\n");
}

static void __attribute__((noreturn, format(printf, 1, 2))) bad_usage(const char *fmt, ...)
{
	va_list ap;

	fputs("kvbench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (see kvbench --help)\n", stderr);
	exit(2);
}

static void parse_args(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "quick", no_argument, NULL, 'q' },
		{ "seconds", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "daemon", required_argument, NULL, 'd' },
		{ "socket", required_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool seconds_set = false;
	char *end;
	int ch;

	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
		switch (ch) {
		case 'q':
			opt.quick = true;
			break;
		case 's':
			errno = 0;
			opt.seconds = strtod(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(opt.seconds) ||
			    opt.seconds < 0.001 || opt.seconds > 600)
				bad_usage("--seconds %s: must be a number of seconds from 0.001 to 600",
					  optarg);
			seconds_set = true;
			break;
		case 'j':
			opt.json = true;
			break;
		case 'd':
			if (!*optarg)
				bad_usage("--daemon: empty path");
			opt.daemon = optarg;
			break;
		case 'S':
			if (!*optarg || strlen(optarg) >= sizeof(((struct sockaddr_un *)0)->sun_path))
				bad_usage("--socket %s: empty, or longer than 107 bytes", optarg);
			opt.socket = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case ':':
			bad_usage("%s needs a value", argv[optind - 1]);
		default:
			if (optopt)
				bad_usage("unknown option '-%c'", optopt);
			bad_usage("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		bad_usage("unexpected argument '%s'", argv[optind]);
	if (opt.daemon && opt.socket)
		bad_usage("--daemon and --socket exclude each other");
	if (opt.quick && !seconds_set)
		opt.seconds = 0.04;
}

int main(int argc, char **argv)
{
	char cpu[256], kernel[256];
	struct sigaction sa;
	const char *sock;
	uint64_t start;
	size_t big_pb;
	uint32_t tmr;
	long ncpu;

	parse_args(argc, argv);
	main_pid = getpid();
	start = now_ns();
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	snprintf(lookup_name, sizeof(lookup_name), "kvbench-lookup-%d", (int)main_pid);
	snprintf(pub_name, sizeof(pub_name), "kvbench-publish-%d", (int)main_pid);
	machine(&ncpu, cpu, sizeof(cpu), kernel, sizeof(kernel));
	tmr = timer_overhead();

	if (opt.socket) {
		sock = opt.socket;
	} else {
		find_daemon();
		start_daemon("lookup", "4K", "4M");
		sock = dmn.sock;
	}
	publish_prefixes(sock);
	bench_lookup(sock);
	bench_latency(sock);
	bench_publish_small(sock);
	if (!opt.socket) {
		stop_daemon(false);
		start_daemon("publish", "2M", opt.quick ? "128M" : "256M");
	}
	big_pb = bench_publish_big(sock);
	if (!opt.socket)
		stop_daemon(false);
	cleanup();
	print_results(cpu, ncpu, kernel, tmr, big_pb, (double)(now_ns() - start) / 1e9);
	return 0;
}
