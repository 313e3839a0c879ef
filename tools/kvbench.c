// SPDX-License-Identifier: MIT
/*
 * kvbench.c - kvcached's benchmark: every figure next to its peer, measured
 * in the same run on the same machine, and printed as a ratio.
 *
 * This file owns main(), the options, the mode table, the kvcached daemon
 * kvbench starts, the shared helpers and the output (table or --json).
 * Each mode lives in its own file, tools/bench/<mode>.c, as one function
 * `void mode_<mode>(void)` that adds result rows:
 *
 *   lookup   (bench/lookup.c)  verified prefix lookups of 1..256 blocks
 *            (16..4096 tokens), 1 and 2 client processes: kvc_lookup and
 *            kvc_req_new + kvc_lookup + kvc_req_free against an in-process
 *            hash table, Redis (one GET per block, and one MGET) and
 *            memcached (one get per block, and one multi-get); latency
 *            percentiles of the same calls.
 *   publish  (bench/publish.c) kvc_alloc + write + kvc_publish against
 *            plain memcpy, 4 KiB and 2 MiB pages.
 *   pages    (bench/pages.c)   page put, get into a caller buffer and
 *            zero-copy pin, 64 KiB..2 MiB pages, in GB/s against memcpy,
 *            Redis SET/GET and memcached set/get of the same bytes.
 *   ttft     (bench/ttft.c)    tinylm's time to first token of a 2,000-token
 *            document + 32-token question, warm through kvcached (and a
 *            first request's miss) against a prefill with no cache.
 *   gpu      (bench/gpu.c)     gather/scatter kernels in GB/s against
 *            cuMemcpyDtoD of the same bytes; rows skipped, saying why,
 *            without a CUDA build, driver or GPU.
 *   python   (bench/python.c)  what the Python binding adds to a request
 *            (kvc_req_new + kvc_lookup + kvc_req_free of 1 and 256 cached
 *            blocks) against the same calls from C, in ns per request.
 *   serve    (bench/serve.c)   N tinylm engine processes serving a
 *            long-document QA and a multi-turn chat workload: prefill
 *            tokens, hit ratios, TTFT p50/p99 and requests/s of one
 *            shared kvcached pool (single flight on) against no cache,
 *            a private cache per process of 1/N of the memory, and
 *            kvcached with single flight off.
 *   tp       (bench/tp.c)      a TP 2 rank's lookup and gather on pages of
 *            every head (readable at any TP size) against a namespace per
 *            rank (the layout before) and a page per KV head; index
 *            entries and pages per block of each.
 *   scale    (bench/scale.c)   the daemon's cost against its pool size
 *            (64 MiB..16 GiB), cached blocks (4k..4M) and attached client
 *            processes (1..32): idle CPU, tick p99, verified lookups,
 *            alloc+publish p50/p99, fill rate, each against the smallest
 *            point. Only when named (--mode scale).
 *
 * Modes that other parts bring (the spill tier, the reference engine, a
 * GPU pool) are named in the table already with weak symbols: adding one
 * is adding tools/bench/<mode>.c with its mode_<mode>() function; until
 * that file exists the mode is listed as not built.
 *
 * Peers that are servers (redis-server, memcached) are started by kvbench
 * on Unix sockets in its private folder, never on a network port, and are
 * killed on every way out (normal end, error, SIGINT/SIGTERM/SIGHUP). One
 * that is not installed leaves its rows "skipped: redis-server not found".
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../tests/lib/procfs.h"
#include "bench/bench.h"

/* Modes whose files may not exist yet (other parts build them): weak, so
 * the table can name them; a NULL function means "not built". */
void mode_spill(void) __attribute__((weak));
void mode_ttft(void) __attribute__((weak));
void mode_remote(void) __attribute__((weak));
void mode_gpu(void) __attribute__((weak));
void mode_serve(void) __attribute__((weak));
void mode_scale(void) __attribute__((weak));

struct mode {
	const char *name;
	void (*fn)(void);
	const char *what;
};

