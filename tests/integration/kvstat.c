// SPDX-License-Identifier: MIT
/*
 * kvstat.c - kvstat against the real daemon and real client processes:
 * exact counters in --json and --prometheus after a scripted workload,
 * live client rows, the top-prefix sketch with labels, /metrics over HTTP
 * on loopback (byte-equal to kvstat --prometheus), error exits, watch mode
 * into a pipe and onto a terminal, SIGINT, reattaching after the daemon is
 * replaced, and the spill tier's rows with a real spill directory.
 *
 * kvstat runs as its own process ($BUILD/kvstat, fork + exec) with stdout
 * and stderr captured. Its JSON is parsed by a small strict parser below,
 * so a malformed document fails the test rather than slipping past a
 * substring search. Every test starts its own daemon so counts are exact.
 * Waits for eventual state (the daemon folds ledger counters on its tick)
 * are bounded polling loops; nothing asserts on timing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../../shm/proto.h"
#include "../../shm/segment.h"

#define BT 16

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static bool near(double a, double b)
{
	return a - b < 1e-6 && b - a < 1e-6;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------ a kvstat process */

struct proc {
	pid_t pid;
	int out, err;		/* read ends; -1 at EOF */
	char *obuf, *ebuf;
	size_t olen, elen;
};

static void append(char **buf, size_t *len, const char *p, size_t n)
{
	*buf = realloc(*buf, *len + n + 1);
	assert_non_null(*buf);
	memcpy(*buf + *len, p, n);
	*len += n;
	(*buf)[*len] = 0;
}

/*
 * Start kvstat with args (NULL-terminated). env_sock: the value of
 * KVCACHED_SOCKET in its environment (NULL: unset). tty_fd >= 0: its
 * stdout and stderr go to that terminal instead of pipes.
 */
