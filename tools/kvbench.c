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

#define MAX_ROWS	1024

struct bench_opt opt = { .seconds = 1.0 };
pid_t main_pid;
volatile uint64_t sink;
size_t publish_page_bytes;

/* Modes whose files may not exist yet (other parts build them): weak, so
 * the table can name them; a NULL function means "not built". */
void mode_spill(void) __attribute__((weak));
void mode_ttft(void) __attribute__((weak));
void mode_remote(void) __attribute__((weak));
void mode_gpu(void) __attribute__((weak));
void mode_serve(void) __attribute__((weak));
void mode_scale(void) __attribute__((weak));
char mode_json[2048];
char mode_text[4096];

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
	{ "python", mode_python, "the Python binding per request vs the same calls from C" },
	{ "serve", mode_serve, "N tinylm engines serving: kvcached vs no cache, private caches" },
	{ "scale", mode_scale, "daemon cost vs pool size, cached blocks, clients (only when named)" },
};
static bool mode_on[NELEM(modes)];

/* The daemon kvbench started (pid 0: none) and the run's private folder. */
static struct {
	pid_t pid;
	char sock[108];
	char log[128];
	char path[4096];
} dmn;
static char rundir[64];

static struct row rows[MAX_ROWS];
static int nrows;
/* 1-minute load average at start and end: other work on the machine. */
static double load_start, load_end;
static const char *json_file;
static FILE *json_fp;

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

/* Stop everything kvbench started and remove its folder. */
static void cleanup(void)
{
	if (dmn.pid > 0)
		daemon_stop(true);
	servers_stop();
	if (rundir[0]) {
		/* A flat folder of what kvbench and its servers wrote. */
		DIR *d = opendir(rundir);
		struct dirent *e;

		if (d) {
			while ((e = readdir(d)))
				if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
					unlinkat(dirfd(d), e->d_name, 0);
			closedir(d);
		}
		if (rmdir(rundir))
			fprintf(stderr, "kvbench: could not remove %s: %s\n", rundir,
				strerror(errno));
		rundir[0] = 0;
	}
}

void die(const char *fmt, ...)
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

int ck(int rc, const char *what)
{
	if (rc < 0)
		die("%s failed: %s (%d)", what, kvc_strerror(rc), rc);
	return rc;
}

void *xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Token ids of one prompt; different seeds share no block. */
void make_tokens(uint32_t *t, size_t n, uint64_t seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		t[i] = (uint32_t)(mix64(seed * 0x100000001b3ull + i) % 128256);
}

void fill_page(void *page, size_t bytes, struct kvc_key k)
{
	uint64_t *p = page;
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		p[i] = page_word(k, i);
}

bool check_page(const void *page, size_t bytes, struct kvc_key k)
{
	const uint64_t *p = page;
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		if (p[i] != page_word(k, i))
			return false;
	return true;
}

void key_hex(char *out, struct kvc_key k)
{
	static const char hx[] = "0123456789abcdef";
	int i;

	for (i = 0; i < 16; i++) {
		out[i] = hx[(k.hi >> (60 - 4 * i)) & 15];
		out[16 + i] = hx[(k.lo >> (60 - 4 * i)) & 15];
	}
}