/* Run order of the default set (every built mode). One line per mode. */
static const struct mode modes[] = {
	{ "lookup", mode_lookup, "verified prefix lookups vs hash table, Redis, memcached" },
	{ "publish", mode_publish, "kvc_alloc + write + kvc_publish vs memcpy" },
	{ "pages", mode_pages, "page put/get/pin GB/s vs memcpy, Redis, memcached" },
	{ "spill", mode_spill, "spill tier (tools/bench/spill.c)" },
	{ "ttft", mode_ttft, "tinylm time to first token, warm vs cold prefill" },
	{ "remote", mode_remote, "remote tier between two hosts vs raw memcached; cross-host TTFT" },
	{ "gpu", mode_gpu, "gather/scatter kernels GB/s vs cuMemcpyDtoD (skipped: no GPU)" },
	{ "flat", mode_flat, "verified lookup rate with 64k..4M blocks cached vs 4k cached" },
	{ "tp", mode_tp, "TP ranks on shared pages vs a namespace per rank, a page per head" },
	{ "python", mode_python, "the Python binding per request vs the same calls from C" },
	{ "serve", mode_serve, "N tinylm engines serving: kvcached vs no cache, private caches" },
	{ "scale", mode_scale, "daemon cost vs pool size, cached blocks, clients (only when named)" },
};
static bool mode_on[NELEM(modes)];

/* 1-minute load average at start and end: other work on the machine. */
static double load_start, load_end, steal_pct;
static unsigned long long steal0, total0;
static const char *json_file;
static FILE *json_fp;

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
	if (!strcmp(unit, "ns") || !strcmp(unit, "ns/page") || !strcmp(unit, "tokens"))
		snprintf(buf, len, "%.0f %s", v, unit);
	else if (!strcmp(unit, "req/s"))
		snprintf(buf, len, "%.2f req/s", v);
	else if (!strcmp(unit, "ratio"))
		snprintf(buf, len, "%.3f", v);
	else if (!strcmp(unit, "ms"))
		snprintf(buf, len, "%.1f ms", v);
	else if (!strcmp(unit, "us"))
		snprintf(buf, len, "%.1f us", v);
	else if (!strcmp(unit, "%core"))
		snprintf(buf, len, "%.3f %% core", v);
	else if (!strcmp(unit, "GB/s"))
		snprintf(buf, len, v >= 100 ? "%.0f GB/s" : "%.2f GB/s", v);
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
		snprintf(buf, len, "%zu blk, %s%s", r->blocks, r->pct,
			 strcmp(r->op, "hash_lookup") ? "" : ", hashed");
	else if (r->workload)
		snprintf(buf, len, "%s, %d proc", r->workload, r->procs);
	else if (!strcmp(r->mode, "flat"))
		snprintf(buf, len, "%zu k blk cached", r->blocks >> 10);
	else if (!strcmp(r->mode, "ttft") || !strcmp(r->op, "ttft_remote"))
		snprintf(buf, len, "%zu-tok doc + question", r->blocks * BT);
	else if (!strcmp(r->mode, "publish") || !strcmp(r->mode, "pages") ||
		 !strcmp(r->mode, "gpu"))
		snprintf(buf, len, "%zu blk x %zu KiB", r->blocks, r->page_bytes >> 10);
	else
		snprintf(buf, len, "%zu blk, %d proc", r->blocks, r->procs);
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

static double ratio(const struct row *r)
{
	return r->peer > 0 && !r->skipped ? r->kv / r->peer : 0.0;
}

