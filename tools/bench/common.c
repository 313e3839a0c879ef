// SPDX-License-Identifier: MIT
/*
 * common.c - what kvbench's modes share (bench.h): the options and the
 * result rows, the kvcached kvbench starts, the run's private folder,
 * models and handles, and small helpers. The modes (tools/bench/<mode>.c)
 * and tools/kvbench.c (main, the options, the mode table, the output)
 * call into it; it calls none of them: what a mode starts that must be
 * stopped on every way out (peers.c's servers) it registers with
 * bench_at_exit.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../shm/proto.h"
#include "bench.h"

#define MAX_ROWS	1024

struct bench_opt opt = { .seconds = 1.0 };
pid_t main_pid;
volatile uint64_t sink;
size_t publish_page_bytes;


char mode_json[2048];
char mode_text[4096];

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

/* What bench_cleanup and the signal handler stop (bench_at_exit). */
static struct {
	void (*stop)(void);
	void (*kill_async)(void);
} hooks[4];
static int n_hooks;

void bench_at_exit(void (*stop)(void), void (*kill_async)(void))
{
	if (n_hooks == (int)NELEM(hooks))
		die("internal: too many exit hooks");
	hooks[n_hooks].stop = stop;
	hooks[n_hooks].kill_async = kill_async;
	n_hooks++;
}

const struct row *bench_rows(int *n)
{
	*n = nrows;
	return rows;
}

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
void bench_cleanup(void)
{
	int i;

	if (dmn.pid > 0)
		daemon_stop(true);
	for (i = 0; i < n_hooks; i++)
		hooks[i].stop();
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
	bench_cleanup();
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

pid_t bench_spawn(const char *const *argv, const char *log, int deathsig)
{
	pid_t pid;
	int fd;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid)
		return pid;
	/* Never outlive kvbench, whatever happens to it. */
	prctl(PR_SET_PDEATHSIG, deathsig);
	if (getppid() != main_pid)
		_exit(127);
	fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fd >= 0)
		dup2(fd, 0);
	execv(argv[0], (char **)argv);
	fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
	_exit(127);
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
				 "--pool-size", pool_size, "--hugepages",
				 opt.hugepages ? opt.hugepages : "off",
				 "--max-share", "100", NULL };
	int i, st, n = 11;

	for (i = 0; extra && extra[i] && n < 31; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	if (dmn.pid > 0)
		daemon_stop(false);
	find_daemon();
	snprintf(dmn.sock, sizeof(dmn.sock), "%s/%s.sock", run_dir(), name);
	snprintf(dmn.log, sizeof(dmn.log), "%s/%s.log", run_dir(), name);
	dmn.pid = bench_spawn(argv, dmn.log, SIGTERM);
	/* Up to 60 s: the pool is faulted in before the socket listens. */
	for (i = 0; i < 6000; i++) {
		if (kvproto_can_connect(dmn.sock))
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
	die("kvcached did not accept connections on %s within 60 s", dmn.sock);
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

void bench_on_signal(int sig)
{
	int i;

	/* Async-signal-safe calls only: kill what we started, remove the
	 * files we know of and the folder. */
	if (getpid() == main_pid) {
		if (dmn.pid > 0)
			kill(dmn.pid, SIGTERM);
		for (i = 0; i < n_hooks; i++)
			hooks[i].kill_async();
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
	 * daemon's. Said once per model name, and only of the user's daemon
	 * (--socket): kvbench sized its own. */
	if (!rc && errlen && err[0] && opt.socket) {
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