static void proc_start(struct proc *p, const char *const *args, const char *env_sock,
		       int tty_fd)
{
	const char *argv[32];
	int o[2] = { -1, -1 }, e[2] = { -1, -1 }, n = 0;

	memset(p, 0, sizeof(*p));
	argv[n++] = kvt_bin("kvstat");
	while (args && *args && n < 31)
		argv[n++] = *args++;
	argv[n] = NULL;
	if (tty_fd < 0) {
		assert_int_equal(pipe2(o, O_CLOEXEC), 0);
		assert_int_equal(pipe2(e, O_CLOEXEC), 0);
	}
	fflush(NULL);
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (!p->pid) {
		if (env_sock)
			setenv("KVCACHED_SOCKET", env_sock, 1);
		else
			unsetenv("KVCACHED_SOCKET");
		if (tty_fd >= 0) {
			setsid();
			dup2(tty_fd, 1);
			dup2(tty_fd, 2);
		} else {
			dup2(o[1], 1);
			dup2(e[1], 2);
		}
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	if (tty_fd < 0) {
		close(o[1]);
		close(e[1]);
		p->out = o[0];
		p->err = e[0];
	} else {
		p->out = -1;
		p->err = -1;
	}
	p->obuf = calloc(1, 1);
	p->ebuf = calloc(1, 1);
}

/* Read what is there, waiting up to ms; false once both pipes are at EOF. */
static bool proc_pump(struct proc *p, int ms)
{
	struct pollfd pf[2] = { { p->out, POLLIN, 0 }, { p->err, POLLIN, 0 } };
	char buf[8192];
	ssize_t n;
	int i;

	if (p->out < 0 && p->err < 0)
		return false;
	if (poll(pf, 2, ms) <= 0)
		return true;
	for (i = 0; i < 2; i++) {
		int *fd = i ? &p->err : &p->out;

		if (*fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		n = read(*fd, buf, sizeof(buf));
		if (n > 0) {
			append(i ? &p->ebuf : &p->obuf, i ? &p->elen : &p->olen, buf, (size_t)n);
		} else {
			close(*fd);
			*fd = -1;
		}
	}
	return true;
}

/* Read to EOF (at most 30 s, then kill) and reap: the exit status, or
 * 128 + signal. */
static int proc_finish(struct proc *p)
{
	int64_t end = now_ms() + 30000;
	int st;

	while (proc_pump(p, 100))
		if (now_ms() > end) {
			kill(p->pid, SIGKILL);
			break;
		}
	if (p->out >= 0)
		close(p->out);
	if (p->err >= 0)
		close(p->err);
	assert_int_equal(waitpid(p->pid, &st, 0), p->pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void proc_free(struct proc *p)
{
	free(p->obuf);
	free(p->ebuf);
	p->obuf = p->ebuf = NULL;
}

/* Run kvstat to the end; *out (and *err, if not NULL) are malloc'd. */
static int kvstat(const char *const *args, const char *env_sock, char **out, char **err)
{
	struct proc p;
	int rc;

	proc_start(&p, args, env_sock, -1);
	rc = proc_finish(&p);
	*out = p.obuf;
	if (err)
		*err = p.ebuf;
	else
		free(p.ebuf);
	return rc;
}

/* ---------------------------------------------------- a strict JSON parser */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
	enum jtype t;
	bool b;
	bool is_u64;		/* a non-negative integer, exact in u */
	uint64_t u;
	double num;
	char *str;
	size_t n;		/* items / members */
	struct jv *item;
	char **key;
};

static void jfree(struct jv *v)
{
	size_t i;

	for (i = 0; i < v->n; i++) {
		jfree(&v->item[i]);
		if (v->key)
			free(v->key[i]);
	}
	free(v->item);
	free(v->key);
	free(v->str);
	memset(v, 0, sizeof(*v));
}

static void ws(const char **p)
{
	while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r')
		(*p)++;
}

static bool jparse_value(const char **p, struct jv *v, int depth);

static bool put_utf8(char **s, size_t *n, uint32_t cp)
{
	char b[4];
	size_t k;

	if (cp < 0x80) {
		b[0] = (char)cp, k = 1;
	} else if (cp < 0x800) {
		b[0] = (char)(0xc0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3f)), k = 2;
	} else if (cp < 0x10000) {
		b[0] = (char)(0xe0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		b[2] = (char)(0x80 | (cp & 0x3f)), k = 3;
	} else {
		b[0] = (char)(0xf0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 0x3f));
		b[2] = (char)(0x80 | (cp >> 6 & 0x3f)), b[3] = (char)(0x80 | (cp & 0x3f)), k = 4;
	}
	append(s, n, b, k);
	return true;
}

static bool hex4(const char *p, uint32_t *out)
{
	uint32_t v = 0;
	int i;

	for (i = 0; i < 4; i++) {
		char c = p[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (uint32_t)(c - 'A' + 10);
		else
			return false;
	}
	*out = v;
	return true;
}

static bool jparse_string(const char **p, char **out)
{
	char *s = calloc(1, 1);
	size_t n = 0;

	if (**p != '"')
		goto bad;
	for ((*p)++; **p != '"'; ) {
		unsigned char c = (unsigned char)**p;

		if (!c || c < 0x20)
			goto bad;
		if (c != '\\') {
			append(&s, &n, *p, 1);
			(*p)++;
			continue;
		}
		(*p)++;
		switch (**p) {
		case '"': append(&s, &n, "\"", 1); break;
		case '\\': append(&s, &n, "\\", 1); break;
		case '/': append(&s, &n, "/", 1); break;
		case 'b': append(&s, &n, "\b", 1); break;
		case 'f': append(&s, &n, "\f", 1); break;
		case 'n': append(&s, &n, "\n", 1); break;
		case 'r': append(&s, &n, "\r", 1); break;
		case 't': append(&s, &n, "\t", 1); break;
		case 'u': {
			uint32_t cp, lo;

			if (!hex4(*p + 1, &cp))
				goto bad;
			*p += 4;
			if (cp >= 0xd800 && cp < 0xdc00) {
				if ((*p)[1] != '\\' || (*p)[2] != 'u' || !hex4(*p + 3, &lo) ||
				    lo < 0xdc00 || lo > 0xdfff)
					goto bad;
				*p += 6;
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
			} else if (cp >= 0xdc00 && cp <= 0xdfff) {
				goto bad;
			}
			put_utf8(&s, &n, cp);
			break;
		}
		default:
			goto bad;
		}
		(*p)++;
	}
	(*p)++;
	*out = s;
	return true;
bad:
	free(s);
	return false;
}

static bool jparse_number(const char **p, struct jv *v)
{
	const char *s = *p, *q = s;
	char *end;

	if (*q == '-')
		q++;
	if (*q == '0')
		q++;
	else if (*q >= '1' && *q <= '9')
		while (*q >= '0' && *q <= '9')
			q++;
	else
		return false;
	v->is_u64 = *s != '-';
	if (*q == '.') {
		v->is_u64 = false;
		if (*++q < '0' || *q > '9')
			return false;
		while (*q >= '0' && *q <= '9')
			q++;
	}
	if (*q == 'e' || *q == 'E') {
		v->is_u64 = false;
		q++;
		if (*q == '+' || *q == '-')
			q++;
		if (*q < '0' || *q > '9')
			return false;
		while (*q >= '0' && *q <= '9')
			q++;
	}
	v->t = J_NUM;
	v->num = strtod(s, &end);
	if (v->is_u64) {
		errno = 0;
		v->u = strtoull(s, NULL, 10);
		if (errno)
			return false;
	}
	*p = q;
	return true;
}

static bool jparse_value(const char **p, struct jv *v, int depth)
{
	memset(v, 0, sizeof(*v));
	if (depth > 32)
		return false;
	ws(p);
	if (!strncmp(*p, "null", 4)) {
		*p += 4;
		v->t = J_NULL;
		return true;
	}
	if (!strncmp(*p, "true", 4) || !strncmp(*p, "false", 5)) {
		v->t = J_BOOL;
		v->b = **p == 't';
		*p += v->b ? 4 : 5;
		return true;
	}
	if (**p == '"') {
		v->t = J_STR;
		return jparse_string(p, &v->str);
	}
	if (**p == '[' || **p == '{') {
		bool obj = **p == '{';
		char close = obj ? '}' : ']';

		v->t = obj ? J_OBJ : J_ARR;
		(*p)++;
		ws(p);
		if (**p == close) {
			(*p)++;
			return true;
		}
		for (;;) {
			char *k = NULL;

			ws(p);
			if (obj) {
				if (!jparse_string(p, &k))
					return false;
				ws(p);
				if (**p != ':') {
					free(k);
					return false;
				}
				(*p)++;
			}
			v->item = realloc(v->item, (v->n + 1) * sizeof(*v->item));
			assert_non_null(v->item);
			if (obj) {
				v->key = realloc(v->key, (v->n + 1) * sizeof(*v->key));
				assert_non_null(v->key);
				v->key[v->n] = k;
			}
			if (!jparse_value(p, &v->item[v->n++], depth + 1))
				return false;
			ws(p);
			if (**p == ',') {
				(*p)++;
				continue;
			}
			if (**p != close)
				return false;
			(*p)++;
			return true;
		}
	}
	return jparse_number(p, v);
}

/* Parse exactly one document (trailing white space allowed). */
static struct jv jparse(const char *text)
{
	struct jv v;
	const char *p = text;
	bool ok = jparse_value(&p, &v, 0);

	ws(&p);
	if (!ok || *p) {
		print_error("not one valid JSON document at offset %zu: %.200s\n",
			    (size_t)(p - text), text);
		fail();
	}
	return v;
}

/* Member `k` of object v, or NULL. */
static const struct jv *jget(const struct jv *v, const char *k)
{
	size_t i;

	if (!v || v->t != J_OBJ)
		return NULL;
	for (i = 0; i < v->n; i++)
		if (!strcmp(v->key[i], k))
			return &v->item[i];
	return NULL;
}

/* A dotted path of members: "counters.lookups". */
static const struct jv *jpath(const struct jv *v, const char *path)
{
	char buf[128], *save = NULL, *k;

	snprintf(buf, sizeof(buf), "%s", path);
	for (k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
		v = jget(v, k);
	return v;
}

static uint64_t ju(const struct jv *v, const char *path)
{
	const struct jv *x = jpath(v, path);

	if (!x || x->t != J_NUM || !x->is_u64) {
		print_error("%s: missing or not a non-negative integer\n", path);
		fail();
	}
	return x->u;
}

static double jd(const struct jv *v, const char *path)
{
	const struct jv *x = jpath(v, path);

	if (!x || x->t != J_NUM) {
		print_error("%s: missing or not a number\n", path);
		fail();
	}
	return x->num;
}

static const char *js(const struct jv *v, const char *path)
{
	const struct jv *x = jpath(v, path);

	if (!x || x->t != J_STR) {
		print_error("%s: missing or not a string\n", path);
		fail();
	}
	return x->str;
}

static const struct jv *jarr(const struct jv *v, const char *path)
{
	const struct jv *x = jpath(v, path);

	if (!x || x->t != J_ARR) {
		print_error("%s: missing or not an array\n", path);
		fail();
	}
	return x;
}

static bool jis_null(const struct jv *v, const char *path)
{
	const struct jv *x = jpath(v, path);

	return x && x->t == J_NULL;
}

/* kvstat --json against d, parsed. */
static struct jv stat_json(const struct kvt_daemon *d)
{
	const char *args[] = { "--socket", d->sock, "--json", NULL };
	char *out, *err;
	struct jv v;
	int rc = kvstat(args, NULL, &out, &err);

	if (rc) {
		print_error("kvstat --json exited %d: %s\n", rc, err);
		fail();
	}
	v = jparse(out);
	free(out);
	free(err);
	return v;
}

/* Poll kvstat --json until done(v) (at most ~10 s); returns the last. */
static struct jv stat_until(const struct kvt_daemon *d, bool (*done)(const struct jv *, void *),
			    void *arg)
{
	struct jv v;
	int i;

	for (i = 0;; i++) {
		v = stat_json(d);
		if (done(&v, arg) || i == 200)
			return v;
		jfree(&v);
		sleep_ms(50);
	}
}

static char *key_hex(struct kvc_key k)
{
	static char buf[4][33];
	static int n;
	char *b = buf[n++ & 3];

	snprintf(b, 33, "%016llx%016llx", (unsigned long long)k.hi, (unsigned long long)k.lo);
	return b;
}

static int setup_metrics(void **state)
{
	static const char *const args[] = { "--metrics-listen", "127.0.0.1:0", NULL };

	return kvt_setup_args(state, args);
}

/* ------------------------------------------- 1. the exact-count workload */

/*
 * Publisher (this process): one lookup of a 7-block, 112-token prompt P,
 * 0 hits and 7 misses, then 7 pages published. Reader (a child named
 * kvt-reader):
 *   L1  P's first 2 blocks (32 tokens)               2 hits, 0 misses
 *   L2  P's first 4 blocks, block 3 altered (64)     3 hits, 1 miss  (kept pinned)
 *   L3  21 tokens of another prompt (1 full block)   0 hits, 1 miss
 * Totals: lookups 4, hit blocks 5, miss blocks 9, hit tokens 80,
 * lookup tokens 112 + 32 + 64 + 21 = 229.
 */
#define P_TOKENS (7 * BT)

struct reader {
	const struct kvt_daemon *d;
	int ready[2];
	int go[2];
};

static int lookup_n(kvc_t *c, const uint32_t *t, size_t n, struct kvc_req **keep)
{
	struct kvc_req *r;
	int hits;

	if (kvc_req_new(c, t, n, NULL, 0, &r))
		return -1;
	hits = kvc_lookup(r);
	if (keep)
		*keep = r;
	else
		kvc_req_free(r);
	return hits;
}

static int reader(void *arg)
{
	struct reader *rd = arg;
	uint32_t p[P_TOKENS], q[21];
	struct kvc_req *held = NULL;
	kvc_t *c;
	char b = 'r';

	/* Only the parent writes go: if it dies, read() sees EOF. */
	close(rd->go[1]);
	close(rd->ready[0]);
	prctl(PR_SET_NAME, "kvt-reader");
	c = kvt_open(rd->d, NULL);
	if (!c)
		return 2;
	kvt_tokens(p, P_TOKENS, 0, 21);
	kvt_tokens(q, 21, 0, 22);
	if (lookup_n(c, p, 2 * BT, NULL) != 2)
		return 3;
	p[3 * BT + 5] ^= 1;
	if (lookup_n(c, p, 4 * BT, &held) != 3)
		return 4;
	if (lookup_n(c, q, 21, NULL) != 0)
		return 5;
	if (write(rd->ready[1], &b, 1) != 1 || read(rd->go[0], &b, 1) != 1)
		return 6;
	kvc_req_free(held);
	kvc_close(c);
	return 0;
}

struct want_row {
	pid_t pid;
};

/* The reader's row is there with its exact counts, and it is the only one. */
static bool reader_row_done(const struct jv *v, void *arg)
{
	const struct want_row *w = arg;
	const struct jv *cl = jget(v, "clients"), *r;

	if (!cl || cl->t != J_ARR || cl->n != 1)
		return false;
	r = &cl->item[0];
	return ju(r, "pid") == (uint64_t)w->pid && ju(r, "lookups") == 3 &&
	       ju(r, "hit_blocks") == 5 && ju(r, "miss_blocks") == 2 && ju(r, "pins") == 3 &&
	       ju(v, "counters.pins") == 3 && ju(v, "pages.pinned") == 3;
}

static bool all_gone_done(const struct jv *v, void *arg)
{
	(void)arg;
	return ju(v, "counters.clients_attached") == 0 && ju(v, "counters.pins") == 0 &&
	       ju(v, "counters.lookups") == 4;
}

/* Run the workload on a fresh daemon; checks the live row on the way. */
static void exact_workload(struct kvt_daemon *d, struct kvc_key *root)
{
	struct reader rd = { .d = d };
	uint32_t p[P_TOKENS];
	struct want_row w;
	const struct jv *r;
	struct jv v;
	kvc_t *a = kvt_open(d, NULL);
	int cached = -1;
	char b;

	assert_non_null(a);
	kvt_tokens(p, P_TOKENS, 0, 21);
	assert_int_equal(kvc_keys(a, p, P_TOKENS, NULL, 0, root, 1), 7);
	assert_int_equal(kvt_put(a, p, P_TOKENS, &cached), 0);
	assert_int_equal(cached, 7);
	kvc_close(a);

	assert_int_equal(pipe(rd.ready), 0);
	assert_int_equal(pipe(rd.go), 0);
	w.pid = kvt_fork(reader, &rd);
	assert_true(w.pid > 0);
	close(rd.ready[1]);	/* so a reader that dies early gives EOF */
	close(rd.go[0]);
	assert_int_equal(read(rd.ready[0], &b, 1), 1);

	/* Live: the reader's row, copied from its ledger by the daemon's tick. */
	v = stat_until(d, reader_row_done, &w);
	r = &jarr(&v, "clients")->item[0];
	assert_int_equal(jarr(&v, "clients")->n, 1);
	assert_int_equal(ju(r, "pid"), w.pid);
	assert_string_equal(js(r, "comm"), "kvt-reader");
	assert_string_equal(js(r, "namespace"), "kvt-tiny");
	assert_int_equal(ju(r, "lookups"), 3);
	assert_int_equal(ju(r, "hit_blocks"), 5);
	assert_int_equal(ju(r, "miss_blocks"), 2);
	assert_int_equal(ju(r, "pins"), 3);
	assert_int_equal(ju(r, "published"), 0);
	assert_int_equal(ju(&v, "pages.pinned"), 3);
	assert_int_equal(ju(&v, "counters.pins"), 3);
	jfree(&v);

	assert_int_equal(write(rd.go[1], "g", 1), 1);
	assert_int_equal(kvt_wait(w.pid), 0);
	close(rd.ready[0]);
	close(rd.go[1]);
	/* Wait until the daemon has seen the reader leave. */
	v = stat_until(d, all_gone_done, NULL);
	assert_int_equal(ju(&v, "counters.clients_attached"), 0);
	jfree(&v);
}

static void test_exact_counts(void **state)
{
	struct kvt_daemon *d = *state;
	const char *prom[] = { "--socket", d->sock, "--prometheus", NULL };
	const char *text[] = { "--socket", d->sock, NULL };
	const struct jv *t;
	struct kvc_key root;
	char *out;
	struct jv v;

	exact_workload(d, &root);
	v = stat_json(d);
	assert_int_equal(ju(&v, "kvstat"), 1);
	assert_int_equal(ju(&v, "shm_version"), KVSHM_VERSION);
	assert_int_equal(ju(&v, "daemon_pid"), d->pid);
	assert_true(jd(&v, "uptime_seconds") >= 0);
	assert_int_equal(ju(&v, "pool.bytes"), 1 << 20);
	assert_int_equal(ju(&v, "pool.page_bytes"), 4096);
	assert_int_equal(ju(&v, "pool.pages"), 256);
	assert_string_equal(js(&v, "pool.kind"), "host");
	assert_int_equal(ju(&v, "pool.block_tokens"), 16);
	assert_int_equal(ju(&v, "counters.lookups"), 4);
	assert_int_equal(ju(&v, "counters.hit_blocks"), 5);
	assert_int_equal(ju(&v, "counters.miss_blocks"), 9);
	assert_int_equal(ju(&v, "counters.hit_tokens"), 80);
	assert_int_equal(ju(&v, "counters.lookup_tokens"), 229);
	assert_int_equal(ju(&v, "counters.publishes"), 7);
	assert_int_equal(ju(&v, "counters.allocs"), 7);
	assert_int_equal(ju(&v, "counters.clients_total"), 2);
	assert_int_equal(ju(&v, "counters.evictions"), 0);
	assert_int_equal(ju(&v, "pages.ready"), 7);
	assert_int_equal(ju(&v, "pages.free"), 249);
	assert_int_equal(ju(&v, "pages.writing"), 0);
	assert_int_equal(ju(&v, "pages.pinned"), 0);
	assert_int_equal(ju(&v, "pages.spilled"), 0);
	assert_true(near(jd(&v, "hit_ratio.blocks"), 5.0 / 14));
	assert_true(near(jd(&v, "hit_ratio.tokens"), 80.0 / 229));
	assert_true(jis_null(&v, "interval"));	/* one-shot: no interval */
	assert_int_equal(jarr(&v, "clients")->n, 0);
	assert_true(jget(jget(&v, "spill"), "enabled") &&
		    jget(jget(&v, "spill"), "enabled")->t == J_BOOL &&
		    !jget(jget(&v, "spill"), "enabled")->b);
	assert_string_equal(js(&v, "spill.path"), "off");
	assert_int_equal(ju(&v, "spill.slots"), 0);
	assert_null(jpath(&v, "spill.slots_used"));
	assert_int_equal(ju(&v, "counters.spill_slots"), 0);
	assert_int_equal(ju(&v, "counters.spill_path"), KVSHM_SPILL_OFF);
	/* The reader's hits (2 + 3 blocks) all went to P's root. */
	t = jarr(&v, "top_prefixes");
	assert_int_equal(t->n, 1);
	assert_string_equal(js(&t->item[0], "key"), key_hex(root));
	assert_int_equal(ju(&t->item[0], "hit_tokens"), 80);
	assert_int_equal(ju(&t->item[0], "error"), 0);
	assert_string_equal(js(&t->item[0], "label"), "");
	assert_string_equal(js(&t->item[0], "namespace"), "kvt-tiny");
	jfree(&v);

	assert_int_equal(kvstat(prom, NULL, &out, NULL), 0);
	assert_non_null(strstr(out, "\nkvcached_lookups_total 4\n"));
	assert_non_null(strstr(out, "\nkvcached_lookup_blocks_total{result=\"hit\"} 5\n"));
	assert_non_null(strstr(out, "\nkvcached_lookup_blocks_total{result=\"miss\"} 9\n"));
	assert_non_null(strstr(out, "\nkvcached_hit_tokens_total 80\n"));
	assert_non_null(strstr(out, "\nkvcached_lookup_tokens_total 229\n"));
	assert_non_null(strstr(out, "\nkvcached_pool_pages{state=\"ready\"} 7\n"));
	assert_non_null(strstr(out, "\nkvcached_spill_slots 0\n"));
	assert_non_null(strstr(out, "\nkvcached_spill_io_path 0\n"));
	free(out);

	/* The table: 5/14 = 35.7% of blocks, 80/229 = 34.9% of tokens. */
	assert_int_equal(kvstat(text, NULL, &out, NULL), 0);
	assert_non_null(strstr(out, "\nspill tier: off\n"));
	assert_null(strstr(out, "\nspilled "));	/* no made-up zeros */
	assert_null(strstr(out, "\nspills "));
	assert_null(strstr(out, "\nspill written "));
	assert_non_null(strstr(out, "35.7%"));
	assert_non_null(strstr(out, "34.9%"));
	assert_non_null(strstr(out, key_hex(root)));
	free(out);
}

/* --------------------------------------------------- 2. the top prefixes */

static void labelled(kvc_t *c, const uint32_t *t, size_t n, const char *label, int hits)
{
	struct kvc_req *r;

	assert_int_equal(kvc_req_new(c, t, n, NULL, 0, &r), 0);
	if (label)
		assert_int_equal(kvc_req_label(r, label), 0);
	assert_int_equal(kvc_lookup(r), hits);
	kvc_req_free(r);
}

static bool top3_done(const struct jv *v, void *arg)
{
	const struct jv *t = jget(v, "top_prefixes");

	(void)arg;
	/* The daemon counts a client gone at once but publishes its final
	 * counters on its next tick: wait for both. */
	return ju(v, "counters.clients_attached") == 0 && t && t->t == J_ARR && t->n == 3 &&
	       ju(v, "counters.lookups") == 3 + 14;
}

static void test_top_prefixes(void **state)
{
	struct kvt_daemon *d = *state;
	const char *prom[] = { "--socket", d->sock, "--prometheus", NULL };
	uint32_t p1[4 * BT], p2[4 * BT], p3[2 * BT];
	struct kvc_key k1, k2, k3;
	kvc_t *c = kvt_open(d, NULL);
	const struct jv *t;
	char line[256], *out;
	struct jv v;
	int i;

	assert_non_null(c);
	kvt_tokens(p1, 4 * BT, 0, 31);
	kvt_tokens(p2, 4 * BT, 0, 32);
	kvt_tokens(p3, 2 * BT, 0, 33);
	assert_int_equal(kvc_keys(c, p1, 4 * BT, NULL, 0, &k1, 1), 4);
	assert_int_equal(kvc_keys(c, p2, 4 * BT, NULL, 0, &k2, 1), 4);
	assert_int_equal(kvc_keys(c, p3, 2 * BT, NULL, 0, &k3, 1), 2);
	/* Publishing looks up first: misses only, nothing for the sketch. */
	assert_int_equal(kvt_put(c, p1, 4 * BT, NULL), 0);
	assert_int_equal(kvt_put(c, p2, 4 * BT, NULL), 0);
	assert_int_equal(kvt_put(c, p3, 2 * BT, NULL), 0);
	for (i = 0; i < 10; i++)
		labelled(c, p1, 4 * BT, "hot", 4);
	for (i = 0; i < 3; i++)
		labelled(c, p2, 4 * BT, "warm", 4);
	labelled(c, p3, 2 * BT, NULL, 2);
	kvc_close(c);

	v = stat_until(d, top3_done, NULL);
	t = jarr(&v, "top_prefixes");
	assert_int_equal(t->n, 3);
	assert_string_equal(js(&t->item[0], "label"), "hot");
	assert_int_equal(ju(&t->item[0], "hit_tokens"), 10 * 4 * BT);
	assert_int_equal(ju(&t->item[0], "error"), 0);
	assert_string_equal(js(&t->item[0], "key"), key_hex(k1));
	assert_string_equal(js(&t->item[0], "namespace"), "kvt-tiny");
	assert_string_equal(js(&t->item[1], "label"), "warm");
	assert_int_equal(ju(&t->item[1], "hit_tokens"), 3 * 4 * BT);
	assert_string_equal(js(&t->item[1], "key"), key_hex(k2));
	assert_string_equal(js(&t->item[2], "label"), "");
	assert_int_equal(ju(&t->item[2], "hit_tokens"), 2 * BT);
	assert_string_equal(js(&t->item[2], "key"), key_hex(k3));
	assert_int_equal(ju(&v, "counters.hit_tokens"), (10 * 4 + 3 * 4 + 2) * BT);
	jfree(&v);

	assert_int_equal(kvstat(prom, NULL, &out, NULL), 0);
	snprintf(line, sizeof(line),
		 "\nkvcached_prefix_hit_tokens{key=\"%s\",label=\"hot\",namespace=\"kvt-tiny\"} %d\n",
		 key_hex(k1), 10 * 4 * BT);
	assert_non_null(strstr(out, line));
	free(out);
}

/* ---------------------------------------------------- 3. /metrics on HTTP */

static int metrics_port(const struct kvt_daemon *d)
{
	static const char pre[] = "metrics: serving http://127.0.0.1:";
	char buf[1 << 16];
	const char *p;
	size_t n;
	FILE *f;

	assert_true(kvt_log_has(d, pre));
	f = fopen(d->log, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strstr(buf, pre);
	assert_non_null(p);
	return atoi(p + sizeof(pre) - 1);
}

/* A plain HTTP/1.0 GET; the whole response (headers and body), malloc'd. */
static char *http_get(int port, const char *path)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { 10, 0 };
	char req[256], buf[8192], *out = calloc(1, 1);
	size_t len = 0;
	ssize_t n;
	int fd;

	assert_non_null(out);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
	assert_int_equal(write(fd, req, (size_t)n), n);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		append(&out, &len, buf, (size_t)n);
	close(fd);
	return out;
}

static void test_http_metrics(void **state)
{
	struct kvt_daemon *d = *state;
	const char *prom[] = { "--socket", d->sock, "--prometheus", NULL };
	int port = metrics_port(d);
	struct kvc_key root;
	char *resp, *body, *sep, *out;

	assert_true(port > 0 && port < 65536);
	exact_workload(d, &root);

	resp = http_get(port, "/metrics");
	assert_true(!strncmp(resp, "HTTP/1.0 200 ", 13) || !strncmp(resp, "HTTP/1.1 200 ", 13));
	sep = strstr(resp, "\r\n\r\n");
	assert_non_null(sep);
	*sep = 0;
	body = sep + 4;
	assert_non_null(strcasestr(resp, "\r\nContent-Type: text/plain; version=0.0.4"));
	assert_non_null(strstr(body, "\nkvcached_lookups_total 4\n"));
	assert_non_null(strstr(body, "\nkvcached_lookup_blocks_total{result=\"hit\"} 5\n"));
	assert_non_null(strstr(body, "\nkvcached_lookup_blocks_total{result=\"miss\"} 9\n"));
	/* Same renderer, same idle segment: kvstat --prometheus is the same text. */
	assert_int_equal(kvstat(prom, NULL, &out, NULL), 0);
	assert_string_equal(out, body);
	free(out);
	free(resp);

	resp = http_get(port, "/other");
	assert_true(!strncmp(resp, "HTTP/1.0 404 ", 13) || !strncmp(resp, "HTTP/1.1 404 ", 13));
	free(resp);
}

/* ------------------------------------------------------------ 4. errors */

struct usage_case {
	const char *args[6];
	int rc;
	const char *err;	/* must appear on stderr */
};

/* A fake kvcached that answers STAT with a segment of another version. */
static pid_t fake_daemon(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	pid_t pid;

	assert_true(ls >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(ls, 4), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		struct kvproto_stat_r r = { KVPROTO_VERSION, KVSHM_VERSION + 1, 65536 };
		struct kvproto_hdr h = { KVPROTO_MAGIC, KVPROTO_STAT_R, 0, sizeof(r), 1 };
		char buf[sizeof(h) + sizeof(r)], cb[CMSG_SPACE(sizeof(int))], in[64];
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb,
				     .msg_controllen = sizeof(cb) };
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		int fd = memfd_create("fake-segment", MFD_CLOEXEC), c;

		if (fd < 0 || ftruncate(fd, 65536))
			_exit(2);
		c = accept(ls, NULL, NULL);
		if (c < 0 || read(c, in, sizeof(in)) <= 0)
			_exit(3);
		memcpy(buf, &h, sizeof(h));
		memcpy(buf + sizeof(h), &r, sizeof(r));
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		_exit(sendmsg(c, &mh, 0) == (ssize_t)sizeof(buf) ? 0 : 4);
	}
	close(ls);
	return pid;
}

static void test_errors(void **state)
{
	struct kvt_daemon *d = *state;
	const struct usage_case cases[] = {
		{ { "--socket", "/nonexistent/x.sock" }, 1, "no kvcached" },
		{ { "--bogus" }, 2, "--bogus" },
		{ { "--watch", "0" }, 2, "--watch '0'" },
		{ { "--watch", "abc" }, 2, "--watch 'abc'" },
		{ { "--watch", "-1" }, 2, "--watch '-1'" },
		{ { "--watch" }, 2, "--watch needs a value" },
		{ { "--watch", "1", "--count", "0" }, 2, "--count '0'" },
		{ { "--watch", "1", "--count", "x" }, 2, "--count 'x'" },
		{ { "--count", "3" }, 2, "--count needs --watch" },
		{ { "--json", "--prometheus" }, 2, "exclude each other" },
		{ { "--prometheus", "--watch", "1" }, 2, "--watch" },
		{ { "extra" }, 2, "'extra'" },
	};
	const char *plain[] = { "--json", NULL };
	const char *help[] = { "--help", NULL };
	char fake[100], *out, *err;
	struct jv v;
	size_t i;
	pid_t fp;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = kvstat(cases[i].args, d->sock, &out, &err);

		if (rc != cases[i].rc || !strstr(err, cases[i].err) || *out) {
			print_error("kvstat %s %s: exit %d (want %d), stderr '%s' (want '%s'), stdout '%s'\n",
				    cases[i].args[0], cases[i].args[1] ? cases[i].args[1] : "", rc,
				    cases[i].rc, err, cases[i].err, out);
			fail();
		}
		free(out);
		free(err);
	}
	/* KVCACHED_SOCKET is the default socket, both ways. */
	assert_int_equal(kvstat(plain, "/nonexistent/y.sock", &out, &err), 1);
	assert_non_null(strstr(err, "/nonexistent/y.sock"));
	free(out);
	free(err);
	assert_int_equal(kvstat(plain, d->sock, &out, NULL), 0);
	v = jparse(out);
	assert_int_equal(ju(&v, "daemon_pid"), d->pid);
	jfree(&v);
	free(out);
	assert_int_equal(kvstat(help, NULL, &out, NULL), 0);
	assert_non_null(strstr(out, "usage: kvstat"));
	free(out);

	/* A daemon whose segment layout is another version: exit 1, said so. */
	snprintf(fake, sizeof(fake), "%s/fake.sock", d->dir);
	fp = fake_daemon(fake);
	{
		const char *args[] = { "--socket", fake, "--json", NULL };

		assert_int_equal(kvstat(args, NULL, &out, &err), 1);
	}
	assert_non_null(strstr(err, "segment layout is version"));
	assert_string_equal(out, "");
	free(out);
	free(err);
	assert_int_equal(kvt_wait(fp), 0);
	unlink(fake);
}

/* -------------------------------------------------- 5. watch into a pipe */

struct looker {
	const struct kvt_daemon *d;
	int ready[2];
	int stop[2];
};

/* Look the published prompt up until told to stop (or 60 s). */
static int looker(void *arg)
{
	struct looker *lk = arg;
	uint32_t t[4 * BT];
	kvc_t *c = kvt_open(lk->d, NULL);
	struct pollfd pf = { lk->stop[0], POLLIN, 0 };
	int64_t end = now_ms() + 60000;
	char b = 'r';
	int n = 0;

	close(lk->stop[1]);	/* a dead parent hangs up the pipe: stop */
	close(lk->ready[0]);
	if (!c)
		return 2;
	kvt_tokens(t, 4 * BT, 0, 41);
	if (kvt_put(c, t, 4 * BT, NULL) < 0)
		return 3;
	do {
		if (kvt_get(c, t, 4 * BT) != 4)
			return 4;
		if (!n++ && write(lk->ready[1], &b, 1) != 1)
			return 5;
		sleep_ms(1);
	} while (!poll(&pf, 1, 0) && now_ms() < end);
	kvc_close(c);
	return 0;
}

static size_t count_lines_starting(const char *s, const char *prefix)
{
	size_t n = 0, k = strlen(prefix);

	for (; s && *s; s = strchr(s, '\n'), s = s ? s + 1 : NULL)
		if (!strncmp(s, prefix, k))
			n++;
	return n;
}

static void test_watch_pipe(void **state)
{
	struct kvt_daemon *d = *state;
	const char *text[] = { "--socket", d->sock, "--watch", "0.2", "--count", "3", NULL };
	const char *json[] = { "--socket", d->sock, "--watch", "0.2", "--count", "3", "--json",
			       NULL };
	struct looker lk = { .d = d };
	char *out, *err, *line, *save = NULL;
	uint64_t last = 0;
	int n = 0;
	pid_t p;
	char b;

	assert_int_equal(pipe(lk.ready), 0);
	assert_int_equal(pipe(lk.stop), 0);
	p = kvt_fork(looker, &lk);
	close(lk.ready[1]);
	close(lk.stop[0]);
	assert_int_equal(read(lk.ready[0], &b, 1), 1);

	assert_int_equal(kvstat(text, NULL, &out, &err), 0);
	assert_string_equal(err, "");
	/* Three frames, two separators, no terminal control in a pipe. */
	assert_int_equal(count_lines_starting(out, "kvcached pid "), 3);
	assert_int_equal(count_lines_starting(out, "-----"), 2);
	assert_int_equal(count_lines_starting(out, "history "), 3);
	assert_int_equal(count_lines_starting(out, "EVENTS "), 3);
	assert_null(strchr(out, '\033'));
	assert_non_null(strstr(out, "/S LAST "));
	free(out);
	free(err);

	/* --json: one object per frame; the first has no interval yet. */
	assert_int_equal(kvstat(json, NULL, &out, &err), 0);
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save), n++) {
		struct jv v = jparse(line);

		if (!n) {
			assert_true(jis_null(&v, "interval"));
		} else {
			assert_true(jd(&v, "interval.seconds") > 0);
			assert_non_null(jpath(&v, "interval.rates.lookups"));
			assert_non_null(jpath(&v, "interval.hit_ratio.blocks"));
		}
		assert_true(ju(&v, "counters.lookups") >= last);	/* a counter */
		last = ju(&v, "counters.lookups");
		assert_int_equal(ju(&v, "counters.clients_attached"), 1);
		jfree(&v);
	}
	assert_int_equal(n, 3);
	free(out);
	free(err);

	assert_int_equal(write(lk.stop[1], "s", 1), 1);
	assert_int_equal(kvt_wait(p), 0);
	close(lk.ready[0]);
	close(lk.stop[1]);
}

