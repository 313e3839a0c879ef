// SPDX-License-Identifier: MIT
/*
 * peers.c - the servers kvbench measures kvcached against: redis-server
 * and memcached, each started by kvbench on a Unix socket in the run's
 * private folder (no TCP port: redis `--port 0 --unixsocket`, memcached
 * `-s`), with persistence off, and killed on every way out. Clients are
 * the usual C libraries, hiredis and libmemcached, with their defaults.
 *
 * A server that is not installed (not on $PATH, /usr/sbin, /sbin) or that
 * does not start is not an error: srv_skip() says why and the modes print
 * that in the peer's rows.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <libmemcached/memcached.h>

#include "../../shm/proto.h"
#include "bench.h"

struct srv {
	const char *bin;	/* program name */
	pid_t pid;
	char sock[108];
	char log[128];
	const char *skip;	/* why it is not there, or NULL */
	char skipbuf[160];
};

static struct srv srvs[SRV_N] = {
	[SRV_REDIS] = { .bin = "redis-server" },
	[SRV_MEMCACHED] = { .bin = "memcached" },
};
static bool started;

/* The program's full path in $PATH (and the sbin folders), or false. */
static bool find_bin(const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH");
	char buf[8192], *dir, *save = NULL;

	snprintf(buf, sizeof(buf), "%s:/usr/sbin:/sbin:/usr/local/sbin", path ? path : "/usr/bin:/bin");
	for (dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
		if (!*dir)
			continue;
		snprintf(out, len, "%s/%s", dir, name);
		if (!access(out, X_OK))
			return true;
	}
	return false;
}

static void srv_log_tail(const struct srv *s)
{
	char buf[1024];
	FILE *f = fopen(s->log, "r");
	size_t n;

	if (!f)
		return;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	if (n)
		fprintf(stderr, "kvbench: %s log (%s):\n%s%s", s->bin, s->log, buf,
			buf[n - 1] == '\n' ? "" : "\n");
}

static void srv_start(struct srv *s, const char *const *argv)
{
	int i, st;

	s->pid = bench_spawn(argv, s->log, SIGKILL);
	for (i = 0; i < 1000; i++) {	/* up to 10 s */
		if (kvproto_can_connect(s->sock))
			return;
		if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
			s->pid = 0;
			srv_log_tail(s);
			snprintf(s->skipbuf, sizeof(s->skipbuf), "%s exited at start with status %d",
				 s->bin, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
			s->skip = s->skipbuf;
			fprintf(stderr, "kvbench: %s; its rows are skipped\n", s->skip);
			return;
		}
		sleep_ms(10);
	}
	kill(s->pid, SIGKILL);
	waitpid(s->pid, &st, 0);
	s->pid = 0;
	snprintf(s->skipbuf, sizeof(s->skipbuf), "%s did not accept connections within 10 s",
		 s->bin);
	s->skip = s->skipbuf;
	fprintf(stderr, "kvbench: %s; its rows are skipped\n", s->skip);
}

void servers_start(void)
{
	char path[SRV_N][4096];
	const char *dir;
	int k;

	if (started)
		return;
	started = true;
	bench_at_exit(servers_stop, servers_kill_async);
	dir = run_dir();
	for (k = 0; k < SRV_N; k++) {
		struct srv *s = &srvs[k];

		if (!find_bin(s->bin, path[k], sizeof(path[k]))) {
			snprintf(s->skipbuf, sizeof(s->skipbuf), "%s not found", s->bin);
			s->skip = s->skipbuf;
			continue;
		}
		snprintf(s->sock, sizeof(s->sock), "%s/%s.sock", dir, s->bin);
		snprintf(s->log, sizeof(s->log), "%s/%s.log", dir, s->bin);
	}
	if (!srvs[SRV_REDIS].skip) {
		/* Defaults but for the socket and for persistence (none: a cache). */
		const char *argv[] = { path[SRV_REDIS], "--port", "0",
				       "--unixsocket", srvs[SRV_REDIS].sock,
				       "--unixsocketperm", "700", "--save", "",
				       "--appendonly", "no", "--dir", dir, "--daemonize", "no",
				       NULL };

		srv_start(&srvs[SRV_REDIS], argv);
	}
	if (!srvs[SRV_MEMCACHED].skip) {
		/* Defaults (4 threads) but for the socket, 1 GiB of memory and
		 * items up to 4 MiB (the default 1 MiB is under a 2 MiB page).
		 * As root memcached insists on -u. */
		const char *argv[] = { path[SRV_MEMCACHED], "-s", srvs[SRV_MEMCACHED].sock,
				       "-a", "0700", "-m", "1024", "-I", "4m",
				       getuid() == 0 ? "-u" : NULL, "root", NULL };

		srv_start(&srvs[SRV_MEMCACHED], argv);
	}
}

