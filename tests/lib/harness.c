// SPDX-License-Identifier: MIT
/*
 * harness.c - see harness.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "../../libclient/observe.h"
#include "../../shm/proto.h"

const char *kvt_bin(const char *name)
{
	static char path[4][256];
	static int k;
	const char *b = getenv("BUILD");
	char *p = path[k++ & 3];

	snprintf(p, 256, "%s/%s", b && *b ? b : "build", name);
	return p;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

int kvt_raw_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return -1;
	}
	return fd;
}

int kvt_send_frame(int fd, uint16_t type, const void *p, uint32_t len)
{
	struct kvproto_hdr h = { KVPROTO_MAGIC, type, 0, len, 7 };

	if (write(fd, &h, sizeof(h)) != (ssize_t)sizeof(h))
		return -1;
	return !len || write(fd, p, len) == (ssize_t)len ? 0 : -1;
}

int kvt_read_frame(int fd, uint16_t type, void *buf, size_t cap)
{
	struct kvproto_hdr h;
	size_t got = 0;

	if (recv(fd, &h, sizeof(h), MSG_WAITALL) != (ssize_t)sizeof(h) || h.type != type ||
	    h.len > cap)
		return -1;
	while (got < h.len) {
		ssize_t n = recv(fd, (char *)buf + got, h.len - got, 0);

		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return (int)h.len;
}

int kvt_raw_hello(int fd, int fds[3], struct kvproto_hello_r *hr)
{
	struct kvproto_hello hi = { .version = KVPROTO_VERSION, .dtype_bytes = 2, .layers = 1,
				    .kv_heads = 2, .head_dim = 32, .block_tokens = 16,
				    .pos_kind = 1, .model = "kvt-tiny" };
	char buf[sizeof(struct kvproto_hdr) + sizeof(*hr)];
	char cbuf[CMSG_SPACE(3 * sizeof(int))];
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;

	if (kvt_send_frame(fd, KVPROTO_HELLO, &hi, sizeof(hi)) ||
	    recvmsg(fd, &mh, MSG_WAITALL) != (ssize_t)sizeof(buf))
		return -1;
	cm = CMSG_FIRSTHDR(&mh);
	if (!cm || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(3 * sizeof(int)))
		return -1;
	memcpy(fds, CMSG_DATA(cm), 3 * sizeof(int));
	memcpy(hr, buf + sizeof(struct kvproto_hdr), sizeof(*hr));
	return 0;
}

int kvt_run(const char *prog, const char *const *args, char *out, size_t outlen)
{
	const char *argv[48];
	int pfd[2], n = 0, st;
	size_t got = 0;
	ssize_t r;
	pid_t p;

	argv[n++] = prog ? prog : kvt_bin("kvcached");
	while (*args && n < 47)
		argv[n++] = *args++;
	argv[n] = NULL;
	if (pipe(pfd))
		return -1;
	p = fork();
	if (p < 0)
		return -1;
	if (!p) {
		dup2(pfd[1], 2);
		dup2(pfd[1], 1);
		close(pfd[0]);
		alarm(20);	/* a daemon that unexpectedly starts must not hang us */
		execv(argv[0], (char **)argv);
		_exit(127);
	}
	close(pfd[1]);
	while (got + 1 < outlen && (r = read(pfd[0], out + got, outlen - got - 1)) > 0)
		got += (size_t)r;
	if (outlen)
		out[got] = 0;
	close(pfd[0]);
	if (waitpid(p, &st, 0) != p)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int kvt_daemon_argv(const char *sock, const char *const *args, const char **argv, int max)
{
	static const char *const base[] = {
		"--page-size", "4K", "--pool-size", "1M", "--hugepages", "off",
		"--log-level", "debug", "--tick-ms", "5",
	};
	int n = 0, i;

	argv[n++] = kvt_bin("kvcached");
	argv[n++] = "--socket";
	argv[n++] = sock;
	for (i = 0; i < (int)(sizeof(base) / sizeof(base[0])); i++)
		argv[n++] = base[i];
	for (i = 0; args && args[i] && n < max - 1; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	return n;
}

static int start(struct kvt_daemon *d, const char *const *args, bool bare)
{
	const char *argv[64];
	int i, logfd;

	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/kvt.XXXXXX");
	if (!mkdtemp(d->dir))
		return -1;
	chmod(d->dir, 0755);
	snprintf(d->sock, sizeof(d->sock), "%s/kvcached.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/kvcached.log", d->dir);
	if (bare) {
		int n = 0;

		argv[n++] = kvt_bin("kvcached");
		argv[n++] = "--socket";
		argv[n++] = d->sock;
		for (i = 0; args && args[i] && n < 63; i++)
			argv[n++] = args[i];
		argv[n] = NULL;
	} else {
		kvt_daemon_argv(d->sock, args, argv, 64);
	}
	d->pid = fork();
	if (d->pid < 0)
		return -1;
	if (!d->pid) {
		logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
		if (logfd >= 0) {
			dup2(logfd, 2);
			close(logfd);
		}
		/* The daemon dies with its test: a failed assertion skips
		 * the test's kvt_daemon_stop (every test starts its daemons
		 * from its main thread, which lives as long as the test). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execv(argv[0], (char **)argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	/* Up to 60 s: the pool is faulted in before the socket listens, a
	 * second or more per GiB on a loaded VM. */
	for (i = 0; i < 6000; i++) {
		int st;

		if (kvproto_can_connect(d->sock))
			return 0;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->pid = 0;
			return -1;
		}
		sleep_ms(10);
	}
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	d->pid = 0;
	return -1;
}

int kvt_daemon_start(struct kvt_daemon *d, const char *const *args)
{
	return start(d, args, false);
}

int kvt_daemon_start_bare(struct kvt_daemon *d, const char *const *args)
{
	return start(d, args, true);
}

/* Remove the daemon's folder, unless KVT_KEEP asks to keep its log. */
static void cleanup_dir(const struct kvt_daemon *d)
{
	if (getenv("KVT_KEEP") || !d->dir[0])
		return;
	unlink(d->log);
	unlink(d->sock);
	rmdir(d->dir);
}

int kvt_daemon_stop(struct kvt_daemon *d)
{
	int st = 0;

	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		waitpid(d->pid, &st, 0);
		d->pid = 0;
		cleanup_dir(d);
		return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	}
	cleanup_dir(d);
	return -1;
}