/* ------------------------------ 6. a terminal: redraw, SIGINT, cursor back */

static void test_watch_tty_sigint(void **state)
{
	struct kvt_daemon *d = *state;
	const char *args[] = { "--socket", d->sock, "--watch", "0.1", NULL };
	int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC), s, rc;
	int64_t end = now_ms() + 20000;
	char *out = calloc(1, 1), buf[4096];
	size_t len = 0, homes = 0;
	struct proc p;
	const char *q;
	ssize_t n;

	assert_true(m >= 0);
	assert_int_equal(grantpt(m), 0);
	assert_int_equal(unlockpt(m), 0);
	s = open(ptsname(m), O_RDWR | O_NOCTTY | O_CLOEXEC);
	assert_true(s >= 0);
	proc_start(&p, args, NULL, s);
	close(s);
	/* Wait for two redraws (cursor home + a frame each). */
	while (now_ms() < end) {
		struct pollfd pf = { m, POLLIN, 0 };

		if (poll(&pf, 1, 100) > 0 && (n = read(m, buf, sizeof(buf))) > 0)
			append(&out, &len, buf, (size_t)n);
		for (homes = 0, q = out; (q = strstr(q, "\033[H")); q++)
			homes++;
		if (homes >= 3 && strstr(strstr(out, "\033[H") + 1, "kvcached pid "))
			break;
	}
	assert_true(homes >= 3);
	assert_non_null(strstr(out, "\033[?25l"));	/* cursor hidden */
	assert_non_null(strstr(out, "\033[K"));		/* lines cleared in place */
	assert_null(strstr(out, "-----"));		/* no pipe separators */
	kill(p.pid, SIGINT);
	rc = proc_finish(&p);
	/* Drain what it wrote last; the terminal hangs up once it is gone. */
	while ((n = read(m, buf, sizeof(buf))) > 0)
		append(&out, &len, buf, (size_t)n);
	close(m);
	assert_int_equal(rc, 0);	/* a clean exit, not death by SIGINT */
	assert_true(len >= 6 && !strcmp(out + len - 6, "\033[?25h"));	/* cursor back */
	proc_free(&p);
	free(out);
}