static void print_json(FILE *f, const char *cpu, long ncpu, const char *kernel, uint32_t tmr,
		       double wall)
{
	size_t m;
	int i, k, nrows;
	const struct row *rows = bench_rows(&nrows);

	fprintf(f, "{\"tool\":\"kvbench\",\"schema\":2,\"kvclient_version\":");
	json_str(f, kvc_version_string());
	fprintf(f, ",\"machine\":{\"cpus\":%ld,\"cpu_model\":", ncpu);
	json_str(f, cpu);
	fprintf(f, ",\"kernel\":");
	json_str(f, kernel);
	fprintf(f, "},\"config\":{\"seconds_per_row\":%g,\"quick\":%s,\"daemon\":\"%s\","
	       "\"hugepages\":\"%s\",\"block_tokens\":%d,\"rounds\":%d,\"lookup_page_bytes\":4096,"
	       "\"publish_page_bytes\":%zu,\"timer_overhead_ns\":%u,\"wall_seconds\":%.1f,"
	       "\"loadavg_start\":%.2f,\"loadavg_end\":%.2f,\"steal_pct\":%.1f",
	       opt.seconds, opt.quick ? "true" : "false", opt.socket ? "external" : "spawned",
	       opt.hugepages ? opt.hugepages : "off", BT, ROUNDS, publish_page_bytes, tmr, wall, load_start, load_end, steal_pct);
	fputs(mode_json, f);
	fputs(",\"modes\":[", f);
	for (m = 0, k = 0; m < NELEM(modes); m++)
		if (mode_on[m])
			fprintf(f, "%s\"%s\"", k++ ? "," : "", modes[m].name);
	fprintf(f, "],\"peers\":{");
	for (k = 0; k < SRV_N; k++) {
		fprintf(f, "%s\"%s\":", k ? "," : "", k == SRV_REDIS ? "redis" : "memcached");
		if (srv_skip(k)) {
			fprintf(f, "{\"skipped\":");
			json_str(f, srv_skip(k));
			fprintf(f, "}");
		} else {
			fprintf(f, "{\"skipped\":null}");
		}
	}
	fprintf(f, "}},\"results\":[");
	for (i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];

		fprintf(f, "%s\n{\"mode\":\"%s\",\"op\":\"%s\",\"procs\":%d,\"blocks\":%zu,"
		       "\"page_bytes\":%zu,", i ? "," : "", r->mode, r->op, r->procs, r->blocks,
		       r->page_bytes);
		if (r->workload)
			fprintf(f, "\"workload\":\"%s\",", r->workload);
		fprintf(f, "\"percentile\":");
		if (r->pct)
			fprintf(f, "\"%s\"", r->pct);
		else
			fprintf(f, "null");
		/* No figure at all (gpu without a GPU): kvcached null too. */
		if (r->skipped && r->kv == 0)
			fprintf(f, ",\"unit\":\"%s\",\"kvcached\":null,", r->unit);
		else
			fprintf(f, ",\"unit\":\"%s\",\"kvcached\":%.6g,", r->unit, r->kv);
		/* No peer (pin): peer_kind, peer and ratio null, nothing skipped. */
		fprintf(f, "\"peer_kind\":");
		if (r->peer_kind)
			json_str(f, r->peer_kind);
		else
			fprintf(f, "null");
		fprintf(f, ",");
		if (!r->peer_kind && !r->skipped) {
			fprintf(f, "\"peer\":null,\"ratio\":null,\"skipped\":null}");
		} else if (r->skipped) {
			fprintf(f, "\"peer\":null,\"ratio\":null,\"skipped\":");
			json_str(f, r->skipped);
			fprintf(f, "}");
		} else {
			fprintf(f, "\"peer\":%.6g,\"ratio\":%.6g,\"skipped\":null}", r->peer, ratio(r));
		}
	}
	fprintf(f, "\n]}\n");
}

/*
 * What the table's ops and peers are: one line each under the table for
 * those it shows. A name ending in '*' is a prefix ("py_request*" covers
 * every input form, "4k cached*" both flat peers); others match whole.
 */
