/* SPDX-License-Identifier: MIT */
/*
 * bench.h - what kvbench's modes share: options, result rows, the daemon
 * kvbench starts, the peer servers (Redis, memcached) and small helpers.
 *
 * tools/kvbench.c owns main(), the options, the mode table and the
 * output; common.c what the modes share (it calls no mode and nothing of
 * kvbench.c); each mode lives in its own tools/bench/<mode>.c and is one
 * function `void mode_<name>(void)` that adds rows with add_row(). A mode
 * that needs its own kvcached starts it with daemon_start() and stops it
 * with daemon_stop() (or leaves that to the cleanup), and checks
 * opt.socket first: with --socket, kvbench benches a daemon it did not
 * start.
 */
#ifndef KVBENCH_BENCH_H
#define KVBENCH_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../libclient/kvclient.h"

#define BT		16	/* tokens per block */
#define ROUNDS		10	/* slices per side and row */
#define NELEM(a)	(sizeof(a) / sizeof((a)[0]))

struct bench_opt {
	double seconds;		/* per result row, kvcached and peers together */
	bool quick;
	bool json;
	const char *daemon;	/* kvcached binary (NULL: next to kvbench) */
	const char *socket;	/* a running daemon, or NULL */
	const char *hugepages;	/* spawned daemons' --hugepages (default off) */
};
extern struct bench_opt opt;
extern pid_t main_pid;
extern volatile uint64_t sink;
/* Config facts a mode reports in the JSON "config" object (0: not run). */
extern size_t publish_page_bytes;

/*
 * One result: kvcached's figure next to one peer's, same unit. skipped
 * (if not NULL) says why the peer has no figure ("redis-server not
 * found"); kv may still be set.
 */
struct row {
	const char *mode;	/* lookup, hash_lookup, latency, publish, pages, ... */
	const char *op;		/* what kvcached did: lookup, hash_lookup, put, get, pin */
	int procs;
	size_t blocks;
	size_t page_bytes;
	const char *pct;	/* latency percentile, else NULL */
	const char *unit;	/* blocks/s, ns, GB/s */
	const char *peer_kind;	/* hashtable, memcpy, redis-get, ...; NULL: none
				 * (pin: no peer reads in place) */
	double kv, peer;
	const char *skipped;
	const char *workload;	/* serve: "qa" or "chat"; else NULL */
};
void add_row(const struct row *r);
/* The rows added so far (the output, kvbench.c). */
const struct row *bench_rows(int *n);
/* A mode's own members of the JSON "config" object (",\"name\":{...}"),
 * and lines printed after the table (its parameters); empty if none. */
extern char mode_json[32768];
extern char mode_text[16384];

/* ---- helpers (common.c) */
void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...);
int ck(int rc, const char *what);	/* die unless rc >= 0 */
void *xmalloc(size_t n);		/* zeroed */
uint64_t now_ns(void);
uint64_t mix64(uint64_t x);
void make_tokens(uint32_t *t, size_t n, uint64_t seed);
/* A page's bytes derived from its block key, and the check of them. */
void fill_page(void *page, size_t bytes, struct kvc_key k);
bool check_page(const void *page, size_t bytes, struct kvc_key k);
/* Word i of that pattern. */
static inline uint64_t page_word(struct kvc_key k, size_t i)
{
	return mix64(k.lo ^ (k.hi + i));
}
int cmp_u32(const void *a, const void *b);
int cmp_dbl(const void *a, const void *b);
double median(double *v, size_t n);	/* sorts v */
uint32_t pctl(const uint32_t *sorted, size_t n, double p);
void sleep_ms(int ms);
bool read_full(int fd, void *buf, size_t len);
/* The private folder of this run (created on first use). */
const char *run_dir(void);
/* Stop what kvbench started (the daemon, what bench_at_exit named) and
 * remove the run's folder: at the end, and from die(). */
void bench_cleanup(void);
/* SIGINT/SIGTERM/SIGHUP: kill what kvbench started, async-signal-safely. */
void bench_on_signal(int sig);
/* Something a mode started that every way out must stop: stop() from
 * bench_cleanup, kill_async() from the signal handler. */
void bench_at_exit(void (*stop)(void), void (*kill_async)(void));

/* ---- the kvcached kvbench starts (common.c) */
/* Start kvcached on a private socket (name.sock in run_dir()), with the
 * given page and pool size and hugepages off; returns the socket path. */