/* ------------------------------------------- 7. the daemon is replaced */

/* What test_watch_reattach starts, for its teardown to stop when an
 * assertion ends the test early. */
static struct kvt_daemon reattach_d2;
static pid_t reattach_kvstat;

static int teardown_reattach(void **state)
{
	if (reattach_kvstat > 0) {
		kill(reattach_kvstat, SIGKILL);
		waitpid(reattach_kvstat, NULL, 0);
	}
	reattach_kvstat = 0;
	if (reattach_d2.pid > 0)
		kvt_daemon_stop(&reattach_d2);
	return kvt_teardown(state);
}

static void test_watch_reattach(void **state)
{
	struct kvt_daemon *d = *state, *d2 = &reattach_d2;
	char dir[] = "/tmp/kvstat-link.XXXXXX", link[128], tmp[160], want[256];
	const char *args[] = { "--socket", link, "--watch", "0.25", "--count", "240", NULL };
	int64_t end;
	struct proc p;
	bool seen = false;
	char *after;

	assert_non_null(mkdtemp(dir));
	snprintf(link, sizeof(link), "%s/kvcached.sock", dir);
	snprintf(tmp, sizeof(tmp), "%s/new.sock", dir);
	assert_int_equal(symlink(d->sock, link), 0);
	proc_start(&p, args, NULL, -1);
	reattach_kvstat = p.pid;
	snprintf(want, sizeof(want), "kvcached pid %d on ", d->pid);
	for (end = now_ms() + 20000; !strstr(p.obuf, want) && now_ms() < end;)
		assert_true(proc_pump(&p, 100));
	assert_non_null(strstr(p.obuf, want));

	/* Replace the daemon: the old one stops, a new one answers the path. */
	assert_int_equal(kvt_daemon_stop(d), 0);
	assert_int_equal(kvt_daemon_start(d2, NULL), 0);
	assert_int_equal(symlink(d2->sock, tmp), 0);
	assert_int_equal(rename(tmp, link), 0);

	snprintf(want, sizeof(want), "kvstat: reattached to kvcached pid %d\n", d2->pid);
	for (end = now_ms() + 30000; now_ms() < end && proc_pump(&p, 100);) {
		after = strstr(p.obuf, want);
		if (after && strstr(after, "kvcached pid ") &&
		    strstr(strstr(after, "kvcached pid ") + 1, "\nEVENTS")) {
			seen = true;
			break;
		}
	}
	kill(p.pid, SIGINT);
	assert_int_equal(proc_finish(&p), 0);
	reattach_kvstat = 0;
	if (!seen)
		print_error("kvstat output:\n%s\n", p.obuf);
	assert_true(seen);
	/* It said the first daemon stopped before it reattached. */
	assert_non_null(strstr(p.obuf, "stopped updating"));
	assert_true(strstr(p.obuf, "stopped updating") < strstr(p.obuf, want));
	snprintf(want, sizeof(want), "kvcached pid %d on %s", d2->pid, link);
	assert_non_null(strstr(p.obuf, want));
	proc_free(&p);
	assert_int_equal(kvt_daemon_stop(d2), 0);
	unlink(link);
	rmdir(dir);
}