static const struct legend {
	const char *name, *text;
} op_legend[] = {
	{ "lookup", "kvc_lookup alone on requests made beforehand: index probe, token check, pin" },
	{ "hash_lookup", "kvc_req_new + kvc_lookup + kvc_req_free: what an engine pays per prompt, hashing its tokens included" },
	{ "latency", "one call timed on its own, nearest-rank percentile (hashed: hash_lookup's three calls)" },
	{ "publish", "kvc_alloc + memcpy of a page into each granted page + kvc_publish, fresh blocks" },
	{ "put", "publish of 16 MiB requests" },
	{ "get", "lookup of a stored 16 MiB request, each page copied into a caller buffer" },
	{ "pin", "lookup of a stored 16 MiB request, each page read in place (zero-copy): no peer reads in place" },
	{ "spill-write", "pool pages evicted to the spill tier's slot files (io_uring)" },
	{ "restore", "kvc_restore of spilled runs back into the pool, checked" },
	{ "ttft_warm", "tinylm's time to first token of a question on a document kvcached holds" },
	{ "ttft_miss", "the same on first sight: a miss, the full prefill, its blocks published" },
	{ "ttft_remote", "a document prefilled on host A, asked on host B through the remote tier" },
	{ "mac-blake2b", "keyed BLAKE2b of one 2 MiB remote item, one core" },
	{ "mac-poly1305-seal", "item format 2's seal (XChaCha20 key, Poly1305) of one 2 MiB item" },
	{ "mac-poly1305-check", "item format 2's check of one 2 MiB item" },
	{ "remote-write", "the remote tier: publish on host A until its items are stored on the servers" },
	{ "remote-fetch", "the remote tier: one kvc_restore on host B of what host A stored" },
	{ "gather", "the cuda pool's kernel: pool pages to engine blocks, one launch" },
	{ "scatter", "the cuda pool's kernel: engine blocks to pool pages, one launch" },
	{ "lookup_cached_old", "the same walk as it was before issue #27, for comparison" },
	{ "lookup_cached", "the verified lookup walk on a segment holding that many blocks" },
	{ "table_cached", "the in-process table (the lookup mode's peer) holding that many blocks" },
	{ "py_request*", "with client.request(tokens) as r: r.lookup() from Python; tokens as array, list, numpy or torch" },
	{ "py_added", "py_request minus the same calls from C: what the binding adds per request" },
	{ "prefill_tokens", "tokens the engines prefilled, per trace" },
	{ "ttft_p*", "time to first token percentile over the trace's requests" },
	{ "requests_per_s", "requests served per second" },
	{ "token_hit_ratio", "prompt tokens served from a cache" },
	{ "block_hit_ratio", "prompt blocks served from a cache" },
	{ "hot_hit_ratio", "scan: the hot documents' tokens served from a cache" },
	{ "idle_cpu*", "the idle daemon's CPU (idle_cpu_2m: with 2 MiB pages)" },
	{ "tick_*", "the daemon's tick, idle or while clients fill the pool" },
	{ "fill", "blocks published per second into an empty pool" },
	{ "alloc_pub", "kvc_alloc + kvc_publish round trips on a full pool" },
	{ "procs_*", "with that many client processes: alloc+publish p99, daemon CPU, tick" },
}, peer_legend[] = {
	{ "hashtable", "an in-process open-addressing table, same keys and checks (an engine's own cache)" },
	{ "memcpy", "single-core memcpy of the same bytes" },
	{ "redis-get", "redis-server on a Unix socket through hiredis: one GET per block (pages: a pipelined batch)" },
	{ "redis-mget", "redis-server: one MGET of the whole prefix" },
	{ "redis-set", "redis-server: a pipelined batch of SETs" },
	{ "memcached-get", "memcached through libmemcached: one get per block (pages: a multi-get; remote: raw multi-get, 4 threads)" },
	{ "memcached-mget", "memcached: one multi-get of the whole prefix" },
	{ "memcached-set", "memcached: a set per page (remote: raw sets of the same pages, 4 threads)" },
	{ "odirect-*", "O_DIRECT io_uring writes or reads of the same pages, 32 in flight" },
	{ "cold-prefill", "tinylm's prefill of the same prompt with no cache" },
	{ "cuMemcpyDtoD", "one contiguous device copy of the same bytes" },
	{ "hmac-sha256", "HMAC-SHA256 of the same item (item format 1's MAC, OpenSSL)" },
	{ "C", "the same three calls from C, in kvbench, alternating slices" },
	{ "goal 2 us", "the goal itself: the binding adds at most 2 us per request (a ratio up to 1 meets it)" },
	{ "4k cached*", "the same walk on a segment of 4k cached blocks, alternating slices" },
	{ "none", "no prefix cache: every engine prefills every token" },
	{ "private-tail", "the same, evicting a prompt's tail first as vLLM does" },
	{ "private", "a private in-process LRU in each engine, of 1/N of the memory" },
	{ "kvcached-lru", "kvcached with eviction lru" },
	{ "kvcached-clock", "kvcached with eviction clock" },
	{ "kvcached-nowait", "kvcached with single flight off" },
	{ "64MiB pool", "the same figure at the sweep's smallest point" },
	{ "4k blocks", "the same figure with 4k blocks cached" },
	{ "1 process", "the same figure with one client process" },
};