int kvt_setup_args(void **state, const char *const *args)
{
	struct kvt_daemon *d = calloc(1, sizeof(*d));

	if (!d || kvt_daemon_start(d, args)) {
		free(d);
		return -1;
	}
	*state = d;
	return 0;
}

int kvt_setup(void **state)
{
	return kvt_setup_args(state, NULL);
}

int kvt_teardown(void **state)
{
	struct kvt_daemon *d = *state;
	int rc = d->pid ? kvt_daemon_stop(d) : 0;

	free(d);
	return rc;
}

char kvt_proc_state(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 'X';
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');	/* comm may contain ')' and spaces */
	return p && p[1] == ' ' && p[2] ? p[2] : 'X';
}

bool kvt_log_has(const struct kvt_daemon *d, const char *s)
{
	char buf[1 << 16];
	FILE *f;
	bool found = false;

	for (int tries = 0; tries < 200 && !found; tries++) {
		size_t n;

		f = fopen(d->log, "r");
		if (!f)
			return false;
		while (!found && (n = fread(buf, 1, sizeof(buf) - 1, f)) > 0) {
			buf[n] = 0;
			found = strstr(buf, s) != NULL;
		}
		fclose(f);
		if (!found)
			sleep_ms(10);
	}
	return found;
}

struct kvc_model kvt_model(void)
{
	struct kvc_model m = {
		.size = sizeof(m), .name = "kvt-tiny", .dtype_bytes = 2, .layers = 1,
		.kv_heads = 2, .head_dim = 32, .block_tokens = 16, .pos_kind = KVC_POS_ROPE,
	};
	return m;
}

