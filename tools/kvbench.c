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
	       "\"block_tokens\":%d,\"rounds\":%d,\"lookup_page_bytes\":4096,"
	       "\"publish_page_bytes\":%zu,\"timer_overhead_ns\":%u,\"wall_seconds\":%.1f,"
	       "\"loadavg_start\":%.2f,\"loadavg_end\":%.2f,\"steal_pct\":%.1f",
	       opt.seconds, opt.quick ? "true" : "false", opt.socket ? "external" : "spawned",
	       BT, ROUNDS, publish_page_bytes, tmr, wall, load_start, load_end, steal_pct);
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
			fprintf(f, ",\"unit\":\"%s\",\"kvcached\":null,\"peer_kind\":\"%s\",",
				r->unit, r->peer_kind);
		else
			fprintf(f, ",\"unit\":\"%s\",\"kvcached\":%.6g,\"peer_kind\":\"%s\",",
				r->unit, r->kv, r->peer_kind);
		if (r->skipped) {
			fprintf(f, "\"peer\":null,\"ratio\":null,\"skipped\":");
			json_str(f, r->skipped);
			fprintf(f, "}");
		} else {
			fprintf(f, "\"peer\":%.6g,\"ratio\":%.6g,\"skipped\":null}", r->peer, ratio(r));
		}
	}
	fprintf(f, "\n]}\n");
}

static void print_table(const char *cpu, long ncpu, const char *kernel, uint32_t tmr,
			double wall)
{
	char a[32], b[64], sz[48];
	int i, nrows;
	const struct row *rows = bench_rows(&nrows);

	printf("kvbench: libkvclient %s, %ld CPUs (%s), %s\n", kvc_version_string(), ncpu, cpu,
	       kernel);
	printf("daemon: %s; %g s per row (%d alternating rounds, median); clock read %u ns\n",
	       opt.socket ? opt.socket : "spawned (host pool, hugepages off)", opt.seconds,
	       ROUNDS, tmr);
	if (opt.socket)
		printf("kvbench's namespaces on it (kvbench-<mode>-%d): %llu pages dropped at the end\n",
		       (int)main_pid, (unsigned long long)bench_dropped_pages);
	printf("load average (1 min): %.2f at start, %.2f at end; CPU time stolen by the hypervisor: %.1f%%\n\n",
	       load_start, load_end, steal_pct);
	printf("%-12s %-24s %16s  %-14s %16s %9s\n", "op", "size", "kvcached", "peer", "peer figure",
	       "ratio");
	for (i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		double x = ratio(r);

		if (r->skipped && r->kv == 0)
			snprintf(a, sizeof(a), "-");
		else
			fmt_val(a, sizeof(a), r->kv, r->unit);
		if (r->skipped)
			snprintf(b, sizeof(b), "skipped: %s", r->skipped);
		else
			fmt_val(b, sizeof(b), r->peer, r->unit);
		fmt_size(sz, sizeof(sz), r);
		printf("%-12s %-24s %16s  %-14s %16s",
		       r->pct && strcmp(r->mode, "scale") ? "latency" : r->op, sz, a,
		       r->peer_kind, b);
		if (r->skipped)
			printf("\n");
		else if (x >= 100)
			printf(" %9.0f\n", x);
		else if (x >= 0.01)
			printf(" %9.3f\n", x);
		else
			printf(" %9.2e\n", x);
	}
	fputs(mode_text, stdout);
	printf("\npeers: hashtable: in-process open-addressing table, same keys and checks;\n"
	       "  memcpy: single-core memcpy of the same bytes; redis-*: redis-server over a\n"
	       "  Unix socket through hiredis; memcached-*: memcached over a Unix socket\n"
	       "  through libmemcached; cold-prefill: tinylm's prefill with no cache;\n"
	       "  cuMemcpyDtoD: one contiguous device copy of the same bytes;\n"
	       "  none / private / private-tail / kvcached-* (serve): no prefix cache, a\n"
	       "  private in-process LRU of 1/N of the memory per engine (head first, or\n"
	       "  tail first as vLLM), kvcached with another eviction policy or with\n"
	       "  single flight off.\n"
	       "  ratio = kvcached / peer (throughput and hit ratios: higher is better;\n"
	       "  latency, ms and prefill tokens: lower is better). Wall time %.1f s.\n", wall);
}

/* ------------------------------------------------------------- main */

/* The "cpu" line of /proc/stat: *steal and *total jiffies of all CPUs. */
static void cpu_jiffies(unsigned long long *steal, unsigned long long *total)
{
	unsigned long long v[8] = { 0 };
	FILE *f = fopen("/proc/stat", "r");
	int i;

	*steal = *total = 0;
	if (!f)
		return;
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
		   &v[4], &v[5], &v[6], &v[7]) == 8) {
		for (i = 0; i < 8; i++)
			*total += v[i];
		*steal = v[7];
	}
	fclose(f);
}

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
"  --quick          short smoke run (about 10 s): fewer sizes, short rows\n"
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
	cpu_jiffies(&steal0, &total0);

	for (m = 0; m < NELEM(modes); m++)
		if (mode_on[m])
			modes[m].fn();
	bench_cleanup();
	wall = (double)(now_ns() - start) / 1e9;
	load_end = loadavg();
	{
		unsigned long long steal1, total1;

		cpu_jiffies(&steal1, &total1);
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
		print_table(cpu, ncpu, kernel, tmr, wall);
	return 0;
}