/* ----------------------------------------------------- 8. the spill tier */

/*
 * A daemon with a 4 MiB spill area: 512 slots of 4096 header + 4096 page
 * bytes. 64 distinct 8-block prompts are 512 blocks into a 256-page pool,
 * so about half of them spill (and none is recycled: they all fit).
 */
#define SP_NB 8
#define SP_PROMPTS 64
#define SP_SLOT_BYTES (4096 + 4096)

static char spill_dir[64];

static int setup_spill(void **state)
{
	const char *args[] = { "--spill-dir", spill_dir, "--spill-size", "4M", "--spill-io",
			       "uring", NULL };

	snprintf(spill_dir, sizeof(spill_dir), "/tmp/kvstat-spill.XXXXXX");
	if (!mkdtemp(spill_dir)) {
		spill_dir[0] = 0;
		return -1;
	}
	if (kvt_setup_args(state, args)) {
		rmdir(spill_dir);	/* cmocka skips the teardown */
		spill_dir[0] = 0;
		return -1;
	}
	return 0;
}

/* Only the spill directory: the test starts the daemon itself. */
static int setup_spill_dir(void **state)
{
	snprintf(spill_dir, sizeof(spill_dir), "/tmp/kvstat-spill.XXXXXX");
	if (!mkdtemp(spill_dir)) {
		spill_dir[0] = 0;
		return -1;
	}
	*state = calloc(1, sizeof(struct kvt_daemon));
	if (!*state) {
		rmdir(spill_dir);
		spill_dir[0] = 0;
		return -1;
	}
	return 0;
}