/* name matches pat: whole, or as a prefix where pat ends in '*'. */
static bool name_is(const char *name, const char *pat)
{
	size_t n = strlen(pat);

	return n && pat[n - 1] == '*' ? !strncmp(name, pat, n - 1) : !strcmp(name, pat);
}

static const char *legend_of(const struct legend *l, size_t n, const char *name)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (name_is(name, l[i].name))
			return l[i].text;
	return "see docs/BENCHMARKS.md";
}

/*
 * The goals docs/BENCHMARKS.md sets, as ratios: a row that misses its
 * goal by more than GOAL_FAR gets a sentence under it. op and peer match
 * as legends' names do; peer, workload NULL and blocks, procs 0 mean any;
 * latency rows (but scale's) have none.
 */
#define GOAL_FAR 1.25
static const struct goal {
	const char *mode, *op, *peer, *workload;
	size_t blocks;
	int procs;
	bool at_least;		/* the ratio should be at least `ratio`, else at most */
	double ratio;
	const char *what;
} goals[] = {
	{ "lookup", "lookup", "hashtable", NULL, 0, 0, true, 0.8,
	  "a verified lookup at 0.8 of an in-process table's rate or better" },
	{ "lookup", "hash_lookup", "hashtable", NULL, 0, 0, true, 0.8,
	  "a verified lookup at 0.8 of an in-process table's rate or better" },
	{ "flat", "lookup_cached", "4k cached*", NULL, 0, 0, true, 0.8,
	  "lookups with millions of blocks cached at 0.8 of the rate with 4k or better" },
	{ "remote", "remote-write", "memcached-set", NULL, 0, 0, true, 0.9,
	  "the remote tier at 0.9 of raw libmemcached or better" },
	{ "remote", "remote-fetch", "memcached-get", NULL, 0, 0, true, 0.9,
	  "the remote tier at 0.9 of raw libmemcached or better" },
	{ "python", "py_request*", "C", NULL, 256, 0, false, 1.5,
	  "a 256-block request from Python at most 1.5 times the C calls" },
	{ "python", "py_added", NULL, NULL, 0, 0, false, 1.0,
	  "the binding adds at most 2 us per request" },
	{ "serve", "prefill_tokens", "private", "qa", 0, 4, false, 0.5,
	  "4 engines prefill at most half the tokens of private caches" },
	{ "serve", "ttft_p99", "private", "qa", 0, 4, false, 0.5,
	  "4 engines' TTFT p99 at most half of private caches'" },
	{ "scale", "lookup", "4k blocks", NULL, 0, 0, true, 0.8,
	  "lookups with millions of blocks cached at 0.8 of the rate with 4k or better" },
	{ "scale", "alloc_pub", "64MiB pool", NULL, 0, 0, false, 1.2,
	  "alloc+publish on a full 16 GiB pool at most 1.2 times its time on 64 MiB" },
};

static const struct goal *goal_of(const struct row *r)
{
	size_t i;

	for (i = 0; i < NELEM(goals); i++) {
		const struct goal *g = &goals[i];

		if (!strcmp(r->mode, g->mode) && name_is(r->op, g->op) &&
		    (!g->peer || (r->peer_kind && name_is(r->peer_kind, g->peer))) &&
		    (!g->workload || (r->workload && !strcmp(r->workload, g->workload))) &&
		    (!g->blocks || r->blocks == g->blocks) && (!g->procs || r->procs == g->procs) &&
		    (!r->pct || !strcmp(r->mode, "scale")))
			return g;
	}
	return NULL;
}

/* A ratio with two significant digits, never an exponent: 850, 1700,
 * 5.7, 0.10, 0.0029; a negative one (py_added, a difference of two
 * medians, when the Python call came out faster than C in that run's
 * noise) with its sign: -0.14. */
static void fmt_ratio(char *buf, size_t len, double x)
{
	double m, unit;
	int e;

	if (x < 0 && isfinite(x) && len > 1) {
		buf[0] = '-';
		fmt_ratio(buf + 1, len - 1, -x);
		return;
	}
	if (!(x > 0) || !isfinite(x)) {
		snprintf(buf, len, "0");
		return;
	}
	e = (int)floor(log10(x));
	unit = pow(10, e - 1);
	m = round(x / unit);		/* 10..100 */
	if (m >= 100) {
		e++;
		unit = pow(10, e - 1);
		m = round(x / unit);
	}
	snprintf(buf, len, "%.*f", e >= 1 ? 0 : 1 - e, m * unit);
}