const char *daemon_start(const char *name, const char *page_size, const char *pool_size);
/* The same with more kvcached flags (NULL-terminated). */
const char *daemon_start_args(const char *name, const char *page_size, const char *pool_size,
			      const char *const *extra);
void daemon_stop(bool quiet);
/* Fork and exec argv (argv[0] a path) with its output to log and stdin
 * from /dev/null; the child gets deathsig when kvbench dies. Its pid. */
pid_t bench_spawn(const char *const *argv, const char *log, int deathsig);

/* ---- clients */
int try_open(const char *sock, const struct kvc_model *m, kvc_t **c, char *err,
	     size_t errlen);
kvc_t *open_model(const char *sock, const struct kvc_model *m);	/* or die */
/* try_open with kvc_options.flags (KVC_OPEN_ALLOC_AHEAD). */
int try_open_flags(const char *sock, const struct kvc_model *m, uint32_t flags, kvc_t **c,
		   char *err, size_t errlen);
/* Llama-3-8B-like: 16 x layers x 2 x 8 x 128 x 2 bytes = layers x 64 KiB. */
struct kvc_model big_model(const char *name, uint32_t layers);
/* 1 layer, 2 kv heads, head dim 32, 2 bytes: 4 KiB pages. */
struct kvc_model tiny_model(const char *name);
/*
 * Every namespace kvbench opens is its own (kvbench-<mode>-<pid>). Against
 * a daemon it did not start (--socket) it drops what it published there
 * when a mode is done: bench_close drops the handle's namespace, then
 * closes it; bench_drop_model does the same for a model no handle is
 * open for any more. Counted in bench_dropped_pages for the summary.
 */
void bench_close(kvc_t *c);
void bench_drop_model(const char *sock, const struct kvc_model *m);
extern uint64_t bench_dropped_pages;

/* ---- publish (publish.c), shared with pages.c */
struct pubctx {
	kvc_t *c;
	size_t pb;
	uint64_t ctr;		/* prompt counter: every request is new */
	uint32_t *tokens;
	const uint8_t *src;
};
/* One request of n fresh blocks, each page memcpy'd from p->src; the ns. */
uint64_t pub_request(struct pubctx *p, size_t n);
/* The last request's blocks must hit and hold the source bytes. */
void pub_verify(struct pubctx *p, size_t n);
/* Write the pool once through (first-touch faults), up to 4 GiB. */
void pub_warm(struct pubctx *p, size_t maxn);

/* ---- peer servers (peers.c) */
enum { SRV_REDIS, SRV_MEMCACHED, SRV_N };
/* Start every peer server that is installed (once; later calls return at
 * once). A missing one gets srv_skip() set, "redis-server not found". */
void servers_start(void);
void servers_stop(void);		/* also from the signal handler's path */
void servers_kill_async(void);		/* async-signal-safe SIGKILL */
const char *srv_skip(int s);		/* NULL when server s runs */
const char *srv_sock(int s);

struct redisContext;
struct memcached_st;
struct redisContext *redis_connect(void);	/* or die */
struct memcached_st *mc_connect(void);		/* or die */
void redis_flushall(struct redisContext *r);
void mc_flushall(struct memcached_st *m);
/* SET each keys[i] = vals[i] (lens[i] bytes) in one pipelined batch. */
void redis_set_many(struct redisContext *r, const char *const *keys, const size_t *klen,
		    const void *const *vals, const size_t *vlen, size_t n);
void mc_set_one(struct memcached_st *m, const char *key, size_t klen, const void *val,
		size_t vlen);

/* 32 lowercase hex digits of a key, no NUL. */
#define HEXKEY 32
void key_hex(char *out, struct kvc_key k);

/* ---- modes, one file each (tools/bench/<name>.c) */
void mode_lookup(void);
void mode_flat(void);
void mode_publish(void);
void mode_pages(void);
/* Named in kvbench.c's table already (weak until their file exists). */
void mode_spill(void);
void mode_ttft(void);
void mode_gpu(void);
/* The Python binding's cost per request vs C (bench/python.c). */
void mode_python(void);
void mode_serve(void);
/* Daemon cost against pool size, cached blocks and clients (scale.c);
 * --scale-max-pool in bytes (0: no cap). */
void mode_scale(void);
extern uint64_t scale_max_pool;
/* Tensor-parallel ranks on pages every TP size reads, against a
 * namespace per rank and a page per KV head (tp.c). */
void mode_tp(void);
/* serve's options (P: --serve-procs, W: --serve-workloads, R:
 * --serve-rounds): NULL, or why the value is refused. */
const char *serve_option(int opt, const char *value);

#endif