static int teardown_spill(void **state)
{
	int rc = *state ? kvt_teardown(state) : 0;
	char cmd[128];

	if (spill_dir[0] && !getenv("KVT_KEEP")) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", spill_dir);
		if (system(cmd)) {
			/* A temp folder left behind: nothing to fail on. */
		}
	}
	spill_dir[0] = 0;
	return rc;
}

static void spill_prompt(uint32_t *t, int p)
{
	kvt_tokens(t, SP_NB * BT, 0, 5000 + (uint32_t)p);
}

static void spill_fill(kvc_t *c, int first, int count)
{
	uint32_t t[SP_NB * BT];
	int p, cached;

	for (p = first; p < first + count; p++) {
		spill_prompt(t, p);
		assert_true(kvt_put(c, t, SP_NB * BT, &cached) >= 0);
		assert_int_equal(cached, SP_NB);
	}
}

/* Spill writes are asynchronous: poll kvstat --json until the spill and
 * eviction counters stand still over three looks in a row. */
static struct jv spill_settled(const struct kvt_daemon *d)
{
	uint64_t spills = UINT64_MAX, evictions = UINT64_MAX, clean = UINT64_MAX;
	struct jv v;
	int i, same = 0;

	for (i = 0; i < 400; i++) {
		v = stat_json(d);
		if (ju(&v, "counters.spills") == spills && ju(&v, "counters.evictions") == evictions &&
		    ju(&v, "counters.spill_clean") == clean && ju(&v, "pages.writing") == 0) {
			if (++same == 3)
				return v;
		} else {
			same = 0;
		}
		spills = ju(&v, "counters.spills");
		evictions = ju(&v, "counters.evictions");
		clean = ju(&v, "counters.spill_clean");
		jfree(&v);
		sleep_ms(30);
	}
	fail_msg("the spill counters did not settle");
	return v;
}