void servers_stop(void)
{
	int k, i, st;
	pid_t w;

	for (k = 0; k < SRV_N; k++) {
		struct srv *s = &srvs[k];

		if (s->pid > 0) {
			kill(s->pid, SIGTERM);
			for (i = 0, w = 0; i < 500 && w != s->pid; i++) {
				w = waitpid(s->pid, &st, WNOHANG);
				if (w != s->pid)
					sleep_ms(10);
			}
			if (w != s->pid) {
				kill(s->pid, SIGKILL);
				waitpid(s->pid, &st, 0);
			}
			s->pid = 0;
		}
		if (s->sock[0])
			unlink(s->sock);
		if (s->log[0])
			unlink(s->log);
	}
}

void servers_kill_async(void)
{
	int k;

	for (k = 0; k < SRV_N; k++) {
		if (srvs[k].pid > 0)
			kill(srvs[k].pid, SIGKILL);
		if (srvs[k].sock[0])
			unlink(srvs[k].sock);
		if (srvs[k].log[0])
			unlink(srvs[k].log);
	}
}

const char *srv_skip(int s)
{
	if (!started)
		return "not started";
	return srvs[s].skip;
}

const char *srv_sock(int s)
{
	return srvs[s].sock;
}

/* ------------------------------------------------------------ clients */

struct redisContext *redis_connect(void)
{
	redisContext *r = redisConnectUnix(srvs[SRV_REDIS].sock);

	if (!r || r->err)
		die("connect to redis-server at %s: %s", srvs[SRV_REDIS].sock,
		    r ? r->errstr : "out of memory");
	return r;
}

struct memcached_st *mc_connect(void)
{
	memcached_st *m = memcached_create(NULL);
	memcached_return_t rc;

	if (!m)
		die("memcached_create: out of memory");
	rc = memcached_server_add_unix_socket(m, srvs[SRV_MEMCACHED].sock);
	if (rc != MEMCACHED_SUCCESS)
		die("memcached at %s: %s", srvs[SRV_MEMCACHED].sock, memcached_strerror(m, rc));
	return m;
}

void redis_flushall(struct redisContext *r)
{
	redisReply *rep = redisCommand(r, "FLUSHALL");

	if (!rep || rep->type == REDIS_REPLY_ERROR)
		die("redis FLUSHALL: %s", rep ? rep->str : r->errstr);
	freeReplyObject(rep);
}

void mc_flushall(struct memcached_st *m)
{
	memcached_return_t rc = memcached_flush(m, 0);

	if (rc != MEMCACHED_SUCCESS)
		die("memcached flush_all: %s", memcached_strerror(m, rc));
}

void redis_set_many(struct redisContext *r, const char *const *keys, const size_t *klen,
		    const void *const *vals, const size_t *vlen, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		const char *argv[3] = { "SET", keys[i], vals[i] };
		size_t lens[3] = { 3, klen[i], vlen[i] };

		if (redisAppendCommandArgv(r, 3, argv, lens) != REDIS_OK)
			die("redis SET: %s", r->errstr);
	}
	for (i = 0; i < n; i++) {
		redisReply *rep;

		if (redisGetReply(r, (void **)&rep) != REDIS_OK)
			die("redis SET reply: %s", r->errstr);
		if (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "OK"))
			die("redis SET: unexpected reply (type %d%s%s)", rep->type,
			    rep->str ? ": " : "", rep->str ? rep->str : "");
		freeReplyObject(rep);
	}
}

void mc_set_one(struct memcached_st *m, const char *key, size_t klen, const void *val,
		size_t vlen)
{
	memcached_return_t rc = memcached_set(m, key, klen, val, vlen, 0, 0);

	if (rc != MEMCACHED_SUCCESS)
		die("memcached set of %zu bytes: %s", vlen, memcached_strerror(m, rc));
}