kvc_t *kvt_open(const struct kvt_daemon *d, const char *salt)
{
	struct kvc_model m = kvt_model();
	struct kvc_options o = { .size = sizeof(o), .socket_path = d->sock };
	kvc_t *c = NULL;

	if (salt) {
		o.salt = salt;
		o.salt_len = strlen(salt);
	}
	if (kvc_open(&m, &o, &c))
		return NULL;
	return c;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

void kvt_fill(void *page, size_t bytes, struct kvc_key key)
{
	uint64_t *p = page, s = key.lo ^ mix(key.hi);
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		p[i] = mix(s + i);
}

bool kvt_check(const void *page, size_t bytes, struct kvc_key key)
{
	const uint64_t *p = page;
	uint64_t s = key.lo ^ mix(key.hi);
	size_t i;

	for (i = 0; i < bytes / 8; i++)
		if (p[i] != mix(s + i))
			return false;
	return true;
}

void kvt_tokens(uint32_t *t, size_t n, size_t shared, uint32_t seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		t[i] = (uint32_t)mix((i < shared ? 1 : seed) * 1000003ull + i) % 32000;
}

uint64_t kvt_free_pages(const kvc_t *c)
{
	struct kvc_stats s;

	return kvc_stats(c, &s) ? 0 : s.pages_free;
}

pid_t kvt_fork(int (*fn)(void *), void *arg)
{
	pid_t p = fork();

	if (!p)
		_exit(fn(arg));
	return p;
}

int kvt_wait(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int check_hits(kvc_t *c, struct kvc_req *r, int hits, const struct kvc_key *k)
{
	int i;

	for (i = 0; i < hits; i++)
		if (!kvt_check(kvc_block(r, (size_t)i), kvc_page_bytes(c), k[i]))
			return -1000;
	return hits;
}

int kvt_put(kvc_t *c, const uint32_t *t, size_t n, int *cached)
{
	size_t nb = n / kvc_block_tokens(c), i;
	struct kvc_key *k = calloc(nb + 1, sizeof(*k));
	struct kvc_req *r = NULL;
	int hits, rc;

	if (!k)
		return -ENOMEM;
	rc = kvc_keys(c, t, n, NULL, 0, k, nb);
	if (rc >= 0)
		rc = kvc_req_new(c, t, n, NULL, 0, &r);
	if (rc < 0)
		goto out;
	hits = rc = kvc_lookup(r);
	if (rc < 0 || (rc = check_hits(c, r, hits, k)) < 0)
		goto out;
	if (cached)
		*cached = hits;
	if ((size_t)hits < nb) {
		rc = kvc_alloc(r);
		if (rc < 0)
			goto out;
		for (i = (size_t)hits; i < nb && kvc_block(r, i); i++)
			kvt_fill(kvc_block(r, i), kvc_page_bytes(c), k[i]);
		if (rc > 0) {
			rc = kvc_publish(r);
			if (rc < 0)
				goto out;
			if (cached)
				*cached = rc;
			/* After publish every cached block, ours or a winner's, holds
			 * exactly its key's bytes. */
			for (i = 0; i < nb; i++)
				if (kvc_block(r, i) &&
				    !kvt_check(kvc_block(r, i), kvc_page_bytes(c), k[i])) {
					rc = -1000;
					goto out;
				}
		}
	}
	rc = hits;
out:
	kvc_req_free(r);
	free(k);
	return rc;
}

int kvt_get(kvc_t *c, const uint32_t *t, size_t n)
{
	size_t nb = n / kvc_block_tokens(c);
	struct kvc_key *k = calloc(nb + 1, sizeof(*k));
	struct kvc_req *r = NULL;
	int rc;

	if (!k)
		return -ENOMEM;
	rc = kvc_keys(c, t, n, NULL, 0, k, nb);
	if (rc >= 0)
		rc = kvc_req_new(c, t, n, NULL, 0, &r);
	if (rc >= 0)
		rc = kvc_lookup(r);
	if (rc > 0)
		rc = check_hits(c, r, rc, k);
	kvc_req_free(r);
	free(k);
	return rc;
}

int kvt_flood(const struct kvt_daemon *d, int prompts, uint32_t seed)
{
	pid_t p = fork();

	if (!p) {
		kvc_t *c = kvt_open(d, NULL);
		uint32_t t[8 * 16];
		int i, hits;

		if (!c)
			_exit(2);
		for (i = 0; i < prompts; i++) {
			kvt_tokens(t, 8 * 16, 0, seed + (uint32_t)i);
			hits = kvt_put(c, t, 8 * 16, NULL);
			if (hits < 0)
				_exit(hits == -1000 ? 3 : 4);	/* 3: wrong bytes */
		}
		kvc_close(c);
		_exit(0);
	}
	return p < 0 ? -1 : kvt_wait(p);
}

void kvt_stats(const char *sock, struct kvshm_stats *out)
{
	struct kvobs o;
	char err[256];

	if (kvobs_attach(sock, &o, err, sizeof(err))) {
		fprintf(stderr, "kvt_stats: %s\n", err);
		abort();
	}
	memcpy(out, kvshm_stats(o.h), sizeof(*out));
	kvobs_detach(&o);
}
