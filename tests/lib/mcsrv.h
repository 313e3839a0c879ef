/* SPDX-License-Identifier: MIT */
/*
 * mcsrv.h - memcached servers for tests: Debian's /usr/bin/memcached on
 * 127.0.0.1 at a free port, started and stopped by the test (killed,
 * stopped with SIGSTOP, continued, restarted on the same port). No
 * libmemcached here: every integration test links this library (and
 * kvbench's remote mode, for its servers). A server never outlives the
 * process that started it (PR_SET_PDEATHSIG).
 */
#ifndef KVT_MCSRV_H
#define KVT_MCSRV_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct kvt_mc {
	pid_t pid;		/* 0 when not running */
	uint16_t port;
	char item_max[16];	/* its -I */
	unsigned mem_mb;	/* its -m; 0: 64 */
};

/* The memcached binary, or NULL when it is not installed (then the test
 * skips, saying so). */
const char *kvt_mc_bin(void);

/* Start memcached on 127.0.0.1 (a free port unless m->port is set) with
 * -I item_max (e.g. "2m"), a cache of m->mem_mb MiB (64 if 0), two
 * threads; wait until it accepts. Returns 0 or -1. */
int kvt_mc_start(struct kvt_mc *m, const char *item_max);
/* The same server again on its port (after kvt_mc_kill): empty. */
int kvt_mc_restart(struct kvt_mc *m);
/* SIGKILL and reap. */
void kvt_mc_kill(struct kvt_mc *m);
/* SIGSTOP / SIGCONT: a server that hangs, and one that comes back. */
void kvt_mc_stop(struct kvt_mc *m);
void kvt_mc_cont(struct kvt_mc *m);

/* "memcached:127.0.0.1:P1,127.0.0.1:P2,..." for n servers, into out. */
void kvt_mc_spec(char *out, size_t len, const struct kvt_mc *m, int n);

/* A secret file (0600) of 32 bytes derived from seed in dir; its path
 * into out. Returns 0 or -1. */
int kvt_secret_file(char *out, size_t len, const char *dir, const char *name, uint32_t seed);

#endif
