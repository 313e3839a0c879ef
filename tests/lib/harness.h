/* SPDX-License-Identifier: MIT */
/*
 * harness.h - helpers for tests that start the real kvcached (memcached's
 * testapp idea): a private socket in a private folder, the daemon's log in
 * a file the test can search, and page patterns derived from block keys so
 * any process can check any page byte for byte.
 */
#ifndef KVT_HARNESS_H
#define KVT_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../libclient/kvclient.h"
#include "../../shm/proto.h"	/* kvproto_can_connect */

struct kvt_daemon {
	pid_t pid;
	char dir[64];
	char sock[108];
	char log[128];
};

/* Path of a built program: $BUILD/name (BUILD defaults to "build"). */
const char *kvt_bin(const char *name);

/*
 * Start kvcached on a private socket with a small host pool: 4 KiB pages
 * (the tiny test model) unless args set page-size, plus the NULL-terminated
 * extra args. Waits until the socket accepts (up to 60 s). Returns 0 or
 * -1.
 */
int kvt_daemon_start(struct kvt_daemon *d, const char *const *args);
/* The same with none of the small test pool's flags: kvcached --socket and
 * args only (a test whose settings come from a --config file, which flags
 * would override). */
int kvt_daemon_start_bare(struct kvt_daemon *d, const char *const *args);
/*
 * cmocka group fixtures: *state becomes a started daemon (kvt_setup_args:
 * with extra args); kvt_teardown stops it, returning non-zero unless it
 * shut down cleanly (or a test already stopped it), and frees it.
 */
int kvt_setup(void **state);
int kvt_setup_args(void **state, const char *const *args);
int kvt_teardown(void **state);

/*
 * The argv kvt_daemon_start runs: kvcached on `sock` with the small test
 * pool, debug logs and a 5 ms tick, then the NULL-terminated extra args.
 * Fills argv (NULL-terminated, at most max entries) and returns argc. For
 * tests that launch the daemon themselves (with their own environment).
 */
int kvt_daemon_argv(const char *sock, const char *const *args, const char **argv, int max);

/* SIGTERM and wait: the exit status, or -1 if it died by a signal. Then
 * its folder (log, socket) is removed, unless $KVT_KEEP is set. */
int kvt_daemon_stop(struct kvt_daemon *d);
/* A plain connected socket to path (for tests that speak the protocol
 * themselves), or -1. */
int kvt_raw_connect(const char *path);
/* One frame (header with seq 7, then len payload bytes); 0 or -1. */
int kvt_send_frame(int fd, uint16_t type, const void *p, uint32_t len);
/* One reply frame of `type`, its payload (at most cap bytes) into buf:
 * its length, or -1. */
int kvt_read_frame(int fd, uint16_t type, void *buf, size_t cap);
/* HELLO by hand as the test model (kvt_model): 0 with the reply and its
 * descriptors [segment, pool, ledger] (which the caller closes), or -1. */
struct kvproto_hello_r;
int kvt_raw_hello(int fd, int fds[3], struct kvproto_hello_r *hr);
/*
 * Run `prog` (NULL: $BUILD/kvcached) with the NULL-terminated args (at most
 * 46), stdout and stderr into out (NUL-terminated, outlen bytes at most),
 * under a 20 s alarm. Returns its exit status, 128 + signal, or -1.
 */
int kvt_run(const char *prog, const char *const *args, char *out, size_t outlen);
/* The state letter of pid in /proc/PID/stat ('R', 'S', 'T' stopped,
 * 'Z' zombie ...), or 'X' when there is no such process. */
char kvt_proc_state(pid_t pid);
/* True once the daemon's log contains `s`. */
bool kvt_log_has(const struct kvt_daemon *d, const char *s);

/* The test model: 16-token blocks, 1 layer, 2 kv heads, head dim 32,
 * 2-byte dtype: 4096-byte pages. */
struct kvc_model kvt_model(void);
/* Attach to d with the test model (and optional salt). NULL on error. */
kvc_t *kvt_open(const struct kvt_daemon *d, const char *salt);

/* Fill / check a page with the pattern of a block key. */
void kvt_fill(void *page, size_t bytes, struct kvc_key key);
bool kvt_check(const void *page, size_t bytes, struct kvc_key key);

/*
 * One request the way an engine makes it: look up, check every hit page's
 * pattern, allocate the misses, fill them with their keys' patterns and
 * publish. Returns the hit blocks, -1000 if a hit page held the wrong
 * bytes, or a negative errno; *cached (if not NULL) gets what publish
 * returned (or the hits when nothing was missed).
 */
int kvt_put(kvc_t *c, const uint32_t *t, size_t n, int *cached);
/* Look up only, checking every hit page; returns hits or -1000. */
int kvt_get(kvc_t *c, const uint32_t *t, size_t n);

/* Tokens of a prompt: shared prefix of `shared` tokens from seed 1, the rest
 * from `seed`. */
void kvt_tokens(uint32_t *t, size_t n, size_t shared, uint32_t seed);

/* A copy of the daemon's counters (struct kvshm_stats), read through an
 * observer attach as kvstat does; fails the test if it cannot attach. */
struct kvshm_stats;
void kvt_stats(const char *sock, struct kvshm_stats *out);

/* Pages the daemon counts free, read from the segment through c. */
uint64_t kvt_free_pages(const kvc_t *c);

/*
 * In a forked client process, publish `prompts` fresh 8-block prompts
 * (token seeds seed, seed+1, ...), checking every page it hits, then exit.
 * Returns the child's exit status: 0, or non-zero if an attach, a request
 * or a page check failed. Used to put the pool under eviction pressure.
 */
int kvt_flood(const struct kvt_daemon *d, int prompts, uint32_t seed);

/* Run fn(arg) in a forked child; returns the pid. The child exits with
 * fn's return value. */
pid_t kvt_fork(int (*fn)(void *), void *arg);
/* Wait for pid: its exit code, or 128 + signal. */
int kvt_wait(pid_t pid);

#endif