/* What the table says before any mode runs (progress and notes follow). */
static void print_head(const char *cpu, long ncpu, const char *kernel, uint32_t tmr)
{
	char sz[48];

	printf("kvbench: libkvclient %s, %ld CPUs (%s), %s\n", kvc_version_string(), ncpu, cpu,
	       kernel);
	snprintf(sz, sizeof(sz), "spawned (host pool, hugepages %s)",
		 opt.hugepages ? opt.hugepages : "off");
	printf("daemon: %s; %g s per row (%d alternating rounds, median); clock read %u ns\n",
	       opt.socket ? opt.socket : sz, opt.seconds, ROUNDS, tmr);
	fflush(stdout);
}

#define COLS 6
static void print_table(double wall)
{
	static const char *const head[COLS] = { "op", "size", "kvcached", "peer", "peer figure",
						"ratio" };
	const char *used_op[64], *used_peer[64];
	size_t nop = 0, npeer = 0, i, j;
	int w[COLS], k, nrows;
	const struct row *rows = bench_rows(&nrows);
	char (*cell)[COLS][80] = xmalloc((size_t)(nrows ? nrows : 1) * sizeof(*cell));

	printf("\nload average (1 min): %.2f at start, %.2f at end; CPU time stolen by the hypervisor: %.1f%%; wall time %.1f s\n",
	       load_start, load_end, steal_pct, wall);
	if (opt.socket)
		printf("kvbench's namespaces on it (kvbench-<mode>-%d): %llu pages dropped at the end\n",
		       (int)main_pid, (unsigned long long)bench_dropped_pages);
	/* The cells first, then each column as wide as its widest cell. */
	for (k = 0; k < COLS; k++)
		w[k] = (int)strlen(head[k]);
	for (i = 0; i < (size_t)nrows; i++) {
		const struct row *r = &rows[i];
		const char *op = r->pct && strcmp(r->mode, "scale") ? "latency" : r->op;

		snprintf(cell[i][0], 80, "%s", op);
		fmt_size(cell[i][1], 80, r);
		if (r->skipped && r->kv == 0)
			snprintf(cell[i][2], 80, "-");
		else
			fmt_val(cell[i][2], 80, r->kv, r->unit);
		snprintf(cell[i][3], 80, "%s", r->peer_kind ? r->peer_kind : "-");
		if (r->skipped)
			snprintf(cell[i][4], 80, "skipped: %s", r->skipped);
		else if (!r->peer_kind)
			snprintf(cell[i][4], 80, "-");
		else
			fmt_val(cell[i][4], 80, r->peer, r->unit);
		if (r->skipped)
			cell[i][5][0] = 0;
		else if (!r->peer_kind)
			snprintf(cell[i][5], 80, "-");
		else
			fmt_ratio(cell[i][5], 80, ratio(r));
		for (k = 0; k < COLS; k++)
			if (!(k == 4 && r->skipped) && (int)strlen(cell[i][k]) > w[k])
				w[k] = (int)strlen(cell[i][k]);
		for (j = 0; j < nop && strcmp(used_op[j], op); j++)
			;
		if (j == nop && nop < NELEM(used_op))
			used_op[nop++] = op;
		for (j = 0; r->peer_kind && j < npeer && strcmp(used_peer[j], r->peer_kind); j++)
			;
		if (r->peer_kind && j == npeer && npeer < NELEM(used_peer))
			used_peer[npeer++] = r->peer_kind;
	}
	printf("\n%-*s  %-*s  %*s  %-*s  %*s  %*s\n", w[0], head[0], w[1], head[1], w[2], head[2],
	       w[3], head[3], w[4], head[4], w[5], head[5]);
	for (i = 0; i < (size_t)nrows; i++) {
		const struct row *r = &rows[i];
		const struct goal *g = r->skipped || !r->peer_kind ? NULL : goal_of(r);
		double x = ratio(r);

		printf("%-*s  %-*s  %*s  %-*s  ", w[0], cell[i][0], w[1], cell[i][1], w[2],
		       cell[i][2], w[3], cell[i][3]);
		if (r->skipped)
			printf("%s\n", cell[i][4]);
		else
			printf("%*s  %*s\n", w[4], cell[i][4], w[5], cell[i][5]);
		if (g && (g->at_least ? x * GOAL_FAR < g->ratio : x > g->ratio * GOAL_FAR))
			printf("%*s  ^ far from the goal, a ratio of %g or %s: %s\n", w[0], "",
			       g->ratio, g->at_least ? "more" : "less", g->what);
	}
	free(cell);
	printf("\nops:\n");
	for (j = 0; j < nop; j++)
		printf("  %-*s  %s\n", w[0], used_op[j], legend_of(op_legend, NELEM(op_legend),
								   used_op[j]));
	printf("peers (ratio = kvcached / peer; throughput and hit ratios: higher is better; latency,\n"
	       "times and prefill tokens: lower is better; \"-\": no peer):\n");
	for (j = 0; j < npeer; j++)
		printf("  %-*s  %s\n", w[3], used_peer[j],
		       legend_of(peer_legend, NELEM(peer_legend), used_peer[j]));
	fputs(mode_text, stdout);
}