int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double median(double *v, size_t n)
{
	if (!n)
		return 0;
	qsort(v, n, sizeof(double), cmp_dbl);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Nearest-rank percentile of sorted samples. */
uint32_t pctl(const uint32_t *s, size_t n, double p)
{
	size_t k = (size_t)ceil(p * (double)n);

	if (!n)
		return 0;
	return s[k ? (k > n ? n : k) - 1 : 0];
}

void add_row(const struct row *r)
{
	if (nrows == MAX_ROWS)
		die("internal: too many result rows");
	rows[nrows++] = *r;
}

bool can_connect(const char *path)
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

void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

bool read_full(int fd, void *buf, size_t len)
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

/* $TMPDIR (else /tmp)/kvbench.XXXXXX, short enough for the socket paths. */
const char *run_dir(void)
{
	const char *tmp = getenv("TMPDIR");

	if (!rundir[0]) {
		if (!tmp || !*tmp)
			tmp = "/tmp";
		if (strlen(tmp) > 48)
			die("TMPDIR %s: longer than 48 bytes, too long for the sockets kvbench makes there",
			    tmp);
		snprintf(rundir, sizeof(rundir), "%s/kvbench.XXXXXX", tmp);
		if (!mkdtemp(rundir)) {
			rundir[0] = 0;
			die("mkdtemp %s/kvbench.XXXXXX: %s", tmp, strerror(errno));
		}
	}
	return rundir;
}

/* ------------------------------------------------------------ daemon */

/* The kvcached binary: --daemon, else the one next to this executable. */
static void find_daemon(void)
{
	char exe[4096], *slash;
	ssize_t n;

	if (dmn.path[0])
		return;
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

const char *daemon_start(const char *name, const char *page_size, const char *pool_size)
{
	return daemon_start_args(name, page_size, pool_size, NULL);
}

const char *daemon_start_args(const char *name, const char *page_size, const char *pool_size,
			      const char *const *extra)
{
	/* One benchmark process may fill the whole pool (max-share). */
	const char *argv[32] = { dmn.path, "--socket", dmn.sock, "--page-size", page_size,
				 "--pool-size", pool_size, "--hugepages", "off",
				 "--max-share", "100", NULL };
	int i, st, fd, n = 11;

	for (i = 0; extra && extra[i] && n < 31; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	if (dmn.pid > 0)
		daemon_stop(false);
	find_daemon();
	snprintf(dmn.sock, sizeof(dmn.sock), "%s/%s.sock", run_dir(), name);
	snprintf(dmn.log, sizeof(dmn.log), "%s/%s.log", run_dir(), name);
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
			return dmn.sock;
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
void daemon_stop(bool quiet)
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
	/* Async-signal-safe calls only: kill what we started, remove the
	 * files we know of and the folder. */
	if (getpid() == main_pid) {
		if (dmn.pid > 0)
			kill(dmn.pid, SIGTERM);
		servers_kill_async();
		if (dmn.sock[0])
			unlink(dmn.sock);
		if (dmn.log[0])
			unlink(dmn.log);
		if (rundir[0])
			rmdir(rundir);
	}
	_exit(128 + sig);
}

/* ------------------------------------------------------------ models */

struct kvc_model tiny_model(const char *name)
{
	struct kvc_model m = {
		.size = sizeof(m), .name = name, .dtype_bytes = 2, .layers = 1,
		.kv_heads = 2, .head_dim = 32, .block_tokens = BT, .pos_kind = KVC_POS_ROPE,
	};
	return m;
}

struct kvc_model big_model(const char *name, uint32_t layers)
{
	struct kvc_model m = {
		.size = sizeof(m), .name = name, .dtype_bytes = 2, .layers = layers,
		.kv_heads = 8, .head_dim = 128, .block_tokens = BT, .pos_kind = KVC_POS_ROPE,
	};
	return m;
}

int try_open(const char *sock, const struct kvc_model *m, kvc_t **c, char *err,
	     size_t errlen)
{
	return try_open_flags(sock, m, 0, c, err, errlen);
}

int try_open_flags(const char *sock, const struct kvc_model *m, uint32_t flags, kvc_t **c,
		   char *err, size_t errlen)
{
	struct kvc_options o = { .size = sizeof(o), .flags = flags, .socket_path = sock,
				 .errbuf = err, .errbuf_len = errlen };
	int rc = kvc_open(m, &o, c);

	/* Attached, with a warning: its pages are much smaller than the
	 * daemon's (an external one). Said once per model name. */
	if (!rc && errlen && err[0]) {
		static char said[8][64];
		int i;

		for (i = 0; i < 8 && said[i][0] && strcmp(said[i], m->name); i++)
			;
		if (i == 8 || !said[i][0]) {
			fprintf(stderr, "kvbench: note: %s (while it runs; kvbench drops its blocks at the end)\n",
				err);
			if (i < 8)
				snprintf(said[i], sizeof(said[i]), "%s", m->name);
		}
	}
	return rc;
}

uint64_t bench_dropped_pages;

void bench_close(kvc_t *c)
{
	int rc = 0, tries;

	/* One DROP per daemon tick: wait for the next one if need be. */
	for (tries = 0; opt.socket && c && tries < 100; tries++) {
		rc = kvc_drop_namespace(c);
		if (rc != -EAGAIN)
			break;
		sleep_ms(20);
	}
	if (rc > 0)
		bench_dropped_pages += (uint64_t)rc;
	else if (rc < 0)
		fprintf(stderr, "kvbench: dropping its blocks from %s: %s\n", opt.socket,
			kvc_strerror(rc));
	kvc_close(c);
}

void bench_drop_model(const char *sock, const struct kvc_model *m)
{
	bench_close(open_model(sock, m));
}

kvc_t *open_model(const char *sock, const struct kvc_model *m)
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
	int i, k;

	fprintf(f, "{\"tool\":\"kvbench\",\"schema\":2,\"kvclient_version\":");
	json_str(f, kvc_version_string());
	fprintf(f, ",\"machine\":{\"cpus\":%ld,\"cpu_model\":", ncpu);
	json_str(f, cpu);
	fprintf(f, ",\"kernel\":");
	json_str(f, kernel);
	fprintf(f, "},\"config\":{\"seconds_per_row\":%g,\"quick\":%s,\"daemon\":\"%s\","
	       "\"block_tokens\":%d,\"rounds\":%d,\"lookup_page_bytes\":4096,"
	       "\"publish_page_bytes\":%zu,\"timer_overhead_ns\":%u,\"wall_seconds\":%.1f,"
	       "\"loadavg_start\":%.2f,\"loadavg_end\":%.2f",
	       opt.seconds, opt.quick ? "true" : "false", opt.socket ? "external" : "spawned",
	       BT, ROUNDS, publish_page_bytes, tmr, wall, load_start, load_end);
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
	int i;

	printf("kvbench: libkvclient %s, %ld CPUs (%s), %s\n", kvc_version_string(), ncpu, cpu,
	       kernel);
	printf("daemon: %s; %g s per row (%d alternating rounds, median); clock read %u ns\n",
	       opt.socket ? opt.socket : "spawned (host pool, hugepages off)", opt.seconds,
	       ROUNDS, tmr);
	if (opt.socket)
		printf("kvbench's namespaces on it (kvbench-<mode>-%d): %llu pages dropped at the end\n",
		       (int)main_pid, (unsigned long long)bench_dropped_pages);
	printf("load average (1 min): %.2f at start, %.2f at end\n\n", load_start, load_end);
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
	       "  none / private / kvcached-nowait (serve): no prefix cache, a private\n"
	       "  in-process cache of 1/N of the memory per engine, kvcached with single\n"
	       "  flight off.\n"
	       "  ratio = kvcached / peer (throughput and hit ratios: higher is better;\n"
	       "  latency, ms and prefill tokens: lower is better). Wall time %.1f s.\n", wall);
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
"  --serve-workloads LIST  serve: qa, chat or both (default qa,chat)\n"
"  --serve-rounds N serve: traces per point, 1 to 8 (default 3; --quick: 1)\n"
"  --scale-max-pool SIZE  scale: largest pool to start (default 16G; sizes\n"
"                   MemAvailable cannot hold twice are skipped, saying so)\n"
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
			bad_usage("--mode %s: unknown mode (modes: lookup, publish, pages, spill, ttft, gpu, python, serve)",
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
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);	/* a dead peer server is an error, not a kill */
	machine(&ncpu, cpu, sizeof(cpu), kernel, sizeof(kernel));
	tmr = timer_overhead();
	load_start = loadavg();

	for (m = 0; m < NELEM(modes); m++)
		if (mode_on[m])
			modes[m].fn();
	cleanup();
	wall = (double)(now_ns() - start) / 1e9;
	load_end = loadavg();
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