/*
 * Every spill field of --json against the counters it comes from and
 * against each other (recycled, dropped and warm are 0 in these tests, so
 * the slots in use are exactly what was written or re-evicted clean and
 * not restored since).
 */
static void check_spill_json(const struct jv *v)
{
	const struct jv *sp = jget(v, "spill");
	uint64_t used = ju(v, "spill.slots_used");

	assert_non_null(sp);
	assert_true(jget(sp, "enabled") && jget(sp, "enabled")->t == J_BOOL &&
		    jget(sp, "enabled")->b);
	assert_string_equal(js(v, "spill.path"), "io_uring");
	assert_int_equal(ju(v, "spill.slots"), (4u << 20) / SP_SLOT_BYTES);
	assert_int_equal(ju(v, "counters.spill_slots"), ju(v, "spill.slots"));
	assert_int_equal(ju(v, "counters.spill_path"), KVSHM_SPILL_URING);
	assert_int_equal(ju(v, "counters.spill_enabled"), 1);
	assert_true(used > 0 && used <= ju(v, "spill.slots"));
	assert_int_equal(used, ju(v, "pages.spilled"));
	assert_int_equal(used, ju(v, "counters.pages_spilled"));
	assert_int_equal(used, ju(v, "spill.pages"));
	assert_int_equal(ju(v, "spill.bytes"), used * 4096);
	assert_true(ju(v, "spill.spills") > 0);
	assert_int_equal(ju(v, "spill.spills"), ju(v, "counters.spills"));
	assert_int_equal(ju(v, "spill.write_bytes"), ju(v, "spill.spills") * SP_SLOT_BYTES);
	assert_int_equal(ju(v, "spill.write_bytes"), ju(v, "counters.spill_write_bytes"));
	assert_int_equal(ju(v, "spill.restores"), ju(v, "counters.restores"));
	assert_int_equal(ju(v, "spill.read_bytes"), ju(v, "spill.restores") * SP_SLOT_BYTES);
	assert_int_equal(ju(v, "spill.read_bytes"), ju(v, "counters.spill_read_bytes"));
	assert_int_equal(ju(v, "spill.clean"), ju(v, "counters.spill_clean"));
	assert_int_equal(ju(v, "spill.restore_misses"), 0);
	assert_int_equal(ju(v, "spill.dropped"), 0);
	assert_int_equal(ju(v, "spill.recycled"), 0);
	assert_int_equal(ju(v, "spill.errors"), 0);
	assert_int_equal(ju(v, "spill.warm"), 0);
	assert_int_equal(ju(v, "spill.read_bps"), ju(v, "counters.spill_read_bps"));
	assert_int_equal(used, ju(v, "spill.spills") + ju(v, "spill.clean") -
			       ju(v, "spill.restores"));
	/* Every eviction went to a slot, by a write or a clean copy. */
	assert_int_equal(ju(v, "counters.evictions"), ju(v, "spill.spills") + ju(v, "spill.clean"));
}

/* The table's spill rows, and the /metrics series, say the same numbers. */
static void check_spill_text_prom(const struct kvt_daemon *d, const struct jv *v)
{
	const char *text[] = { "--socket", d->sock, NULL };
	const char *prom[] = { "--socket", d->sock, "--prometheus", NULL };
	uint64_t used = ju(v, "spill.slots_used"), slots = ju(v, "spill.slots");
	char line[256], *out, *p;
	unsigned long long total;

	assert_int_equal(kvstat(text, NULL, &out, NULL), 0);
	assert_null(strstr(out, "spill tier: off"));
	snprintf(line, sizeof(line), "\n%-9s %-9s %10llu ", "spilled", "1 spill",
		 (unsigned long long)used);
	assert_non_null(strstr(out, line));
	snprintf(line, sizeof(line), "\nspill tier: io_uring, %llu of %llu slots used (",
		 (unsigned long long)used, (unsigned long long)slots);
	assert_non_null(strstr(out, line));
	snprintf(line, sizeof(line), "\n            0 dropped, 0 recycled, %llu clean evictions, "
		 "0 errors\n", (unsigned long long)ju(v, "spill.clean"));
	assert_non_null(strstr(out, line));
	if (ju(v, "spill.restores")) {
		p = strstr(out, "\n            restore bandwidth ");
		assert_non_null(p);
		assert_non_null(strstr(p, "B/s (measured), 0 slots warm at start\n"));
	} else {
		assert_non_null(strstr(out, "\n            restore bandwidth not measured yet, "
				       "0 slots warm at start\n"));
	}
	p = strstr(out, "\nspills ");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "\nspills %llu", &total), 1);
	assert_int_equal(total, ju(v, "spill.spills"));
	p = strstr(out, "\nrestores ");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "\nrestores %llu", &total), 1);
	assert_int_equal(total, ju(v, "spill.restores"));
	p = strstr(out, "\nrestore misses ");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "\nrestore misses %llu", &total), 1);
	assert_int_equal(total, 0);
	/* Bytes rows are in KiB/MiB; they exist, with a rate in bytes per second. */
	p = strstr(out, "\nspill written ");
	assert_non_null(p);
	assert_true(strstr(p, "iB/s") && strstr(p, "iB/s") < strchr(p + 1, '\n'));
	p = strstr(out, "\nspill read ");
	assert_non_null(p);
	assert_true(strstr(p, "/s") && strstr(p, "/s") < strchr(p + 1, '\n'));
	free(out);

	assert_int_equal(kvstat(prom, NULL, &out, NULL), 0);
#define PROM(fmt, val) \
	do { \
		snprintf(line, sizeof(line), "\n" fmt "\n", (unsigned long long)(val)); \
		if (!strstr(out, line)) \
			fail_msg("--prometheus lacks '%s'", line + 1); \
	} while (0)
	PROM("kvcached_spill_enabled %llu", 1);
	PROM("kvcached_spill_io_path %llu", KVSHM_SPILL_URING);
	PROM("kvcached_spill_slots %llu", slots);
	PROM("kvcached_pool_pages{state=\"spilled\"} %llu", used);
	PROM("kvcached_spills_total %llu", ju(v, "spill.spills"));
	PROM("kvcached_restores_total %llu", ju(v, "spill.restores"));
	PROM("kvcached_restore_misses_total %llu", 0);
	PROM("kvcached_spill_written_bytes_total %llu", ju(v, "spill.write_bytes"));
	PROM("kvcached_spill_read_bytes_total %llu", ju(v, "spill.read_bytes"));
	PROM("kvcached_spill_clean_evictions_total %llu", ju(v, "spill.clean"));
	PROM("kvcached_spill_recycled_slots_total %llu", 0);
	PROM("kvcached_spill_dropped_slots_total %llu", 0);
	PROM("kvcached_spill_errors_total %llu", 0);
	PROM("kvcached_spill_read_bandwidth_bytes_per_second %llu", ju(v, "spill.read_bps"));
	PROM("kvcached_spill_warm_slots %llu", 0);