/* ------------------------------------------------------------- main */

static double loadavg(void)
{
	double l = -1;
	FILE *f = fopen("/proc/loadavg", "r");

	if (f) {
		if (fscanf(f, "%lf", &l) != 1)
			l = -1;
		fclose(f);
	}
	return l;
}

static void usage(FILE *f)
{
	size_t m;

	fprintf(f,
"usage: kvbench [options]\n"
"\n"
"Benchmarks kvcached against the peers a user would pick instead, in one\n"
"run: every figure comes with its peer's, measured in alternating slices,\n"
"and the ratio.\n"
"\n"
"  --mode LIST      comma-separated modes to run (default: every built one)\n"
"  --quick          short smoke run (about 20 s on a quiet 2-core machine):\n"
"                   fewer sizes, short rows\n"
"  --seconds N      seconds per result row, kvcached and peers together\n"
"                   (default 1; --quick: 0.04)\n"
"  --json           one JSON object on stdout instead of the table\n"
"  --json-file PATH also write that JSON object to PATH\n"
"  --daemon PATH    kvcached binary to start (default: the kvcached next to\n"
"                   kvbench)\n"
"  --socket PATH    bench the kvcached already running there instead of\n"
"                   starting one (it needs 16-token blocks and room for\n"
"                   about 600 pages); kvbench uses namespaces of its own\n"
"                   there and drops their blocks when each mode is done\n"
"  --serve-procs LIST      serve: engine process counts (default 1,2,4;\n"
"                   --quick: 2), each 1 to 16\n"
"  --serve-workloads LIST  serve: qa, chat, scan, qa-big (default qa,chat,scan;\n"
"                          qa-big: 256 MiB of KV, 2048-token documents)\n"
"  --serve-rounds N serve: traces per point, 1 to 8 (default 3; --quick: 1)\n"
"  --hugepages MODE the daemons kvbench starts get --hugepages MODE (auto,\n"
"                   on or off; default off, so that figures compare across\n"
"                   hosts whatever huge pages they allow)\n"
"  --scale-max-pool SIZE  scale: largest pool to start (default 16G; sizes\n"
"                   MemAvailable cannot hold with 2 GiB to spare are\n"
"                   skipped, saying so)\n"
"  --help           this text\n"
"  --version        kvbench's version\n"
"\n"
"Modes:\n");
	for (m = 0; m < NELEM(modes); m++)
		fprintf(f, "  %-8s %s%s\n", modes[m].name, modes[m].what,
			modes[m].fn ? "" : " [not built]");
	fprintf(f,
"\n"
"redis-server and memcached, where installed, are started on Unix sockets in\n"
"a private folder and stopped at the end; missing ones are reported as\n"
"skipped rows.\n");
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

static void parse_modes(const char *list)
{
	char buf[256], *tok, *save = NULL;
	size_t m;

	if (!*list || strlen(list) >= sizeof(buf))
		bad_usage("--mode '%s': empty or too long", list);
	snprintf(buf, sizeof(buf), "%s", list);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		for (m = 0; m < NELEM(modes); m++)
			if (!strcmp(tok, modes[m].name))
				break;
		if (m == NELEM(modes))
			bad_usage("--mode %s: unknown mode (modes: lookup, publish, pages, spill, ttft, remote, gpu, flat, tp, python, serve, scale)",
				  tok);
		if (!modes[m].fn)
			bad_usage("--mode %s: not built into this kvbench (no tools/bench/%s.c)",
				  tok, tok);
		mode_on[m] = true;
	}
}

static void parse_args(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "quick", no_argument, NULL, 'q' },
		{ "seconds", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "json-file", required_argument, NULL, 'J' },
		{ "daemon", required_argument, NULL, 'd' },
		{ "socket", required_argument, NULL, 'S' },
		{ "mode", required_argument, NULL, 'm' },
		{ "serve-procs", required_argument, NULL, 'P' },
		{ "serve-workloads", required_argument, NULL, 'W' },
		{ "serve-rounds", required_argument, NULL, 'R' },
		{ "scale-max-pool", required_argument, NULL, 'X' },
		{ "hugepages", required_argument, NULL, 'H' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	bool seconds_set = false, modes_set = false;
	char *end;
	size_t m;
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
		case 'J':
			if (!*optarg)
				bad_usage("--json-file: empty path");
			json_file = optarg;
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
		case 'm':
			parse_modes(optarg);
			modes_set = true;
			break;
		case 'P':
		case 'W':
		case 'R': {
			const char *why = serve_option(ch, optarg);

			if (why)
				bad_usage("--%s %s: %s", ch == 'P' ? "serve-procs" :
					  ch == 'W' ? "serve-workloads" : "serve-rounds", optarg, why);
			break;
		}
		case 'X': {
			unsigned long long v = strtoull(optarg, &end, 10);

			if (end == optarg || (*end && strchr("KMG", *end) == NULL) ||
			    (*end && end[1]) || !v)
				bad_usage("--scale-max-pool %s: a size such as 4G (K, M or G)", optarg);
			scale_max_pool = v << (*end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0);
			break;
		}
		case 'H':
			if (strcmp(optarg, "auto") && strcmp(optarg, "on") && strcmp(optarg, "off"))
				bad_usage("--hugepages %s: must be auto, on or off", optarg);
			opt.hugepages = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("kvbench %s\n", KVC_VERSION_STRING);
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
	/* scale starts daemons of up to 16 GiB: only when named. */
	if (!modes_set)
		for (m = 0; m < NELEM(modes); m++)
			mode_on[m] = modes[m].fn != NULL && strcmp(modes[m].name, "scale");
}

int main(int argc, char **argv)
{
	char cpu[256], kernel[256];
	struct sigaction sa;
	uint64_t start;
	uint32_t tmr;
	double wall;
	long ncpu;
	size_t m;

	parse_args(argc, argv);
	/* Opened now, so a path that cannot be written fails before the run. */
	if (json_file && !(json_fp = fopen(json_file, "w"))) {
		fprintf(stderr, "kvbench: --json-file %s: %s\n", json_file, strerror(errno));
		return 2;
	}
	main_pid = getpid();
	start = now_ns();
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = bench_on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);	/* a dead peer server is an error, not a kill */
	machine(&ncpu, cpu, sizeof(cpu), kernel, sizeof(kernel));
	tmr = timer_overhead();
	load_start = loadavg();
	kvt_proc_cpu_jiffies(&steal0, &total0);
	/* The table's head first: the modes' progress and notes follow it. */
	if (!opt.json)
		print_head(cpu, ncpu, kernel, tmr);

	for (m = 0; m < NELEM(modes); m++)
		if (mode_on[m])
			modes[m].fn();
	bench_cleanup();
	wall = (double)(now_ns() - start) / 1e9;
	load_end = loadavg();
	{
		unsigned long long steal1, total1;

		kvt_proc_cpu_jiffies(&steal1, &total1);
		steal_pct = total1 > total0 ? 100.0 * (double)(steal1 - steal0) /
						      (double)(total1 - total0) : 0;
	}
	if (json_fp) {
		print_json(json_fp, cpu, ncpu, kernel, tmr, wall);
		if (fclose(json_fp))
			die("--json-file %s: %s", json_file, strerror(errno));
	}
	if (opt.json)
		print_json(stdout, cpu, ncpu, kernel, tmr, wall);
	else
		print_table(wall);
	return 0;
}