#undef PROM
	assert_non_null(strstr(out, "\n# TYPE kvcached_spill_written_bytes_total counter\n"));
	assert_non_null(strstr(out, "\n# TYPE kvcached_spill_io_path gauge\n"));
	assert_non_null(strstr(out,
		"\n# TYPE kvcached_spill_read_bandwidth_bytes_per_second gauge\n"));
	free(out);
}

static void test_spill_tier(void **state)
{
	struct kvt_daemon *d = *state;
	const char *watch[] = { "--socket", d->sock, "--watch", "0.25", "--count", "4", "--json",
				NULL };
	uint32_t t[SP_NB * BT];
	struct kvc_req *r;
	uint64_t wrote = 0;
	size_t spilled;
	struct proc p;
	char *line, *save = NULL;
	int hits, n = 0;
	struct jv v;
	kvc_t *c = kvt_open(d, NULL);

	assert_non_null(c);
	/* Before anything spilled: configured, empty, nothing measured. */
	v = stat_json(d);
	assert_true(jget(jget(&v, "spill"), "enabled")->b);
	assert_int_equal(ju(&v, "spill.slots"), (4u << 20) / SP_SLOT_BYTES);
	assert_int_equal(ju(&v, "spill.slots_used"), 0);
	assert_int_equal(ju(&v, "spill.read_bps"), 0);
	jfree(&v);

	spill_fill(c, 0, SP_PROMPTS);
	v = spill_settled(d);
	check_spill_json(&v);
	assert_int_equal(ju(&v, "spill.restores"), 0);
	assert_int_equal(ju(&v, "spill.read_bytes"), 0);
	check_spill_text_prom(d, &v);
	jfree(&v);

	/* The first prompt was evicted first: it comes back from NVMe. */
	spill_prompt(t, 0);
	assert_int_equal(kvc_req_new(c, t, SP_NB * BT, NULL, 0, &r), 0);
	hits = kvc_lookup(r);
	assert_true(hits >= 0);
	spilled = kvc_req_spilled(r);
	assert_true(spilled > 0);
	assert_int_equal(kvc_restore(r), hits + (int)spilled);
	kvc_req_free(r);
	v = spill_settled(d);
	check_spill_json(&v);
	assert_int_equal(ju(&v, "spill.restores"), spilled);
	assert_true(ju(&v, "spill.read_bytes") > 0);
	assert_true(ju(&v, "spill.read_bps") > 0);
	check_spill_text_prom(d, &v);
	jfree(&v);

	/* Watch mode: spill writes between frames show as interval rates. */
	proc_start(&p, watch, NULL, -1);
	while (!strchr(p.obuf, '\n'))
		assert_true(proc_pump(&p, 100));
	spill_fill(c, SP_PROMPTS, 16);
	assert_int_equal(proc_finish(&p), 0);
	for (line = strtok_r(p.obuf, "\n", &save); line; line = strtok_r(NULL, "\n", &save), n++) {
		struct jv w = jparse(line);

		if (n) {
			assert_non_null(jpath(&w, "interval.rates.spill_read_bytes"));
			wrote += (uint64_t)(jd(&w, "interval.rates.spill_write_bytes") *
					    jd(&w, "interval.seconds") + 0.5);
		}
		jfree(&w);
	}
	assert_int_equal(n, 4);
	assert_true(wrote > 0);
	proc_free(&p);
	kvc_close(c);
}

/*
 * A tier that degrades: the spill files may not grow past 2 MiB (a file
 * size limit the daemon inherits, as in tests/integration/spill.c), so
 * writes fail once they pass it and the daemon stops spilling. kvstat
 * still shows the tier (its slots, what was spilled, the errors) and says
 * it is degraded: "configured" is spill_slots > 0, not spill_enabled.
 */
static void test_spill_degraded(void **state)
{
	struct kvt_daemon *d = *state;
	const char *args[] = { "--spill-dir", spill_dir, "--spill-size", "16M", "--spill-io",
			       "threads", NULL };
	const char *text[] = { "--socket", d->sock, NULL };
	const char *prom[] = { "--socket", d->sock, "--prometheus", NULL };
	struct rlimit old, lim;
	void (*old_xfsz)(int);
	char line[256], *out;
	uint64_t used, errors;
	struct jv v;
	kvc_t *c;
	int rc;

	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 2u << 20;	/* the pool's memfd (1 MiB) and some slots */
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	old_xfsz = signal(SIGXFSZ, SIG_IGN);
	rc = kvt_daemon_start(d, args);
	signal(SIGXFSZ, old_xfsz);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	assert_int_equal(rc, 0);

	c = kvt_open(d, NULL);
	assert_non_null(c);
	spill_fill(c, 0, 2 * SP_PROMPTS);
	v = spill_settled(d);
	kvc_close(c);
	used = ju(&v, "spill.slots_used");
	errors = ju(&v, "spill.errors");
	assert_true(jget(jget(&v, "spill"), "enabled") &&
		    jget(jget(&v, "spill"), "enabled")->t == J_BOOL &&
		    !jget(jget(&v, "spill"), "enabled")->b);
	assert_string_equal(js(&v, "spill.path"), "degraded");
	assert_int_equal(ju(&v, "spill.slots"), (16u << 20) / SP_SLOT_BYTES);
	assert_true(used > 0 && used == ju(&v, "pages.spilled"));
	assert_true(errors >= 1);
	assert_int_equal(ju(&v, "spill.write_bytes"), ju(&v, "spill.spills") * SP_SLOT_BYTES);
	assert_true(ju(&v, "counters.evictions") > ju(&v, "spill.spills"));
	jfree(&v);

	assert_int_equal(kvstat(text, NULL, &out, NULL), 0);
	assert_null(strstr(out, "spill tier: off"));
	snprintf(line, sizeof(line), "\n%-9s %-9s %10llu ", "spilled", "1 spill",
		 (unsigned long long)used);
	assert_non_null(strstr(out, line));
	snprintf(line, sizeof(line),
		 "\nspill tier: DEGRADED: writes stopped after an error, %llu of %d slots used (",
		 (unsigned long long)used, (16 << 20) / SP_SLOT_BYTES);
	assert_non_null(strstr(out, line));
	snprintf(line, sizeof(line), " clean evictions, %llu errors\n", (unsigned long long)errors);
	assert_non_null(strstr(out, line));
	assert_non_null(strstr(out, "\nspills "));
	assert_non_null(strstr(out, "\nspill written "));
	free(out);

	assert_int_equal(kvstat(prom, NULL, &out, NULL), 0);
	assert_non_null(strstr(out, "\nkvcached_spill_enabled 0\n"));
	assert_non_null(strstr(out, "\nkvcached_spill_io_path 3\n"));
	snprintf(line, sizeof(line), "\nkvcached_spill_errors_total %llu\n",
		 (unsigned long long)errors);
	assert_non_null(strstr(out, line));
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_exact_counts, setup_metrics, kvt_teardown),
		cmocka_unit_test_setup_teardown(test_top_prefixes, kvt_setup, kvt_teardown),
		cmocka_unit_test_setup_teardown(test_http_metrics, setup_metrics, kvt_teardown),
		cmocka_unit_test_setup_teardown(test_errors, kvt_setup, kvt_teardown),
		cmocka_unit_test_setup_teardown(test_watch_pipe, kvt_setup, kvt_teardown),
		cmocka_unit_test_setup_teardown(test_watch_tty_sigint, kvt_setup, kvt_teardown),
		cmocka_unit_test_setup_teardown(test_watch_reattach, kvt_setup, teardown_reattach),
		cmocka_unit_test_setup_teardown(test_spill_tier, setup_spill, teardown_spill),
		cmocka_unit_test_setup_teardown(test_spill_degraded, setup_spill_dir, teardown_spill),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests_name("integration/kvstat", tests, NULL, NULL);
}
